// The Ray backend: every node of the job (a `goodput agent` and the trainer it starts) is one Ray
// job on a Ray cluster, submitted through the dashboard's Jobs API and placed by the resources it
// asks for. Ray only places and runs them; the agents talk to the master as on any backend.
//
// What Ray says becomes what the master needs: a node's job that ended (FAILED with its message
// and log tail, STOPPED, SUCCEEDED) or whose machine the State API lists as DEAD is a lost node; a
// job still PENDING after pending_timeout is stopped and reported lost, so the policy resubmits it
// (or gives up). A relaunch is stop + a new submission with the slot's (possibly larger) memory.
//
// All HTTP runs on one worker thread, so a slow or failing dashboard never stalls the master's
// loop; calls retry with backoff, and submits are idempotent by submission_id.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/live/job_spec.h"
#include "backends/live/live_master.h"
#include "backends/ray/ray_client.h"

namespace goodput::ray {

struct RayNodesOptions {
  live::RayBackendSpec spec;
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
  void report(Tracked& t, std::string reason, bool fatal = false);

  RayNodesOptions o_;
  RayClient client_;  // used only on the worker thread
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> queue_;
  std::map<std::string, Tracked> nodes_;
  std::vector<live::LostNode> lost_;
  std::vector<StatusObserved> changes_;
  int counter_ = 0;
  bool quit_ = false;
  bool dashboard_down_ = false;
  std::thread worker_;
};

}  // namespace goodput::ray
