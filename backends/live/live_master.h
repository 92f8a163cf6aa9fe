// The live job master: the engine's JobMaster on a real clock, fed by node agents over HTTP.
//
// Agents report state, not deltas: every heartbeat carries the whole status of the node's trainer
// (restart it runs, phase, step, checkpoints saved, steps in storage, how it exited). The master
// turns agreement across the world into observations (processes started, rendezvous complete,
// checkpoint loaded, saved, persisted, job completed), notices failures (an exit, a node that went
// silent or that the node provider saw die, a trainer that stopped reporting), and answers each
// heartbeat with what the node should be doing. Everything it needs to go on after a crash is in
// the event log: a restarted master folds the log and the agents' next heartbeats fill in the rest.
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

#include "backends/live/http.h"
#include "backends/live/job_spec.h"
#include "engine/clock.h"
#include "engine/event_store.h"
#include "engine/job_master.h"
#include "engine/shard_ledger.h"

namespace goodput::live {

// A node the provider saw die, and what it knows of why (an exit status, a Ray job's message and
// log tail, a dead machine). The reason goes to the diagnosis table: "OutOfMemoryError" in it
// reads as an OOM even though the whole node is gone.
struct LostNode {
  std::string name;
  std::string reason;
  bool fatal = false;  // a configuration error (Ray refused the job): trying again cannot help
};

// Where machines come from: the local backend starts agent processes, Ray runs them as Ray jobs.
class NodeProvider {
 public:
  virtual ~NodeProvider() = default;
  // Start a fresh node that will register itself for `slot` (the rank it is meant to take; it
  // takes another vacant one if that is taken by then); memory_permille scales its memory limit.
  virtual void launch(int32_t slot, int32_t memory_permille) = 0;
  // The node is out of the job: stop it for good (its host memory goes with it).
  virtual void terminate(const std::string& name) = 0;
  // Nodes the provider saw die since the last call (process gone, Ray job failed, machine dead).
  virtual std::vector<LostNode> lost() = 0;
  // The job is over: wait up to timeout_ms for nodes to leave on their own, then stop the rest.
  virtual void shut_down(int timeout_ms) = 0;
  // The machine under this node is bad (a hardware diagnosis, a failed node check): place no more
  // nodes on it. Providers that do not choose machines (the local one) have nothing to do.
  virtual void exclude(const std::string& name) { (void)name; }
  // Status changes of the cluster objects the job runs on, since the last call, for the log.
  virtual std::vector<StatusObserved> status_changes() { return {}; }
  // An operator scaled a replica group: slots are laid out anew (launch() takes the new slots).
  // Providers that pick a machine shape by slot follow; the others have nothing to do.
  virtual void set_layout(const std::vector<ReplicaGroup>& groups) { (void)groups; }
  // The node runs as this rank from this restart on (it may not be the slot it was launched for:
  // a group was scaled, or a spare took a vacant slot). Providers that label machines by rank
  // follow; the others have nothing to do.
  virtual void ranked(const std::string& name, int32_t rank) { (void)name, (void)rank; }
};

// The master's clock: nanoseconds since the job started, from the log's epoch (wall clock, read
// once when the master starts) plus a monotonic clock, so later wall-clock jumps change nothing.
class LiveClock final : public Clock {
 public:
  explicit LiveClock(int64_t epoch_unix_ns, Time not_before = 0);
  Time now() const override;
  static int64_t unix_now_ns();

 private:
  Time base_ = 0;
  int64_t mono_start_ = 0;
};

// Who may read the master's status endpoints (GET /status, / and /metrics; the agent API always
// wants the token). Auto: open on a loopback address; elsewhere /status and the page want the token
// and /metrics stays open for a Prometheus scraper.
enum class ReadAccess : uint8_t { Auto, Open, Token };

class LiveMaster final : public Backend, public EventSink {
 public:
  // With a fresh store, starts the job; with a store that holds a log, resumes it.
  // run_id: unique to this run of the job (survives master restarts); it names the run's shared
  // memory, so a new run never loads an old run's checkpoints.
  LiveMaster(JobSpec spec, PolicySet policies, SqliteStore& store, const Clock& clock, NodeProvider* provider,
             std::string token, std::string run_id);

  HttpResponse handle(const HttpRequest& request);
  // How the status endpoints are served: `access` for a master listening on `listen_address`.
  void set_read_access(ReadAccess access, const std::string& listen_address);
  // Where /metrics reads the HTTP server's own refusals (requests no handler saw).
  void set_transport_refusals(std::function<HttpRefusals()> refusals) { transport_refusals_ = std::move(refusals); }
  // Timeouts, provider notices, settled failures. Call every few tens of milliseconds.
  void tick();

