#include "engine/checkpoint_manager.h"

#include <algorithm>

namespace goodput {

ReplicaPlacement ReplicaPlacement::from(const CheckpointPlanSet& plan, int32_t world) {
  return {plan.tier == Tier::Memory ? std::max(plan.replicas, 0) : 0, plan.placement == "groups", std::max(world, 0)};
}

int32_t ReplicaPlacement::copies_sent() const {
  if (replicas <= 0 || world <= 1) return 0;
  if (!groups) return std::min(replicas, world - 1);
  const int32_t size = replicas + 1;
  if (world < size) return world - 1;
  return world - (world / size - 1) * size - 1;  // the last group is the largest
}

void CheckpointManager::on_saved(const CheckpointSaved& s, Duration progress) {
  const CheckpointRef ref{s.step, progress, true};
  if (s.tier == Tier::Storage) {
    storage_ = ref;
    return;
  }
  memory_ = ref;
  if (s.persist) {
    in_flight_[next_in_flight_] = ref;
    next_in_flight_ = (next_in_flight_ + 1) % in_flight_.size();
  }
  if (s.replicate) replicating_ = ref;
}

void CheckpointManager::on_replicated(int64_t step, const ReplicaPlacement& placement, const std::set<int32_t>& vacant) {
  if (peers_.valid && peers_.step > step) return;
  // Copies of an older save of a batch: its progress follows from the newest save (progress_of).
  peers_ = replicating_.valid && replicating_.step == step ? replicating_
           : memory_.step == step                          ? memory_
                                                           : CheckpointRef{step, -1, true};
  if (replicating_.step <= step) replicating_.valid = false;
  placement_ = placement;
  needing_.clear();
  gone_ = vacant;
}

void CheckpointManager::on_node_lost(int32_t slot) {
  memory_.valid = false;
  replicating_.valid = false;  // its copies were on their way through the lost node too
  if (!peers_.valid) return;
  if (slot < 0 || slot >= placement_.world) {
    peers_.valid = false;  // whose copies it held is unknown
    return;
  }
  needing_.insert(slot);
  gone_.insert(slot);
  // Every rank without its own copy needs a holder that is still there.
  for (int32_t s : needing_) {
    bool held = false;
    placement_.for_each_holder(s, [&](int32_t h) { held = held || !gone_.contains(h); });
    if (!held) {
      peers_.valid = false;
      return;
    }
  }
}

void CheckpointManager::on_loaded(int64_t step, Tier tier) {
  if (tier == Tier::Peer && peers_.valid && peers_.step == step) {
    memory_ = peers_;  // the relaunched nodes fetched theirs; the others had it
    needing_.clear();
  } else if (step < peers_.step) {
    peers_.valid = false;
  }
}

void CheckpointManager::on_persisted(int64_t step) {
  for (CheckpointRef& r : in_flight_) {
    if (r.valid && r.step == step) {
      if (!storage_.valid || storage_.step <= step) storage_ = r;
      r.valid = false;
      return;
    }
  }
  // Unknown to us (e.g. a log that starts mid-job): storage holds it, progress unknown -> by steps.
  if (!storage_.valid || storage_.step < step) storage_ = CheckpointRef{step, -1, true};
}

CheckpointManager::Restore CheckpointManager::best_restore(bool allow_memory) const {
  if (allow_memory && memory_.valid && (!storage_.valid || memory_.step >= storage_.step))
    return {memory_.step, Tier::Memory};
  if (allow_memory && peers_.valid && (!storage_.valid || peers_.step >= storage_.step))
    return {peers_.step, Tier::Peer};
  if (storage_.valid) return {storage_.step, Tier::Storage};
  return {0, Tier::None};
}

Duration CheckpointManager::progress_of(int64_t step, Tier tier, Duration current, Duration step_time) const {
  if (tier == Tier::None || step == 0) return 0;
  const CheckpointRef& r = tier == Tier::Memory ? memory_ : tier == Tier::Peer ? peers_ : storage_;
  if (r.step == step && r.progress >= 0) return std::min(r.progress, current);
  for (const CheckpointRef& f : in_flight_)
    if (f.step == step && f.progress >= 0) return std::min(f.progress, current);
  // An older step of a batch of periodic saves: whole steps before the newest save we know.
  if (memory_.progress >= 0 && memory_.step >= step && (memory_.valid || memory_.step > 0))
    return std::clamp<Duration>(memory_.progress - (memory_.step - step) * step_time, 0, current);
  return std::min(current, step * step_time);
}

}  // namespace goodput
