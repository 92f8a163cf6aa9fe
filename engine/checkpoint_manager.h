// The logical checkpoint manager: which checkpoint exists in host memory, which one reached
// storage, and what saving, persisting and loading cost under the job's cost model. The simulator
// and the live master consult the same object; the real bytes live in the flash-checkpoint library.
#pragma once

#include <array>
#include <cstdint>

#include "engine/event.h"

namespace goodput {

struct CheckpointCosts {
  int64_t bytes_per_node = 0;
  int64_t memory_bandwidth_bytes_per_s = 0;
  int64_t storage_bandwidth_bytes_per_s = 0;

  static CheckpointCosts from(const JobStarted& job) {
    return {job.checkpoint_bytes_per_node, job.memory_bandwidth_bytes_per_s, job.storage_bandwidth_bytes_per_s};
  }
  // Nodes save their shards in parallel, so each cost is one node's bytes over one node's bandwidth.
  Duration save(Tier tier) const { return tier == Tier::None ? 0 : transfer(tier); }
  Duration load(Tier tier) const { return tier == Tier::None ? 0 : transfer(tier); }
  Duration persist() const { return transfer(Tier::Storage); }

 private:
  Duration transfer(Tier tier) const {
    const int64_t bw = tier == Tier::Memory ? memory_bandwidth_bytes_per_s : storage_bandwidth_bytes_per_s;
    if (bw <= 0 || bytes_per_node <= 0) return 0;
    return static_cast<Duration>((static_cast<__int128>(bytes_per_node) * kSecond + bw - 1) / bw);
  }
};

// A checkpoint as the accounting sees it: its step and the job's kept progress when it was taken.
struct CheckpointRef {
  int64_t step = 0;
  Duration progress = 0;  // full-job training ns covered by this checkpoint
  bool valid = false;
};

class CheckpointManager {
 public:
  void on_saved(const CheckpointSaved& s, Duration progress);
  void on_persisted(int64_t step);
  // A node's host memory is gone (relaunch): memory checkpoints are incomplete across ranks.
  void on_memory_lost() { memory_.valid = false; }  // its step and progress still anchor older steps
  // A node leaves with its agent alive (a crashed or hung trainer, a planned replacement): the
  // agent persists the newest memory checkpoint before it goes, so storage has that step.
  void on_memory_persisted_on_exit() {
    if (memory_.valid && (!storage_.valid || storage_.step < memory_.step)) storage_ = memory_;
    memory_.valid = false;
  }

  const CheckpointRef& newest_in_memory() const { return memory_; }
  const CheckpointRef& newest_in_storage() const { return storage_; }
  // The checkpoint a restart should load: memory if allowed and valid, else storage, else scratch.
  struct Restore {
    int64_t step = 0;
    Tier tier = Tier::None;
  };
  Restore best_restore(bool allow_memory) const;
  // The kept progress that loading `step` from `tier` returns the job to.
  Duration progress_of(int64_t step, Tier tier, Duration current_progress, Duration step_time) const;

 private:
  CheckpointRef memory_;
  CheckpointRef storage_;
  // Memory checkpoints on their way to storage (persist is asynchronous; a few may be in flight).
  std::array<CheckpointRef, 8> in_flight_{};
  size_t next_in_flight_ = 0;
};

}  // namespace goodput
