// The live job master: the engine's JobMaster on a real clock, fed by node agents (MasterApi reads
// their requests off HTTP and calls this class; master_status.h renders what it knows).
//
// Agents report state, not deltas: every heartbeat carries the whole status of the node's trainer
// (restart it runs, phase, step, checkpoints saved, steps in storage, how it exited). The master
// turns agreement across the world into observations (processes started, rendezvous complete,
// checkpoint loaded, saved, persisted, job completed), notices failures (an exit, a node that went
// silent or that the node provider saw die, a trainer that stopped reporting), and answers each
// heartbeat with what the node should be doing. Everything it needs to go on after a crash is in
// the event log: a restarted master folds the log and the agents' next heartbeats fill in the rest.
//
// It reads as the orchestration of its parts, each with its own state and header: the World (node
// table, slots, replica layout), what the ranks agree on (agreement.h), the node checks'
// rounds (NodeChecks), straggler detection (Stragglers) and how failures are noticed and settled
// (FailureWatch). What it keeps itself is the restart in progress, the checkpoints the log knows,
// and what its provider is asked for.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/live/agent_protocol.h"
#include "backends/live/agreement.h"
#include "backends/live/failure_watch.h"
#include "backends/live/job_spec.h"
#include "backends/live/live_clock.h"
#include "backends/live/node_provider.h"
#include "backends/live/node_checks.h"
#include "backends/live/stragglers.h"
#include "backends/live/world.h"
#include "engine/clock.h"
#include "engine/event_store.h"
#include "engine/job_master.h"
#include "engine/shard_ledger.h"
#include "policies/policy.h"

namespace goodput::live {

class LiveMaster final : public Backend, public EventSink {
 public:
  // With a fresh store, starts the job; with a store that holds a log, resumes it.
  // run_id: unique to this run of the job (survives master restarts); it names the run's shared
  // memory, so a new run never loads an old run's checkpoints.
  LiveMaster(JobSpec spec, PolicySet policies, EventStore& store, const Clock& clock, NodeProvider* provider,
             std::string run_id);

  // ---- the agent protocol (MasterApi reads the wire and calls these). Each answers with what the
  // node should be doing (its assignment) or the request's result; throws ApiError when the request
  // cannot be taken now.
  nlohmann::json register_node(const RegisterRequest& request);
  nlohmann::json heartbeat(const AgentReport& report);
  nlohmann::json next_shard(NodeId node, int32_t restart, int64_t request, int32_t local_rank = 0);
  nlohmann::json complete_shards(NodeId node, int64_t step, const std::vector<int64_t>& shards);
  // A request refused for a missing or wrong token: counted for /metrics, and in the log as an
  // api_refused event at most once a minute (a flood must not grow it).
  void refused_token(const std::string& peer_address);
  void refused_request() { ++bad_requests_; }  // a 400: not JSON, an unknown key, a wrong type

  // Timeouts, provider notices, settled failures. Call every few tens of milliseconds.
  void tick();

  // Hand a fault to the node holding `slot` with its next heartbeat: kill-process, kill-node,
  // hang, oom, or corrupt-replica (spoil the checkpoint copies it holds for its peers). Throws std::invalid_argument for an unknown fault or an empty slot.
  // local_rank: which of the node's trainer processes gets a process fault (kill-process, hang, oom).
  nlohmann::json inject(const std::string& fault, int32_t slot, int32_t local_rank = 0);
  // Check the nodes holding `slots` again (all of the world's when empty), with a fault drill
  // (corrupt, link-down, slow:F) if `fault` is set: training stops for the check and restarts from
  // the newest checkpoint once all have a verdict. A training job with periodic checkpoints stops
  // right after its next one, so the check costs no recomputation; `now` (or no such plan, or a
  // job not training) stops it at once. Throws std::invalid_argument when it cannot be done (an
  // empty slot, a check in progress or waiting, the job finished) and why.
  nlohmann::json request_check(const std::vector<int32_t>& slots, const std::string& fault, const std::string& reason,
                               bool now = false);
  // Change replica group `group` ("ps" or "worker") to `count` nodes (an operator's `goodput scale`):
  // a larger group gets new nodes at its end, a smaller one releases its highest slots; the slots
  // after it move along, and the world restarts from the newest checkpoint in storage, each rank
  // told the layout it was saved under. Throws std::invalid_argument when it cannot be done now
  // (no such group, the world incomplete, a check under way, the job finished) and why.
  nlohmann::json request_scale(const std::string& group, int32_t count, const std::string& reason);
  // Ends the job now (an operator's Ctrl-C): the log says "stopped".
  void stop();

