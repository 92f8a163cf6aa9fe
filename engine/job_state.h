// JobState is a pure fold over events: apply(event) is the only way it changes. It carries the
// goodput accounting: every nanosecond of wall time lands in exactly one bucket, productive or one
// of the losses, so the breakdown sums to wall time by construction (and is checked).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "engine/checkpoint_manager.h"
#include "engine/event.h"

namespace goodput {

enum class Loss : uint8_t {
  Detection,        // the job had stopped but nobody knew yet
  Restart,          // trainer processes starting (and restart backoff)
  Scheduling,       // a machine is on its way: placed, its node starting up
  Rendezvous,       // workers agreeing on the world
  CheckpointLoad,   // restoring state
  Recompute,        // progress thrown away: training since the checkpoint that was restored
  CheckpointSave,   // training blocked by checkpoint saves
  ReducedCapacity,  // training with fewer nodes than the target world
  Slowdown,         // training slowed by a straggler
  CapacityWait,     // a slot has no machine at all and none is free: waiting for a repair or a spare
  Stall,            // trainers up but not advancing, and nothing done: a pause that passed, a hang left alone
  GaveUp,           // the job gave up: the rest of the horizon it was meant to run for
};
constexpr int kLossCount = 12;
std::string_view to_string(Loss l);

// Where the job is; derived from what it has seen.
enum class Phase : uint8_t {
  NotStarted, Scheduling, WaitingForCapacity, Restart, Rendezvous, CheckpointLoad, Training, GaveUp, Finished
};
std::string_view to_string(Phase p);

class JobState {
 public:
  // REQUIRES: events in log order (seq increasing, time non-decreasing).
  void apply(const Event& e);

  // ---- the job ----
  const JobStarted& job() const { return job_; }
  bool started() const { return started_; }
  bool finished() const { return finished_; }
  const std::string& finish_reason() const { return finish_reason_; }
  Phase phase() const;
  Time start_time() const { return start_; }
  Time now() const { return now_; }
  uint64_t last_seq() const { return last_seq_; }

  // ---- membership ----
  int32_t world_size() const { return world_size_; }         // nodes in the (next) training world
  // The world the job is meant to have: JobStarted's nodes, changed by operators' scale requests.
  int32_t target_nodes() const { return target_nodes_; }
  int32_t nodes_held() const { return held_count_; }         // machines holding a slot
  int32_t spares_held() const { return spares_held_; }       // warm spares ready (scaling.warm_spares)
  int32_t vacant_slots() const { return world_size_ > held_count_ ? world_size_ - held_count_ : 0; }
  // Vacant slots no machine is on its way to (a no_spare_node not yet answered by a join or by a
  // returned machine).
  int32_t slots_without_machine() const { return static_cast<int32_t>(no_machine_.size()); }
  bool holds(NodeId n) const { return held_.contains(n); }
  int32_t slowdown_permille() const { return slowdown_max_; }
  // The job must restart its trainers and nobody has asked yet.
  bool needs_restart() const { return started_ && !finished_ && stage_ == Stage::None && !gave_up_; }
  // RestartJob decisions so far; the first one is the job's initial start.
  int32_t restart_jobs() const { return restart_jobs_; }
  int32_t restarts() const { return restart_jobs_ > 0 ? restart_jobs_ - 1 : 0; }
  bool gave_up() const { return gave_up_; }
  Time gave_up_at() const { return gave_up_at_; }  // when it gave up (if it did)
  const std::string& gave_up_because() const { return gave_up_rule_; }  // the give-up decision's rule

  // ---- failures (for policies) ----
  int32_t failures() const { return failures_; }
  int32_t failures_of(NodeId n) const;
  // Failures of node n observed after `since` (the newest kRecentFailures of each node are kept).
  int32_t failures_of_since(NodeId n, Time since) const;
  static constexpr size_t kRecentFailures = 1024;
  int32_t failures_since_checkpoint() const { return failures_since_checkpoint_; }
  // The job trained since its last (re)start (its trainers got as far as loading their state).
  bool trained_since_restart() const { return trained_since_restart_; }
  // Process exits in a row, with the same exit code, signal and reason and no training between
  // them, this one included: a job that cannot start fails the same way on every try.
  int32_t repeated_startup_failures() const { return startup_repeats_; }
  Duration last_backoff() const { return last_backoff_; }

  // ---- checkpoints ----
  const CheckpointManager& checkpoints() const { return checkpoints_; }
  const CheckpointPlanSet& checkpoint_plan() const { return plan_; }
  int64_t checkpoints_saved(Tier t) const { return saved_[static_cast<size_t>(t)]; }
  int64_t checkpoints_persisted() const { return persisted_; }
  int64_t checkpoints_replicated() const { return replicated_; }
  // Restores (checkpoint_loaded) from tier t; Tier::None counts starts from scratch.
  int64_t restores_from(Tier t) const { return restores_[static_cast<size_t>(t)]; }

