// A live job as a user writes it (JOB.json): the training command, the world, the cost model the
// report is computed under, the policy, and the supervision timeouts.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/event.h"
#include "engine/time.h"

namespace goodput::live {

// How hard a master may press its cluster's API (backend.api_qps, api_burst, api_concurrency): calls
// that create, delete or relabel nodes go through a token bucket of `qps` refilled per second,
// holding at most `burst`, with at most `concurrency` calls in flight. The defaults are
// kube-controller-manager's (20 QPS, burst 30), a good citizen's share of a shared API server;
// client-go's own (5, 10) make 1,000 replacement pods take over three minutes.
struct ApiLimits {
  double qps = 20;
  int32_t burst = 30;
  int32_t concurrency = 8;
};

// Nodes on a Ray cluster: each node (agent + trainer) is one Ray job, submitted through the
// dashboard's Jobs API and pinned by the resources it asks for.
struct RayBackendSpec {
  std::string address;  // the dashboard, http://head:8265
  std::vector<std::pair<std::string, std::string>> headers;  // sent with every call (a proxy's Authorization)
  double num_cpus = 1;
  double num_gpus = 0;
  int64_t memory_mb = 0;  // Ray's entrypoint_memory, scaled up after an OOM like the memory limit
  std::map<std::string, double> resources;  // custom resources, e.g. {"trainer_slot": 1}
  std::string agent;       // the goodput executable on Ray's nodes; empty: the master's own path
  std::string working_dir;  // where agents run on Ray's nodes (relative: to where `goodput run` starts); empty: Ray's
  std::string agent_host;  // --host for agents (the address other ranks reach them at); empty: the agent's default
  std::string master_url;  // how Ray's nodes reach the master (http://host[:port]); empty: the URL it listens on
  Duration pending_timeout = 120 * kSecond;  // a node's job still PENDING after this is given up and resubmitted
  Duration poll_interval = 1 * kSecond;
  ApiLimits api;
};

// Nodes as pods on a Kubernetes cluster: one pod per node, created from this template and watched.
struct KubeBackendSpec {
  std::string kubeconfig;  // empty: the in-cluster service account
  std::string context;     // empty: the kubeconfig's current context
  std::string namespace_;  // empty: the context's (or the service account's) namespace
  std::string image;       // the container image holding goodput and the trainer
  std::string agent = "goodput";  // the goodput executable inside the image
  std::string image_pull_policy;  // empty: the cluster's default
  std::string service_account;
  std::string cpu;          // e.g. "8" or "500m"; empty: no request
  int64_t memory_mb = 0;    // the container's memory limit (scaled after an OOM); 0: none
  int64_t gpus = 0;         // nvidia.com/gpu
  std::map<std::string, std::string> node_selector;
  nlohmann::json tolerations = nlohmann::json::array();
  std::string master_url;   // how pods reach the master (a Service); empty: the URL it listens on
  std::string working_dir;  // the container's working directory; empty: the image's
  nlohmann::json volumes = nlohmann::json::array();        // pod volumes (e.g. the checkpoint storage's PVC)
  nlohmann::json volume_mounts = nlohmann::json::array();  // where the container mounts them
  Duration pending_timeout = 120 * kSecond;  // a pod no node was found for by then is given up and created anew
  // Set by `goodput operator` for a GoodputJob's master: the Secret (key "token") its pods read the
  // agents' token from, which the operator made and owns (empty: the master makes one per run and
  // deletes it when the job is over), and the ownerReferences its pods get, so that deleting the
  // GoodputJob takes them with it.
  std::string token_secret;
  nlohmann::json owner_references = nlohmann::json::array();
  ApiLimits api;
};

// The pre-flight node check ("node_check"; absent: off). A node is checked once, when it first takes
// a rank slot, before any trainer of the world starts: the compute probe, then a link probe to a
// partner node; links that fail are tried again with another partner. See docs/node-check.md.
struct NodeCheckSpec {
  bool enabled = false;
  Duration compute = 500 * kMillisecond;  // how long the compute probe runs
  int64_t link_bytes = 32 << 20;          // bytes the link probe sends ("link_mib")
  double straggler_factor = 2.0;          // slower than the median by this much: a straggler
  Duration round_timeout = 60 * kSecond;  // a node that reports no result in this time fails its round
  // The link probe as the job's traffic goes: a program run on both nodes of a pair (for PyTorch
  // jobs: /usr/bin/python3 -m goodput.collective_probe, a gloo all_reduce), with the job's env.
  // Empty: a plain TCP transfer between the agents.
  std::vector<std::string> collective;
  // Fault drills: the first node to take a slot gets this fault in its check ("corrupt": wrong
  // products; "link-down": its link probes fail and it refuses its partners'; "slow:F": its compute
  // probe does F times the work).
  std::map<int32_t, std::string> faults;
};

// A replica group ("replicas" in the spec): `count` nodes that play one part of the job, with their
// own command, environment and machine shape. Slots are laid out chief first (rank 0), then the
// parameter servers, then the workers; scaling gives up and takes back workers only (the highest
// slots), so a chief or parameter server that is lost waits for its replacement.
struct ReplicaGroup {
  std::string type = "worker";  // "chief", "ps" or "worker"
  int32_t count = 1;
  int32_t first_slot = 0;
  int32_t nproc_per_node = 1;              // trainer processes on each of its nodes (the job's, unless its own)
  std::vector<std::string> command;        // the job's, unless the group has its own
  std::map<std::string, std::string> env;  // the job's, with the group's added
  KubeBackendSpec kube;  // the job's backend with the group's overrides (cpu, memory, image, ...)
  RayBackendSpec ray;
};
// The group that `slot` belongs to; a slot past the end (or -1): the last group.
const ReplicaGroup& replica_group(const std::vector<ReplicaGroup>& groups, int32_t slot);
// {"chief": 1, "ps": 2, "worker": 4}, with `world` nodes in all (workers are what scaling changes).
nlohmann::json replica_counts(const std::vector<ReplicaGroup>& groups, int32_t world);
// Node counts by type (replica_counts, a saved layout) as process counts: each times its group's nproc_per_node.
nlohmann::json process_counts(const std::vector<ReplicaGroup>& groups, nlohmann::json counts);
// The global rank of the first process on `slot`'s node: the processes of every slot before it.
// first_process(groups, world) is the world's process count.
int32_t first_process(const std::vector<ReplicaGroup>& groups, int32_t slot);

// A node check's fault drill: "corrupt", "link-down" or "slow:F" (F from 1 to 1000).
bool valid_check_fault(const std::string& fault);

// The most nodes a job may have: 12,500 nodes of 8 accelerators (100,000) fit, with room to grow.
inline constexpr int32_t kMaxNodes = 16384;

struct JobSpec {
  std::string job;
  int32_t nodes = 1;
  std::vector<std::string> command;  // argv of one trainer; run without a shell
  std::map<std::string, std::string> env;
  // Trainer processes per node, one per accelerator (torchrun's --nproc-per-node): a node's agent
  // starts this many with torchrun's environment, and stops them all when one fails.
  int32_t nproc_per_node = 1;
  std::string role = "default";  // ROLE_NAME of a plain job's trainers (torchrun's --role)
  // The trainers report progress through goodput.live (phases, steps, checkpoints). false: an
  // unmodified torchrun script, judged by its processes alone: running is training, exit code 0 is
  // done, a failure restarts it (from its own checkpoints); no hang detection.
  bool trainer_reports = true;
  // Warm starts (the policy's recovery.warm_start): the modules an interpreter started ahead of a
  // restart imports before it is handed the trainer's script.
  std::vector<std::string> preload = {"torch"};
  bool warm_start = false;
  int64_t total_steps = 0;
  Duration step_time = 100 * kMillisecond;  // expected step time: the report's cost model
  int32_t accelerators_per_node = 1;  // the report's cost model; not given: nproc_per_node
  int64_t checkpoint_bytes_per_node = 0;  // all its processes' checkpoints together
  int64_t memory_bandwidth_bytes_per_s = 2'000'000'000;
  int64_t storage_bandwidth_bytes_per_s = 200'000'000;
  nlohmann::json policy;  // a policy document; null: the default policy
  std::string policy_name = "default";
  std::string storage_dir;            // empty: <run dir>/checkpoints
  int64_t data_shards = 0;            // 0: no data-shard service
  // Warm spares: nodes started beside the world, registered and idle (told to stop), each ready to
  // take a lost node's slot at once; the relaunch that follows refills the pool.
  int32_t spares = 0;
  int64_t memory_limit_mb = 0;        // address-space limit of each trainer (prlimit); 0: none
  // The pace of each node's checkpoint copies to its peers (the policy's checkpoint.replicas), in
  // 10^6 bytes per second per copy: the share of the link that training's collectives leave it. 0:
  // as fast as the link goes.
  double replica_mb_per_s = 1000;
  Duration heartbeat_interval = 250 * kMillisecond;
  Duration heartbeat_timeout = 5 * kSecond;
  Duration hang_timeout = 5 * kMinute;  // a trainer that reports nothing this long is hung (see the README)
  // A world slot still vacant this long after the master last asked for a machine for it gets
  // another one: the one asked for never registered and its provider did not say (an agent that
  // died starting on a machine that looks alive, a launch lost with a master that crashed).
  Duration join_timeout = 10 * kMinute;
  Duration failure_settle = 300 * kMillisecond;  // collect the exits one failure causes, then diagnose
  // What a hang leads to: "recover" (a failure for the recovery policy: restart or relaunch) or
  // "report" (stacks dumped and the stall logged, the job left as it is until it moves again).
  enum class HangAction { Recover, Report } hang_action = HangAction::Recover;
  // A job-wide silence this long that ends by itself (before hang_timeout) is logged as a stall
  // (stall_observed), so pauses can be measured and replayed. 0: 20 step times, at least 10 s.
  Duration stall_after = 0;
  Duration stall_after_or_default() const { return stall_after > 0 ? stall_after : std::max(10 * kSecond, 20 * step_time); }
  double straggler_factor = 1.5;  // a rank doing this many times the typical rank's work per step; 0: off
  NodeCheckSpec node_check;
  std::string backend = "local";  // "local", "ray" or "kubernetes"
  RayBackendSpec ray;
  KubeBackendSpec kube;
  // Never empty once parsed: without "replicas", one group of `nodes` workers running `command`
  // (workers_only() makes that group for a spec built in code).
  std::vector<ReplicaGroup> replicas;
  std::vector<ReplicaGroup> workers_only() const;
  int32_t fixed_slots() const;  // chief and parameter-server slots: the part scaling never changes

  JobStarted job_started() const;
};

// Strict: unknown keys and bad values are errors naming the file and field. A relative policy
// path is read relative to the spec file.
JobSpec load_job_spec(const std::string& path);
JobSpec job_spec_from_json(const nlohmann::json& j, const std::string& where, const std::string& base_dir);

}  // namespace goodput::live
