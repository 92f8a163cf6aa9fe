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
// All HTTP runs on one worker thread, so a slow or failing dashboard never stalls the master's
// loop; calls retry with backoff, and submits are idempotent by submission_id.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backends/live/job_spec.h"
#include "backends/live/live_master.h"
#include "backends/ray/ray_client.h"

namespace goodput::ray {

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

class RayNodes final : public live::NodeProvider {
 public:
  explicit RayNodes(RayNodesOptions options);
  ~RayNodes() override;

  void launch(int32_t slot, int32_t memory_permille) override;
  void terminate(const std::string& name) override;
  std::vector<live::LostNode> lost() override;
  void shut_down(int timeout_ms) override;
  std::vector<StatusObserved> status_changes() override;
  void exclude(const std::string& name) override;
  void set_layout(const std::vector<live::ReplicaGroup>& groups) override;

  // The submission a node's name maps to (stable: a retried submit reuses it).
  std::string submission_id(const std::string& name) const;

 private:
  struct Tracked {
    std::string name;
    int32_t memory_permille = 1000;
    int32_t slot = -1;
    bool submitted = false;
    bool stopping = false;  // terminated by the master: its end is not a loss
    bool ended = false;
    std::string status;
    std::string ray_node;  // the Ray node (id) its job's driver runs on, once placed
    std::chrono::steady_clock::time_point pending_since{};
  };
  struct Command {
    enum { Submit, Stop } kind;
    std::string name;  // Stop: the node; Submit: named when it is carried out
    int32_t memory_permille = 1000;
    int32_t slot = -1;
  };

  void loop();
  void work();
  void adopt();
  bool run_command(const Command& c);  // false: the dashboard could not be reached; try again later
  void poll();
  SubmitRequest request_for(const Tracked& t) const;
  std::string pinned_node_ip() const;  // with machines excluded: an alive node to pin a submission to
  void report(Tracked& t, std::string reason, bool fatal = false);

  RayNodesOptions o_;
  RayClient client_;  // used only on the worker thread
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> queue_;
  std::map<std::string, Tracked> nodes_;
  std::vector<live::LostNode> lost_;
  std::vector<StatusObserved> changes_;
  std::vector<RayNode> cluster_;         // the State API's nodes, as of the last poll
  std::set<std::string> excluded_;       // Ray node ids no new node may run on
  int counter_ = 0;
  bool quit_ = false;
  bool dashboard_down_ = false;
  std::thread worker_;
};

}  // namespace goodput::ray
