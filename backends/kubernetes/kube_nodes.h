// The Kubernetes backend: every node of the job is one pod (a `goodput agent` that starts the
// trainer), created from the job spec's template and watched. What the cluster says becomes what
// the master needs:
//  - a pod that failed (its container's `reason` first, so OOMKilled with exit code 1 is still an
//    OOM; `lastState` when the container already restarted; Evicted; StartError;
//    CrashLoopBackOff) is a lost node with that reason, which the diagnosis table reads;
//  - a pod that cannot start for a reason retrying will not fix (ImagePullBackOff, ErrImagePull,
//    InvalidImageName, CreateContainerConfigError) is a configuration error: the job fails with it;
//  - a node that turns Ready=False/Unknown, gets an unreachable/not-ready taint, or a
//    DisruptionTarget condition loses its pods at once (long before the 300 s toleration would
//    evict them), and new pods keep off it (required node affinity NotIn, unless the cluster keeps
//    pods off it by itself: a NoSchedule/NoExecute taint, a cordon).
// Pods and nodes are listed, then watched from that resourceVersion with bookmarks; a dropped
// stream resumes from the last version seen, a 410 Expired re-lists, and each pod is reported at
// most once, so no failure is missed and none is acted on twice. Creating and deleting pods runs
// on the worker thread of ClusterNodes, so a slow API server never stalls the master.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backends/kubernetes/kube_client.h"
#include "backends/live/job_spec.h"
#include "backends/live/cluster_nodes.h"

namespace goodput::kube {

struct PodTrouble {
  std::string reason;
  bool fatal = false;  // a configuration error: retrying cannot help
};
// What is wrong with a pod, if anything (a running or pending pod is fine; one that completed
// is reported as such).
std::optional<PodTrouble> pod_trouble(const nlohmann::json& pod);
// A container's terminated state in one line: "reason=OOMKilled exitCode=137 signal=9: message".
std::string describe_termination(const nlohmann::json& terminated);
// Why a node can no longer run pods, if it cannot.
std::optional<std::string> node_trouble(const nlohmann::json& node);
// A pod's status in one line, for the log: phase, where it runs, each container's state
// ("Running on worker-2; trainer running", "Pending; trainer waiting (ContainerCreating)").
std::string pod_status(const nlohmann::json& pod);

struct KubeNodesOptions {
  live::KubeBackendSpec spec;
  // The job's replica groups: a slot's pod gets its group's type and shape. Empty: all workers
  // shaped by `spec`.
  std::vector<live::ReplicaGroup> replicas;
  KubeConfig config;
  std::string master_url;
  std::string token;  // stored in a Secret the pods read it from, never in the pod spec
  std::string job;
  std::string run;    // "<job>-<run id>"
  bool adopt = false; // after a master restart: take this run's pods back
};

// One node of the job: its pod. `machine` is the Kubernetes node it was scheduled to.
struct KubePod : live::ClusterMember {
  std::string rank;  // its goodput/rank label: as created, or as last patched
  std::chrono::steady_clock::time_point launched;  // asked for then (or adopted then)
  std::string unschedulable;  // why the scheduler has not placed it yet, as it says
};

class KubeNodes final : public live::ClusterNodes<KubePod> {
 public:
  explicit KubeNodes(KubeNodesOptions options);
  ~KubeNodes() override;

  void launch(int32_t slot, int32_t memory_permille) override;
  void ranked(const std::string& name, int32_t rank) override;  // patches its goodput/rank label

  // The pod a launch makes: its name, memory, the nodes it must keep off.
  static nlohmann::json manifest_for(const KubeNodesOptions& o, const std::string& name, int32_t slot,
                                     int32_t memory_permille, const std::set<std::string>& avoid);

 private:
  void prepare(Command& c) override;
  bool carry_out(const Command& c) override;
  void on_idle() override;  // every second: pods pending too long are given up
  void job_over() override;  // deletes the agents' token Secret
  void watch_loop(const std::string& resource);
  void on_pod(const std::string& type, const nlohmann::json& pod);
  void on_node(const std::string& type, const nlohmann::json& node);
  void give_up_unscheduled();  // under mu_
  std::string pod_name(int32_t slot, int n) const;

  KubeNodesOptions o_;
  KubeClient client_;
  std::string ns_;
  std::string selector_;
  std::set<std::string> bad_nodes_;  // nodes Kubernetes reports in trouble (until it reports them well)
  std::set<std::string> kept_off_;   // nodes the scheduler places nothing on now (tainted, cordoned)
  std::map<std::string, std::string> node_status_;  // nodes that hosted our pods -> status as last logged
  int counter_ = 0;
  std::vector<std::thread> threads_;  // the watches of pods and nodes
};

}  // namespace goodput::kube
