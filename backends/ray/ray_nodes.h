// The Ray backend: every node of the job (a `goodput agent` and the trainer it starts) is one Ray
// job on a Ray cluster, submitted through the dashboard's Jobs API and placed by the resources it
// asks for. Ray only places and runs them; the agents talk to the master as on any backend.
//
// What Ray says becomes what the master needs: a node's job that ended (FAILED with its message
// and log tail, STOPPED, SUCCEEDED) or whose machine the State API lists as DEAD is a lost node; a
// job still PENDING after pending_timeout is stopped and reported lost, so the policy resubmits it
// (or gives up). A relaunch is stop + a new submission with the slot's (possibly larger) memory.
// A machine excluded after a hardware error keeps later submissions away by pinning each to
// another alive node through the `node:<ip>` resource every Ray node has (the Jobs API has no
// anti-affinity of its own).
//
// All HTTP runs on the worker thread of ClusterNodes, so a slow or failing dashboard never stalls
// the master's loop; calls retry with backoff, and submits are idempotent by submission_id.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "backends/live/cluster_nodes.h"
#include "backends/live/job_spec.h"
#include "backends/ray/ray_client.h"

namespace goodput::ray {

// One node of the job: its Ray job. `machine` is the Ray node (id) its driver runs on, once placed.
struct RayJobNode : live::ClusterMember {
  std::string name;
  bool submitted = false;
  std::string pinned;  // the Ray node id it was pinned to (machines excluded), until Ray says where it runs
  std::chrono::steady_clock::time_point pending_since{};
};

struct RayNodesOptions {
  live::RayBackendSpec spec;
  // The job's replica groups: a slot's Ray job asks for its group's resources. Empty: all
  // workers shaped by `spec`.
  std::vector<live::ReplicaGroup> replicas;
  std::string agent_binary;  // spec.agent, or the master's own executable
  std::string master_url;    // spec.master_url, or the URL the master listens on
  std::string token;         // handed to agents in runtime_env.env_vars
  std::string run;           // "<job>-<run id>": names submissions, tags them in metadata
  RetryOptions retry;
  // After a master restart: track this run's Ray jobs that are still alive, and name new nodes
  // after the highest one Ray knows of. Done on the worker thread before any other call.
  bool adopt = false;
};

class RayNodes final : public live::ClusterNodes<RayJobNode> {
 public:
  explicit RayNodes(RayNodesOptions options);
  ~RayNodes() override;

  void launch(int32_t slot, int32_t memory_permille) override;

  // The submission a node's name maps to (stable: a retried submit reuses it).
  std::string submission_id(const std::string& name) const;

 private:
  void on_start() override;  // the dashboard's version, and the run's jobs adopted
  void prepare(Command& c) override;  // names a new node when its submission is carried out
  bool carry_out(const Command& c) override;
  std::chrono::steady_clock::duration idle_every() const override;
  void on_idle() override { poll(); }
  void adopt();
  void poll();
  SubmitRequest request_for(const RayJobNode& t) const;
  // With machines excluded: an alive node to pin a submission to (its IP and id), the one with the
  // fewest of this run's nodes, counting those pinned there and not placed yet.
  std::pair<std::string, std::string> pinned_node() const;
  void end(RayJobNode& t, std::string reason, bool fatal = false);  // its job is over: a loss unless stopped

  RayNodesOptions o_;
  RayClient client_;  // used only on the worker thread
  std::vector<RayNode> cluster_;  // the State API's nodes, as of the last poll
  int counter_ = 0;
  bool dashboard_down_ = false;
};

}  // namespace goodput::ray
