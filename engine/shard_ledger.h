// Dynamic data sharding as a fold over the event log: which shard is queued, with which trainer,
// or done and inside which checkpoint step. A restore to an older checkpoint puts the shards done
// after it back in the queue, so every shard ends up in the model exactly once.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "engine/event.h"

namespace goodput {

class ShardLedger {
 public:
  void reset(int64_t shards);  // all queued
  void apply(const Event& e);  // ShardsAssigned, ShardsCompleted, RestartJob, CheckpointLoaded

  int64_t total() const { return static_cast<int64_t>(state_.size()); }
  std::optional<int64_t> next_queued() const;
  int64_t queued() const { return static_cast<int64_t>(queued_.size()); }
  int64_t done() const { return done_; }
  bool assigned_to(int64_t shard, NodeId node) const;
  bool done_by(int64_t shard, NodeId node) const;
  // Completions of a shard that was already done: each is a shard trained on twice.
  int64_t duplicates() const { return duplicates_; }
  // Completions the ledger refused (unknown shard, or not assigned to that node).
  int64_t rejected() const { return rejected_; }

 private:
  static constexpr int64_t kQueued = -1;
  struct Shard {
    int64_t state = kQueued;  // kQueued, or the node it is assigned to (>= 0), or done
    bool done = false;
    int64_t step = 0;  // done: inside the checkpoint of this step
    int32_t generation = 0;  // done: in the generation-th restart
  };
  void requeue(int64_t i);
  std::vector<Shard> state_;
  std::set<int64_t> queued_;
  int64_t done_ = 0;
  int64_t duplicates_ = 0;
  int64_t rejected_ = 0;
  int32_t generation_ = 0;  // RestartJob events so far
};

}  // namespace goodput