  // ---- what it knows (for status, metrics and the console)
  bool resumed() const { return resumed_; }
  bool finished() const { return master_.state().finished(); }
  const JobState& state() const { return master_.state(); }
  const ShardLedger& shards() const { return ledger_; }
  const JobSpec& spec() const { return spec_; }
  const World& world() const { return world_; }
  const NodeChecks& checks() const { return checks_; }
  const RestartJob& restart() const { return restart_; }
  const EventStore& store() const { return store_; }
  int64_t newest_step() const { return world_.newest_step(); }  // highest step any trainer reported
  Time now() const { return clock_.now(); }
  struct Refusals {
    int64_t token = 0;        // missing or wrong bearer token
    int64_t bad_request = 0;  // 400s from the API: not JSON, wrong fields
  };
  Refusals refusals() const { return {unauthorized_, bad_requests_}; }
  // One line per recovery decided since the last call, saying why (diagnosis, the failure behind
  // it, the rule): for the console. Decisions folded from the log when resuming are not repeated.
  std::vector<std::string> take_console_notes() { return std::exchange(notes_, {}); }
  // The newest recovery decision and its note (also when folded from the log); none yet: nullopt.
  struct Recovery {
    RecoveryDecided decision;
    std::string note;
  };
  const std::optional<Recovery>& last_recovery() const { return last_recovery_; }

  // Backend: carry out a decision. EventSink: keep the world in step with the log.
  void execute(const Event& decision) override;
  void append(const Event& e) override;

 private:
  nlohmann::json assignment(const Node& n) const;  // what a node should be doing now
  nlohmann::json run_order(const Node& n) const;   // the "run" assignment: rank, restart, program
  void observe(EventPayload p);
  // Turn agreement across the world into observations (agreement.h), until nothing more follows.
  void advance();
  void on_lost(const LostNode& lost, Time now);
  // The provider, for acting on machines outside execute(): what was logged is made durable first.
  NodeProvider& machines();
  // A world slot vacant for join_timeout since it was last seen vacant gets another machine.
  void ask_again_for_vacant_slots(Time now);
  bool undo_growth(int32_t slot, const std::string& why);  // no machine comes for a grown group's slot
  void start_waiting_check();
  void run_checks();
  void act_on_checks();
  uint16_t pick_port() const;  // rank 0's offered port; else one free here
  void log_refusals(bool now);  // an api_refused event for refusals not yet logged (now: whenever)

  JobSpec spec_;
  const Clock& clock_;
  NodeProvider* provider_;
  std::string run_id_;
  EventStore& store_;
  JobMaster master_;
  ShardLedger ledger_;
  World world_;
  NodeChecks checks_;
  Stragglers stragglers_;
  FailureWatch failures_;
  bool resumed_ = false;
  bool folding_ = false;  // folding the log at a resume

  RestartJob restart_;                    // the newest restart
  Time run_at_ = 0;                       // trainers of restart_ start at this time (backoff)
  uint16_t rdzv_port_ = 0;
  CheckpointPlanSet plan_;
  int64_t gen_saves_ = 0;                 // saves of this restart already in the log
  int64_t gen_blocking_ns_ = 0;
  int64_t persisted_step_ = -1;
  int64_t replicated_step_ = -1;          // newest step a ReplicaStored in the log names
  int64_t saved_step_ = -1;               // newest step a CheckpointSaved in the log names
  bool in_advance_ = false;
  bool ticking_ = false;
  int32_t launches_lost_ = 0;             // nodes lost before they joined, since one last joined
  int32_t grow_back_lost_ = 0;            // of those, asked for a slot outside a shrunk world
  std::optional<Time> grow_back_at_;      // when to ask for such a slot's machine again
  std::map<int32_t, Time> vacant_since_;  // world slots vacant, since when (or since their last ask)
  std::optional<FailureObserved> last_failure_;
  std::optional<Recovery> last_recovery_;
  std::vector<std::string> notes_;
  std::set<NodeId> exited_;               // nodes whose trainers reported an exit in this restart
  Sweeps sweeps_;                         // how far advance()'s questions to the world got
  // Each trainer process's newest answer in this restart, by node and local rank.
  std::map<std::pair<NodeId, int32_t>, ShardsAssigned> last_assigned_;
  int64_t unauthorized_ = 0;
  int64_t bad_requests_ = 0;
  int64_t unauthorized_logged_ = 0;       // of those, the ones api_refused events counted
  std::string refused_peer_;              // where the newest came from
  std::optional<Time> refusals_logged_at_;
};

}  // namespace goodput::live