  // Hand a fault to the node holding `slot` with its next heartbeat: kill-process, kill-node,
  // hang or oom. Throws std::invalid_argument for an unknown fault or an empty slot.
  nlohmann::json inject(const std::string& fault, int32_t slot);
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

  bool resumed() const { return resumed_; }
  bool finished() const { return master_.state().finished(); }
  const JobState& state() const { return master_.state(); }
  const ShardLedger& shards() const { return ledger_; }
  nlohmann::ordered_json status() const;
  std::string metrics() const;
  std::string page() const;  // GET /: the live report page
  int64_t newest_step() const;  // highest step any trainer reported
  // One line per recovery decided since the last call, saying why (diagnosis, the failure behind
  // it, the rule): for the console. Decisions folded from the log when resuming are not repeated.
  std::vector<std::string> take_console_notes() { return std::exchange(notes_, {}); }

  // Backend: carry out a decision. EventSink: keep the node table in step with the log.
  void execute(const Event& decision) override;
  void append(const Event& e) override;

 private:
  struct Trainer {  // as the agent last reported it
    int32_t restart = -1;
    std::string phase = "none";  // none, starting, rendezvous, loaded, training, exited
    int64_t pid = 0;
    int64_t step = 0;
    Time last_progress = 0;
    bool stopped = false;  // the process is stopped (SIGSTOP), alive but not running
    std::optional<double> loss;
    double work_median_s = -1;  // CPU work per step: median and MAD over the agent's window
    double work_mad_s = -1;
    int64_t saves = 0;
    int64_t save_blocking_ns = 0;
    int64_t saved_step = -1;
    std::optional<CheckpointLoaded> loaded;
    std::vector<int64_t> storage_steps;
    bool exited = false;
    bool done = false;
    int32_t exit_code = 0;
    int32_t exit_signal = 0;
    std::string exit_reason;
    Time exited_at = 0;
  };
  struct Node {
    NodeId id = 0;
    std::string name;
    std::string host;  // where other ranks reach it; not in the log: learnt again from requests
    int32_t slot = -1;  // -1: a spare
    int32_t former_slot = -1;  // the slot it held when it was relaunched
    // The replica type it was launched as (its slot's group): it takes only slots of that type.
    // Empty: any (an agent started by hand, or a spare known only from the log).
    std::string kind;
    bool gone = false;  // relaunched: this machine is out of the job for good
    Time last_heartbeat = 0;
    Trainer trainer;
    std::vector<std::string> inject;  // faults to hand to the agent with the next heartbeat
    // Pre-flight check. Verdict and numbers are folded from the log (NodeChecked); the round in
    // progress is not (a resumed master checks again what had no verdict).
    uint16_t check_port = 0;     // its agent's link-probe port
    uint16_t rdzv_port = 0;      // a free port its agent offers for the rendezvous store (as rank 0)
    std::string persist_error;   // why its agent's newest persist to storage failed; empty: it did not
    std::string check_fault;     // fault drill for its check (the first node of a slot)
    bool check_wanted = false;   // to be checked: every node when the spec has node_check, else on request
    std::string check_verdict;   // passed, straggler or faulty; empty: not checked yet
    std::string check_detail;
    int32_t check_slowdown = 0;  // a straggler's measured slowdown (permille); not in the log
    bool check_acted = false;    // its verdict went to the policies
    int64_t check_mflops = 0;
    int64_t check_link = 0;      // MB/s; 0: not measured
    int32_t check_round = 0;     // the round it was asked for
    int64_t check_id = 0;        // that round's id, unique across master restarts: its report must name it
    NodeId check_peer = -1;
    struct CheckReport {
      int64_t mflops = 0;
      bool compute_ok = false;
      std::optional<bool> link_ok;  // absent: no link was measured
      int64_t link = 0;
      std::string error;
    };
    std::optional<CheckReport> check_report;  // its agent's result for check_id
  };