  // ---- goodput ----
  Duration wall() const { return started_ ? now_ - start_ : 0; }
  Duration productive() const { return progress_; }
  Duration loss(Loss l) const { return loss_[static_cast<size_t>(l)]; }
  Duration losses_total() const;
  // Steps of kept progress at the cost model's step time (a live job's real steps run a little faster or
  // slower, so never more than the job has).
  int64_t steps_done() const {
    const int64_t s = job_.step_time > 0 ? progress_ / job_.step_time : 0;
    return job_.total_steps > 0 ? std::min(s, job_.total_steps) : s;
  }
  // Accelerator-ns held by the job, and accelerator-ns of kept progress: kept progress weighs the
  // accelerators of the target world it was made for (an operator's scale changes that weight), so
  // it never exceeds the accelerator time of the nodes that trained.
  double accelerator_ns_held() const { return accel_held_; }
  double accelerator_ns_productive() const;
  // The job is between a stop and its next training (a failure, a scale, a check): ending now throws
  // away the progress since the restore it will take.
  bool in_recovery() const { return started_ && !finished_ && stage_ != Stage::Training && restart_jobs_ > 0; }
  // The restore a restart under way has chosen; nothing when none is under way.
  std::optional<CheckpointManager::Restore> restore_under_way() const;
  int32_t failures_by(Diagnosis d) const { return by_diagnosis_[static_cast<size_t>(d)]; }
  int32_t decisions_by(RecoveryAction a) const { return by_action_[static_cast<size_t>(a)]; }
  int32_t scale_changes() const { return scale_changes_; }

 private:
  enum class Stage : uint8_t { None, Restart, Rendezvous, Load, Training };
  void accrue(Time until);
  // Progress stopped at `since` and we hear of it now: take back what was credited since then (at
  // full speed that is exactly the time) and accrue up to `since`; returns the time taken back.
  void stop_credit_at(Time since);
  void add_loss(Loss l, Duration d) { loss_[static_cast<size_t>(l)] += d; }
  // A node takes (slot >= 0) or leaves a slot; returns the slot it held (-1: none known).
  int32_t set_held(NodeId n, bool held, int32_t slot = -1);
  // Slots of the target world with no node in them now (for the peer tier's placement).
  std::set<int32_t> vacant_slot_set() const;
  void take_back_progress(Duration to);
  void recompute_slowdown();

  JobStarted job_;
  CheckpointCosts costs_;
  bool started_ = false;
  bool finished_ = false;
  bool gave_up_ = false;
  Time gave_up_at_ = 0;
  std::string gave_up_rule_;
  bool trained_since_restart_ = false;
  int32_t startup_repeats_ = 0;
  std::string startup_signature_;
  std::string finish_reason_;
  Time start_ = 0;
  Time now_ = 0;
  Time accrued_to_ = 0;
  static constexpr Time kNever = INT64_MAX;
  Time full_speed_since_ = kNever;  // training at full capacity and speed without a break since
  bool stalled_ = false;            // training, but no progress since a stall_observed (not resumed)
  uint64_t last_seq_ = 0;
  Stage stage_ = Stage::None;

  int32_t world_size_ = 0;
  int32_t target_nodes_ = 0;
  int32_t held_count_ = 0;
  int32_t spares_held_ = 0;  // warm spares ready for the job (held, not training)
  std::vector<std::pair<Time, int32_t>> spare_changes_;  // (when, the count before) while at full speed
  std::set<int32_t> no_machine_;  // slots waiting for capacity
  // Keyed by node id: ids come from logs and traces, so they may be sparse, huge or negative.
  std::map<NodeId, int32_t> held_;     // the slot each held node is in (-1: not known)
  std::map<int32_t, NodeId> slot_node_;  // the node in each slot known
  std::map<NodeId, int32_t> slowdown_;  // only nodes slower than full speed
  std::map<NodeId, int32_t> node_failures_;
  std::map<NodeId, std::vector<Time>> recent_failures_;  // per node, the newest kRecentFailures times
  int32_t slowdown_max_ = 1000;
  int32_t training_world_ = 0;
  int32_t restart_jobs_ = 0;

  int32_t failures_ = 0;
  FailureKind last_failure_kind_ = FailureKind::NodeLost;  // a planned replacement has none: see RecoveryDecided
  int32_t failures_since_checkpoint_ = 0;
  Duration last_backoff_ = 0;
  std::array<int32_t, kDiagnosisCount> by_diagnosis_{};
  std::array<int32_t, kRecoveryActionCount> by_action_{};
  int32_t scale_changes_ = 0;

  CheckpointManager checkpoints_;
  CheckpointPlanSet plan_;
  std::array<int64_t, kTierCount> saved_{};
  std::array<int64_t, kTierCount> restores_{};  // checkpoint_loaded by tier
  int64_t persisted_ = 0;
  int64_t replicated_ = 0;

  Duration progress_ = 0;
  std::array<Duration, kLossCount> loss_{};
  double accel_held_ = 0;
  // Kept progress by the accelerators it weighs: from `progress` on, each ns of kept progress is
  // worth `accelerators` accelerator-ns (until the next segment). A handful: one per scale.
  struct WeightSegment {
    Duration progress;
    int64_t accelerators;
  };
  std::vector<WeightSegment> weights_;
  RestartJob restart_;  // the newest restart decided
};

}  // namespace goodput
