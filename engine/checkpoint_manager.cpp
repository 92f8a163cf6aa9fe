#include "engine/checkpoint_manager.h"

#include <algorithm>

namespace goodput {

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
  if (storage_.valid) return {storage_.step, Tier::Storage};
  return {0, Tier::None};
}

Duration CheckpointManager::progress_of(int64_t step, Tier tier, Duration current, Duration step_time) const {
  if (tier == Tier::None || step == 0) return 0;
  const CheckpointRef& r = tier == Tier::Memory ? memory_ : storage_;
  if (r.step == step && r.progress >= 0) return std::min(r.progress, current);
  for (const CheckpointRef& f : in_flight_)
    if (f.step == step && f.progress >= 0) return std::min(f.progress, current);
  // An older step of a batch of periodic saves: whole steps before the newest save we know.
  if (memory_.progress >= 0 && memory_.step >= step && (memory_.valid || memory_.step > 0))
    return std::clamp<Duration>(memory_.progress - (memory_.step - step) * step_time, 0, current);
  return std::min(current, step * step_time);
}

}  // namespace goodput