  HttpResponse on_register(const nlohmann::json& body, const std::string& peer_address);
  HttpResponse on_heartbeat(const nlohmann::json& body, const std::string& peer_address);
  HttpResponse on_shards_next(const nlohmann::json& body);
  HttpResponse on_shards_complete(const nlohmann::json& body);
  HttpResponse on_inject(const nlohmann::json& body);
  HttpResponse on_check(const nlohmann::json& body);
  HttpResponse on_scale(const nlohmann::json& body);
  void relayout(const ScaleDecided& d);  // the fold of a replica group's scale decision
  bool undo_growth(int32_t slot, const std::string& why);  // no machine comes for a grown group's slot
  std::optional<int32_t> first_vacant() const;             // the lowest slot no node holds
  // The replica counts the checkpoint of `step` was saved under (from the restarts in the log).
  nlohmann::json layout_of(int64_t step) const;
  nlohmann::json assignment(const Node& n) const;
  Node* node(NodeId id);
  std::vector<Node*> world();  // nodes holding slots 0..world-1; empty if a slot is vacant
  void advance();              // turn agreement across the world into observations
  bool settled(const std::vector<Node*>& world, Time now) const;  // a failure's reports are all in
  void observe(EventPayload p);
  void on_lost(const LostNode& lost, Time now);
  bool detect_stragglers(const std::vector<Node*>& w);
  bool checks_on() const { return spec_.node_check.enabled || checks_requested_; }
  bool checks_pending() const;  // a node of the world has no check verdict yet
  void start_waiting_check();
  void run_checks();
  void judge_checks();
  void act_on_checks();
  void start_check_round(int32_t round, std::vector<NodeId> members, const std::vector<NodeId>& peers);
  uint16_t pick_port() const;  // rank 0's offered port; else one free here
  bool fits(const Node& n, int32_t slot) const;  // n may take slot (it is of the slot's replica type)
  void place_spares();  // vacant slots of the world get spares of their type (after a scale decision)

  JobSpec spec_;
  const Clock& clock_;
  NodeProvider* provider_;
  std::string token_;
  std::string run_id_;
  SqliteStore& store_;
  JobMaster master_;
  ShardLedger ledger_;
  bool resumed_ = false;

  std::map<NodeId, Node> nodes_;
  std::vector<NodeId> slots_;             // slot -> node (-1: vacant)
  std::vector<int32_t> slot_memory_;      // slot -> memory permille for the next node there
  NodeId next_node_ = 0;
  int32_t world_ = 0;
  RestartJob restart_;                    // the newest restart
  Time run_at_ = 0;                       // trainers of restart_ start at this time (backoff)
  uint16_t rdzv_port_ = 0;
  CheckpointPlanSet plan_;
  int64_t gen_saves_ = 0;                 // saves of this restart already in the log
  int64_t gen_blocking_ns_ = 0;
  int64_t persisted_step_ = -1;
  int64_t saved_step_ = -1;               // newest step a CheckpointSaved in the log names
  std::optional<Time> settle_from_;       // a trainer's exit was first seen then; diagnosis waits (settled())
  bool in_advance_ = false;
  bool ticking_ = false;
  std::optional<StallObserved> stall_;    // a hang reported and left alone (hang_action "report"), until it moves
  std::optional<StallObserved> pause_;    // a job-wide silence under way (not logged unless it ends by itself)
  int64_t pause_step_ = 0;                // the newest step any rank had reported when it began
  std::set<int32_t> waiting_slots_;       // vacant slots reported as NoSpareNode
  int32_t launches_lost_ = 0;             // nodes lost before they joined, since one last joined
  int32_t grow_back_lost_ = 0;            // of those, asked for a slot outside a shrunk world
  std::optional<Time> grow_back_at_;      // when to ask for such a slot's machine again
  int64_t unauthorized_ = 0;
  int64_t bad_requests_ = 0;
  std::string recovery_note(const RecoveryDecided& d) const;
  bool folding_ = false;  // folding the log at a resume
  std::optional<FailureObserved> last_failure_;
  std::vector<std::string> notes_;  // 400s from the API's handlers: not JSON, wrong fields
  bool status_needs_token_ = false, metrics_need_token_ = false;
  std::function<HttpRefusals()> transport_refusals_;
  int64_t unauthorized_logged_ = 0;       // of those, the ones api_refused events counted
  std::string refused_peer_;              // where the newest came from
  std::optional<Time> refusals_logged_at_;
  void log_refusals(bool now);            // an api_refused event for refusals not yet logged (now: whenever)
  std::map<NodeId, int32_t> straggler_permille_;  // the slowdown last reported per node
  std::map<NodeId, ShardsAssigned> last_assigned_;  // each node's newest answer in this restart
  std::map<std::string, int64_t> check_verdicts_;  // node_checked events by verdict, for /metrics
  std::set<int32_t> slots_seen_;          // slots some node has joined (a check's fault drill goes to the first)
  bool checks_requested_ = false;         // an operator asked for a check (so a job without node_check checks)
  std::optional<CheckRequested> waiting_check_;  // asked for (logged as waiting), to start after the next checkpoint
  int32_t check_round_ = 0;               // the check round in progress (0: none)
  int64_t last_check_id_ = 0;
  Time check_deadline_ = 0;
  std::vector<NodeId> check_members_;
  // Replica counts of each restart's world, by the step it restored: checkpoints of steps above a
  // key were saved under its layout (until the next key).
  std::map<int64_t, nlohmann::json> layouts_;
  bool relaid_ = false;  // a replica group was scaled (ranks moved) at some point of the run
  std::map<std::string, int32_t> grown_;  // a group an operator grew: its count before (until it shrinks to that)
};

}  // namespace goodput::live
