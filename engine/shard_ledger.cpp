#include "engine/shard_ledger.h"

#include <string>
#include <type_traits>

#include "engine/invariant.h"

namespace goodput {

void ShardLedger::reset(int64_t shards) {
  state_.assign(static_cast<size_t>(std::max<int64_t>(shards, 0)), Shard{});
  queued_.clear();
  for (int64_t i = 0; i < total(); ++i) queued_.insert(queued_.end(), i);
  done_ = duplicates_ = rejected_ = 0;
  generation_ = 0;
}

std::optional<int64_t> ShardLedger::next_queued() const {
  if (queued_.empty()) return std::nullopt;
  return *queued_.begin();
}

bool ShardLedger::assigned_to(int64_t shard, NodeId node) const {
  return shard >= 0 && shard < total() && !state_[shard].done && state_[shard].state == node;
}

bool ShardLedger::done_by(int64_t shard, NodeId node) const {
  return shard >= 0 && shard < total() && state_[shard].done && state_[shard].state == node;
}

void ShardLedger::requeue(int64_t i) {
  Shard& s = state_[i];
  if (s.done) --done_;
  s = Shard{};
  queued_.insert(i);
}

void ShardLedger::apply(const Event& e) {
  std::visit(
      [&](const auto& p) {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, ShardsAssigned>) {
          for (int64_t i : p.shards) {
            if (i < 0 || i >= total() || state_[i].done) continue;
            queued_.erase(i);
            state_[i].state = p.node;
          }
        } else if constexpr (std::is_same_v<T, ShardsCompleted>) {
          for (int64_t i : p.shards) {
            if (i < 0 || i >= total()) {
              ++rejected_;
              continue;
            }
            Shard& s = state_[i];
            if (s.done) {
              ++duplicates_;
            } else if (s.state != p.node) {
              ++rejected_;
              continue;
            } else {
              ++done_;
            }
            s.done = true;
            s.state = p.node;
            s.step = p.step;
            s.generation = generation_;
          }
        } else if constexpr (std::is_same_v<T, RestartJob>) {
          // Trainers restart: whatever they held and did not finish goes back to the queue.
          ++generation_;
          for (int64_t i = 0; i < total(); ++i)
            if (!state_[i].done && state_[i].state != kQueued) requeue(i);
        } else if constexpr (std::is_same_v<T, CheckpointLoaded>) {
          // Work done before this restart after the loaded step is gone from the model: do it
          // again. Not the restart's own: the world trains on from the loaded step as soon as every
          // rank loaded it, and a late report may get this event logged after its first saves.
          for (int64_t i = 0; i < total(); ++i)
            if (state_[i].done && state_[i].step > p.step && state_[i].generation < generation_) requeue(i);
        }
      },
      e.payload);
  GOODPUT_INVARIANT(done_ >= 0 && done_ <= total() && static_cast<int64_t>(queued_.size()) + done_ <= total(),
                    std::to_string(done_) + " done and " + std::to_string(queued_.size()) + " queued of " + std::to_string(total()));
}

}  // namespace goodput
