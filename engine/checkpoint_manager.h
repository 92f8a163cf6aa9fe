// The logical checkpoint manager: which checkpoint exists in host memory, which one reached
// storage, and what saving, persisting and loading cost under the job's cost model. The simulator
// and the live master consult the same object; the real bytes live in the flash-checkpoint library.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <set>

#include "engine/event.h"

namespace goodput {

struct CheckpointCosts {
  int64_t bytes_per_node = 0;
  int64_t memory_bandwidth_bytes_per_s = 0;
  int64_t storage_bandwidth_bytes_per_s = 0;
  int64_t network_bandwidth_bytes_per_s = 0;

  static CheckpointCosts from(const JobStarted& job) {
    return {job.checkpoint_bytes_per_node, job.memory_bandwidth_bytes_per_s, job.storage_bandwidth_bytes_per_s,
            job.network_bandwidth_bytes_per_s};
  }
  // Nodes save their shards in parallel, so each cost is one node's bytes over one node's bandwidth.
  // A restore from a peer is the relaunched node's fetch over the network (the others load from
  // their own memory meanwhile).
  Duration save(Tier tier) const { return tier == Tier::None ? 0 : transfer(tier, 1); }
  Duration load(Tier tier) const { return tier == Tier::None ? 0 : transfer(tier, 1); }
  Duration persist() const { return transfer(Tier::Storage, 1); }
  // Each node sends `copies` copies of its checkpoint through its own network link.
  Duration replicate(int32_t copies) const { return copies <= 0 ? 0 : transfer(Tier::Peer, copies); }

 private:
  Duration transfer(Tier tier, int64_t copies) const {
    const int64_t bw = tier == Tier::Memory ? memory_bandwidth_bytes_per_s
                       : tier == Tier::Peer ? network_bandwidth_bytes_per_s
                                            : storage_bandwidth_bytes_per_s;
    if (bw <= 0 || bytes_per_node <= 0) return 0;
    return static_cast<Duration>((static_cast<__int128>(bytes_per_node) * copies * kSecond + bw - 1) / bw);
  }
};

// Where the copies of each slot's memory checkpoint live (checkpoint.replicas): "ring" sends slot
// s's to s+1 .. s+k; "groups" cuts the world into groups of k + 1 consecutive slots (the last one
// takes the remainder) whose members hold each other's.
struct ReplicaPlacement {
  int32_t replicas = 0;
  bool groups = false;
  int32_t world = 0;  // slots the copies are spread over

  static ReplicaPlacement from(const CheckpointPlanSet& plan, int32_t world);
  // The slots holding slot s's copies, in order (none without replicas or a world of one).
  template <class F> void for_each_holder(int32_t s, F&& f) const {
    if (replicas <= 0 || world <= 1 || s < 0 || s >= world) return;
    if (!groups) {
      for (int32_t i = 1; i <= replicas && i < world; ++i) f((s + i) % world);
      return;
    }
    const int32_t size = replicas + 1;
    const int32_t count = std::max(1, world / size);
    const int32_t g = std::min(s / size, count - 1);
    const int32_t end = g == count - 1 ? world : (g + 1) * size;
    for (int32_t h = g * size; h < end; ++h)
      if (h != s) f(h);
  }
  // Copies each node sends (what its network link carries after each save).
  int32_t copies_sent() const;
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
  // Every slot's copies of `step` reached their holders under `placement`; `vacant` slots (no
  // node there now) hold no copies.
  void on_replicated(int64_t step, const ReplicaPlacement& placement, const std::set<int32_t>& vacant);
  // Memory checkpoints are laid out for another world (ranks moved): every copy is useless.
  void on_memory_lost() {
    memory_.valid = false;  // its step and progress still anchor older steps
    peers_.valid = false;
  }
  // The node in `slot` left with its host memory (a lost machine): the memory tier is incomplete
  // across ranks, and the copies it held for others are gone. -1: a slot not known.
  void on_node_lost(int32_t slot);
  // A node leaves with its agent alive (a crashed or hung trainer, a planned replacement): the
  // agent persists the newest memory checkpoint before it goes, so storage has that step; the
  // copies it held for other slots go with the machine.
  void on_memory_persisted_on_exit(int32_t slot) {
    if (memory_.valid && (!storage_.valid || storage_.step < memory_.step)) storage_ = memory_;
    on_node_lost(slot);
  }
  // The world restored `step` from `tier`: a peer restore puts that step back in every node's
  // memory; a restore older than the copies starts another history, so the copies are useless.
  void on_loaded(int64_t step, Tier tier);

  const CheckpointRef& newest_in_memory() const { return memory_; }
  const CheckpointRef& newest_in_storage() const { return storage_; }
  // The newest step whose copies in peers can restore every rank (valid: every slot that lost its
  // memory since still has a living holder).
  const CheckpointRef& newest_in_peers() const { return peers_; }
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
  // The peer tier: the newest replicated step, the placement its copies follow, the slots whose
  // own memory lacks it (their rank needs a holder) and the slots that no longer hold copies.
  CheckpointRef peers_;
  CheckpointRef replicating_;  // the save whose copies are on their way
  ReplicaPlacement placement_;
  std::set<int32_t> needing_;
  std::set<int32_t> gone_;
};

}  // namespace goodput
