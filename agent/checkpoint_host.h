// Checkpoint hosting on a node: the agent's side of the flash checkpoint. It persists the rank's
// committed memory checkpoints to storage on a thread of its own (requests collapse, training never
// waits), allocates the shared memory of a new checkpoint ahead of its first save, lists what
// storage holds for the heartbeat, and frees the node's host memory when the agent leaves.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/checkpoint/flash_checkpoint.h"

namespace goodput::agent {

class CheckpointHost {
 public:
  CheckpointHost() : thread_([this] { loop(); }) {}
  ~CheckpointHost() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // The checkpoint identity of the running trainer (rank and world change between restarts).
  void configure(const ckpt::Options& o) {
    std::lock_guard lock(mu_);
    // A new rank (a replica group was scaled and ranks moved): what the old rank's memory holds
    // belongs to another layout, and a later trainer given that rank number must not load it.
    if (options_ && options_->rank != o.rank) ckpt::FlashCheckpoint(*options_).remove_memory();
    options_ = o;
    ckpt_.reset();
    steps_.clear();
    wanted_ = true;  // refresh the storage listing
    cv_.notify_all();
  }
  void request() {
    std::lock_guard lock(mu_);
    wanted_ = true;
    cv_.notify_all();
  }
  // Allocate the shared memory of the configured rank's checkpoints ahead of its first save.
  void reserve(uint64_t data_bytes) {
    std::lock_guard lock(mu_);
    reserve_ = data_bytes;
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !wanted_ && !busy_ && reserve_ == 0; });
  }
  std::vector<int64_t> storage_steps() {
    std::lock_guard lock(mu_);
    return steps_;
  }
  // Why the newest persist failed; empty once one succeeds.
  std::string error() {
    std::lock_guard lock(mu_);
    return error_;
  }
  void remove_memory() {
    std::lock_guard lock(mu_);
    if (options_) ckpt::FlashCheckpoint(*options_).remove_memory();
  }

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<ckpt::Options> options_;
  uint64_t reserve_ = 0;  // bytes to reserve for the configured rank, 0: nothing asked
  std::shared_ptr<ckpt::FlashCheckpoint> ckpt_;
  std::string error_;
  std::vector<int64_t> steps_;
  bool wanted_ = false, busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace goodput::agent
