#include "engine/job_state.h"

#include <algorithm>
#include <array>

namespace goodput {

namespace {
constexpr std::array<std::string_view, kLossCount> kLossNames = {
    "detection",       "restart",         "scheduling",       "rendezvous", "checkpoint_load",
    "recompute",       "checkpoint_save", "reduced_capacity", "slowdown",   "waiting_for_capacity",
    "stall",           "gave_up"};
constexpr std::array<std::string_view, 9> kPhaseNames = {
    "not_started", "scheduling", "waiting_for_capacity", "restart", "rendezvous",
    "checkpoint_load", "training", "gave_up", "finished"};
}  // namespace

std::string_view to_string(Loss l) { return kLossNames[static_cast<size_t>(l)]; }
std::string_view to_string(Phase p) { return kPhaseNames[static_cast<size_t>(p)]; }

Phase JobState::phase() const {
  if (!started_) return Phase::NotStarted;
  if (finished_) return Phase::Finished;
  switch (stage_) {
    case Stage::Restart: return Phase::Restart;
    case Stage::Rendezvous: return Phase::Rendezvous;
    case Stage::Load: return Phase::CheckpointLoad;
    case Stage::Training: return Phase::Training;
    case Stage::None: break;
  }
  if (gave_up_) return Phase::GaveUp;
  // The job waits for its slowest slot: while one has no machine at all, that is the wait (a
  // placement under way elsewhere would change nothing); otherwise machines are being placed.
  if (vacant_slots() > 0) return no_machine_.empty() ? Phase::Scheduling : Phase::WaitingForCapacity;
  return Phase::Restart;
}

Duration JobState::losses_total() const {
  Duration sum = 0;
  for (Duration d : loss_) sum += d;
  return sum;
}

double JobState::accelerator_ns_productive() const {
  double sum = 0;
  for (size_t i = 0; i < weights_.size(); ++i) {
    const Duration end = i + 1 < weights_.size() ? weights_[i + 1].progress : progress_;
    sum += static_cast<double>(end - weights_[i].progress) * static_cast<double>(weights_[i].accelerators);
  }
  return sum;
}

std::optional<CheckpointManager::Restore> JobState::restore_under_way() const {
  if (stage_ != Stage::Restart && stage_ != Stage::Rendezvous && stage_ != Stage::Load) return std::nullopt;
  return CheckpointManager::Restore{restart_.restore_step, restart_.restore_tier};
}

int32_t JobState::failures_of(NodeId n) const {
  const auto it = node_failures_.find(n);
  return it == node_failures_.end() ? 0 : it->second;
}

int32_t JobState::failures_of_since(NodeId n, Time since) const {
  const auto it = recent_failures_.find(n);
  if (it == recent_failures_.end()) return 0;
  const auto& times = it->second;  // ascending
  return static_cast<int32_t>(times.end() - std::upper_bound(times.begin(), times.end(), since));
}

void JobState::take_back_progress(Duration to) {
  progress_ = std::clamp<Duration>(to, 0, progress_);
  while (!weights_.empty() && weights_.back().progress >= progress_) weights_.pop_back();
}

int32_t JobState::set_held(NodeId n, bool held, int32_t slot) {
  if (n < 0) return -1;
  auto it = held_.find(n);
  const int32_t was = it == held_.end() ? -1 : it->second;
  if (was >= 0) {
    auto at = slot_node_.find(was);
    if (at != slot_node_.end() && at->second == n) slot_node_.erase(at);
  }
  if (held) {
    if (slot >= 0) slot_node_[slot] = n;
    if (it != held_.end()) {
      it->second = slot;
      return was;
    }
    held_.emplace(n, slot);
  } else {
    if (it == held_.end()) return -1;
    held_.erase(it);
  }
  held_count_ += held ? 1 : -1;
  recompute_slowdown();
  return was;
}

std::set<int32_t> JobState::vacant_slot_set() const {
  std::set<int32_t> vacant;
  if (static_cast<int64_t>(slot_node_.size()) >= target_nodes_ && (slot_node_.empty() || slot_node_.rbegin()->first < target_nodes_))
    return vacant;
  for (int32_t s = 0; s < target_nodes_; ++s)
    if (!slot_node_.contains(s)) vacant.insert(s);
  return vacant;
}

void JobState::recompute_slowdown() {
  int32_t m = 1000;
  for (const auto& [node, permille] : slowdown_)
    if (held_.contains(node)) m = std::max(m, permille);
  slowdown_max_ = m;
}

void JobState::accrue(Time until) {
  if (!started_ || finished_ || until <= accrued_to_) return;
  const Duration dt = until - accrued_to_;
  accrued_to_ = until;
  accel_held_ += static_cast<double>(dt) * (held_count_ + spares_held_) * job_.accelerators_per_node;
  const Phase ph = phase();
  if (ph != Phase::Training) full_speed_since_ = kNever;
  switch (ph) {
    case Phase::Training: {
      if (stalled_) {
        full_speed_since_ = kNever;
        add_loss(Loss::Stall, dt);
        break;
      }
      // Full-job-equivalent progress: capacity share of the world, divided by the straggler factor.
      const int32_t n = std::max(target_nodes_, 1);
      const bool full = training_world_ >= n;  // the usual case needs no 128-bit division
      if (!full || slowdown_max_ != 1000) full_speed_since_ = kNever;
      else if (full_speed_since_ == kNever) full_speed_since_ = until - dt;
      const Duration capacity =
          full ? dt : static_cast<Duration>(static_cast<__int128>(dt) * std::max(training_world_, 0) / n);
      const Duration kept =
          slowdown_max_ == 1000 ? capacity : static_cast<Duration>(static_cast<__int128>(capacity) * 1000 / slowdown_max_);
      if (kept > 0) {
        const int64_t weight = int64_t{n} * job_.accelerators_per_node;
        if (weights_.empty() || weights_.back().accelerators != weight) weights_.push_back({progress_, weight});
      }
      progress_ += kept;
      add_loss(Loss::ReducedCapacity, dt - capacity);
      add_loss(Loss::Slowdown, capacity - kept);
      break;
    }
    case Phase::Scheduling: add_loss(Loss::Scheduling, dt); break;
    case Phase::WaitingForCapacity: add_loss(Loss::CapacityWait, dt); break;
    case Phase::GaveUp: add_loss(Loss::GaveUp, dt); break;
    case Phase::Restart: add_loss(Loss::Restart, dt); break;
    case Phase::Rendezvous: add_loss(Loss::Rendezvous, dt); break;
    case Phase::CheckpointLoad: add_loss(Loss::CheckpointLoad, dt); break;
    case Phase::NotStarted:
    case Phase::Finished: break;
  }
}

void JobState::stop_credit_at(Time since) {
  // Other events may have credited training past the stall before anyone knew of it (a live master
  // hears of a dead trainer a moment late). At full speed that credit is exactly the time: take it
  // back, so the stall-to-notice time is all the caller's.
  if (since < accrued_to_ && since >= full_speed_since_) {
    const Duration back = accrued_to_ - since;
    take_back_progress(progress_ - std::min(back, progress_));
    // The slots are held throughout (a change would have broken full speed); warm spares may have
    // come and gone meanwhile: their time is taken back change by change.
    double spare_ns = 0;
    Time hi = accrued_to_;
    int32_t count = spares_held_;
    for (auto it = spare_changes_.rbegin(); it != spare_changes_.rend() && it->first > since; ++it) {
      spare_ns += static_cast<double>(hi - std::min(hi, it->first)) * count;
      hi = std::min(hi, it->first);
      count = it->second;
    }
    spare_ns += static_cast<double>(hi - since) * count;
    accel_held_ -= (static_cast<double>(back) * held_count_ + spare_ns) * job_.accelerators_per_node;
    accrued_to_ = since;
  }
  accrue(std::clamp(since, accrued_to_, now_));
}

void JobState::apply(const Event& e) {
  last_seq_ = e.seq;
  now_ = std::max(now_, e.time);
  std::visit(
      [&](const auto& p) {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, JobStarted>) {
          if (started_) {  // a second start (resumed master) changes nothing but the clock
            accrue(now_);
            return;
          }
          job_ = p;
          costs_ = CheckpointCosts::from(p);
          started_ = true;
          start_ = accrued_to_ = now_ = e.time;
          world_size_ = target_nodes_ = p.nodes;
        } else if constexpr (std::is_same_v<T, FailureObserved>) {
          if (stage_ == Stage::Training && !stalled_) {
            // Progress stopped at stalled_since; the rest until now is detection latency.
            stop_credit_at(p.stalled_since);
            const Duration detection = now_ - accrued_to_;
            accel_held_ += static_cast<double>(detection) * (held_count_ + spares_held_) * job_.accelerators_per_node;
            add_loss(Loss::Detection, detection);
            accrued_to_ = now_;
          } else {
            accrue(now_);
          }
          ++failures_;
          ++failures_since_checkpoint_;
          if (p.kind == FailureKind::ProcessExit && !trained_since_restart_) {
            std::string sig = std::to_string(p.exit_code) + "/" + std::to_string(p.signal) + "/" + p.reason.substr(0, 256);
            startup_repeats_ = sig == startup_signature_ ? startup_repeats_ + 1 : 1;
            startup_signature_ = std::move(sig);
          } else {
            startup_repeats_ = 0;
            startup_signature_.clear();
          }
          last_failure_kind_ = p.kind;
          if (p.node >= 0) {
            ++node_failures_[p.node];
            auto& times = recent_failures_[p.node];
            if (times.size() >= kRecentFailures) times.erase(times.begin());
            times.push_back(now_);
          }
          stage_ = Stage::None;
        } else if constexpr (std::is_same_v<T, StallObserved>) {
          if (stage_ == Stage::Training) {
            if (!stalled_) stop_credit_at(p.stalled_since);
            stalled_ = true;  // from the stall to now: stall
            accrue(now_);
            stalled_ = !p.resumed;
          } else {
            accrue(now_);
          }
        } else if constexpr (std::is_same_v<T, CheckpointSaved>) {
          const Duration blocking =
              std::clamp<Duration>(p.blocking * std::max<int64_t>(p.count, 1), 0, now_ - accrued_to_);
          accrue(now_ - blocking);
          accel_held_ += static_cast<double>(blocking) * (held_count_ + spares_held_) * job_.accelerators_per_node;
          add_loss(Loss::CheckpointSave, blocking);
          accrued_to_ = now_;
          checkpoints_.on_saved(p, progress_);
          saved_[static_cast<size_t>(p.tier)] += std::max<int64_t>(p.count, 1);
          failures_since_checkpoint_ = 0;
        } else {
          accrue(now_);
          if constexpr (std::is_same_v<T, SparesHeld>) {
            // Kept while training at full speed, for stop_credit_at; older changes are never needed.
            std::erase_if(spare_changes_, [&](const auto& c) { return c.first < full_speed_since_; });
            if (spare_changes_.size() >= 4096) spare_changes_.erase(spare_changes_.begin());
            if (full_speed_since_ != kNever) spare_changes_.emplace_back(now_, spares_held_);
            spares_held_ = std::max(p.held, 0);
          } else if constexpr (std::is_same_v<T, NodeJoined>) {
            set_held(p.node, true, p.slot);
            // A machine for that slot (or, for a spare, for the first slot that has none).
            if (p.slot >= 0) no_machine_.erase(p.slot);
            else if (!no_machine_.empty()) no_machine_.erase(no_machine_.begin());
          } else if constexpr (std::is_same_v<T, NodeReturned>) {
            // A repaired machine in the free pool goes to the first slot that has none (one that
            // still holds its slot came back before anyone replaced it: no new capacity).
            if (!holds(p.node) && !no_machine_.empty()) no_machine_.erase(no_machine_.begin());
          } else if constexpr (std::is_same_v<T, NoSpareNode>) {
            if (p.slot >= 0) no_machine_.insert(p.slot);
          } else if constexpr (std::is_same_v<T, SlowdownObserved>) {
            if (p.node >= 0) {
              if (p.slowdown_permille > 1000) slowdown_[p.node] = p.slowdown_permille;
              else slowdown_.erase(p.node);
              recompute_slowdown();
            }
          } else if constexpr (std::is_same_v<T, ProcessesStarted>) {
            stage_ = Stage::Rendezvous;
          } else if constexpr (std::is_same_v<T, RendezvousComplete>) {
            stage_ = Stage::Load;
          } else if constexpr (std::is_same_v<T, CheckpointLoaded>) {
            const Duration target = checkpoints_.progress_of(p.step, p.tier, progress_, job_.step_time);
            add_loss(Loss::Recompute, progress_ - target);
            take_back_progress(target);
            checkpoints_.on_loaded(p.step, p.tier);
            ++restores_[static_cast<size_t>(p.tier)];
            stage_ = Stage::Training;
            trained_since_restart_ = true;
            startup_repeats_ = 0;
            startup_signature_.clear();
          } else if constexpr (std::is_same_v<T, ReplicaStored>) {
            checkpoints_.on_replicated(p.step, ReplicaPlacement::from(plan_, target_nodes_), vacant_slot_set());
            replicated_ += std::max<int64_t>(p.count, 1);
          } else if constexpr (std::is_same_v<T, CheckpointPersisted>) {
            checkpoints_.on_persisted(p.step);
            persisted_ += std::max<int64_t>(p.count, 1);
          } else if constexpr (std::is_same_v<T, JobFinished>) {
            if (p.in_recovery) {
              // Progress since the restore point was lost at the failure, loaded or not.
              const Duration target = checkpoints_.progress_of(p.restore_step, p.restore_tier, progress_, job_.step_time);
              add_loss(Loss::Recompute, progress_ - target);
              take_back_progress(target);
            }
            finished_ = true;
            finish_reason_ = p.reason;
          } else if constexpr (std::is_same_v<T, RecoveryDecided>) {
            ++by_diagnosis_[static_cast<size_t>(p.diagnosis)];
            ++by_action_[static_cast<size_t>(p.action)];
            last_backoff_ = p.backoff;
            if (p.action == RecoveryAction::RelaunchNode || p.action == RecoveryAction::RelaunchWithMoreMemory) {
              const int32_t slot = set_held(p.node, false);
              // A lost node takes its host memory along; any other leaves with its agent alive.
              if (p.diagnosis != Diagnosis::Straggler && last_failure_kind_ == FailureKind::NodeLost)
                checkpoints_.on_node_lost(slot);
              else checkpoints_.on_memory_persisted_on_exit(slot);
              stage_ = Stage::None;  // a planned replacement (a straggler) stops training too
            } else if (p.action == RecoveryAction::GiveUp && !gave_up_) {
              gave_up_ = true;
              gave_up_at_ = now_;
              gave_up_rule_ = p.rule;
            }
          } else if constexpr (std::is_same_v<T, CheckpointPlanSet>) {
            plan_ = p;
          } else if constexpr (std::is_same_v<T, CheckRequested>) {
            if (!p.waiting) stage_ = Stage::None;  // the trainers stop for the check; the job restarts after it
          } else if constexpr (std::is_same_v<T, ScaleDecided>) {
            world_size_ = p.to;
            if (!p.group.empty()) {
              // The target itself changed, and ranks move: every rank's memory checkpoint is laid
              // out for the old world, so the restart restores from storage.
              const int64_t target = int64_t{target_nodes_} + p.to - p.from;  // a log may hold any values
              target_nodes_ = static_cast<int32_t>(std::clamp<int64_t>(target, 0, INT32_MAX));
              for (NodeId n : p.released) set_held(n, false);
              checkpoints_.on_memory_lost();
              // Slots are laid out anew; the backend reports again the ones that still have no machine.
              no_machine_.clear();
            }
            ++scale_changes_;
            stage_ = Stage::None;
          } else if constexpr (std::is_same_v<T, RestartJob>) {
            stage_ = Stage::Restart;
            restart_ = p;
            trained_since_restart_ = false;
            training_world_ = p.world_size;
            ++restart_jobs_;
            last_backoff_ = 0;
          }
        }
      },
      e.payload);
  if (stage_ != Stage::Training) {
    stalled_ = false;               // a restart ends any stall
    full_speed_since_ = kNever;     // and a training run: progress from before it is never taken back
  }
}

}  // namespace goodput
