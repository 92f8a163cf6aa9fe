// Checkpoint hosting on a node: the agent's side of the flash checkpoint. It persists the rank's
// committed memory checkpoints to storage on a thread of its own (requests collapse, training never
// waits), copies each new one to the peers the master names (checkpoint.replicas) on another,
// allocates the shared memory of a new checkpoint ahead of its first save, lists what
// storage holds for the heartbeat, and frees the node's host memory when the agent leaves.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/checkpoint/flash_checkpoint.h"
#include "agent/replica.h"

namespace goodput::agent {

class CheckpointHost {
 public:
  CheckpointHost() : thread_([this] { loop(); }), replica_thread_([this] { replicate_loop(); }) {}
  ~CheckpointHost() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    replica_thread_.join();
  }
  // The checkpoint identity of the running trainer (rank and world change between restarts).
  void configure(const ckpt::Options& o) {
    std::lock_guard lock(mu_);
    // A new rank (a replica group was scaled and ranks moved): what the old rank's memory holds
    // belongs to another layout, and a later trainer given that rank number must not load it.
    if (options_ && options_->rank != o.rank) ckpt::FlashCheckpoint(*options_).remove_memory();
    options_ = o;
    ckpt_.reset();
    sent_.clear();
    steps_.clear();
    wanted_ = true;  // refresh the storage listing
    cv_.notify_all();
  }
  void request() {
    std::lock_guard lock(mu_);
    wanted_ = true;
    cv_.notify_all();
  }

  // Where copies of this rank's memory checkpoints go (checkpoint.replicas), as the master says
  // with each heartbeat: the run's key, the holders' replica servers and the pace.
  struct Replication {
    std::string key, token;
    std::vector<std::pair<std::string, uint16_t>> holders;  // host, port
    double bytes_per_s = 0;                                 // 0: as fast as the link goes
    bool operator==(const Replication&) const = default;
  };
  void replicate_to(const Replication& r) {
    std::lock_guard lock(mu_);
    if (r == replication_) return;
    replication_ = r;
    replicate_wanted_ = !r.holders.empty();  // a new holder gets the newest copy now
    cv_.notify_all();
  }
  // A new memory checkpoint was committed: copy it to the holders.
  void replicate() {
    std::lock_guard lock(mu_);
    replicate_wanted_ = true;
    cv_.notify_all();
  }
  // Why the newest copy to a holder failed; empty once every holder has the newest.
  std::string replica_error() {
    std::lock_guard lock(mu_);
    return replica_error_;
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
  void replicate_loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<ckpt::Options> options_;
  uint64_t reserve_ = 0;  // bytes to reserve for the configured rank, 0: nothing asked
  std::shared_ptr<ckpt::FlashCheckpoint> ckpt_;
  std::string error_;
  std::vector<int64_t> steps_;
  bool wanted_ = false, busy_ = false, stop_ = false;
  Replication replication_;
  bool replicate_wanted_ = false;
  std::map<std::pair<std::string, uint16_t>, int64_t> sent_;  // holder -> newest step it took
  std::string replica_error_;
  std::thread thread_, replica_thread_;
};

}  // namespace goodput::agent
