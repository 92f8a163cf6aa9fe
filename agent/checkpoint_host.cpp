#include "agent/checkpoint_host.h"

#include <iostream>
#include <utility>

namespace goodput::agent {

void CheckpointHost::loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || wanted_ || reserve_ > 0; });
    if (stop_) return;
    if (reserve_ > 0 && options_) {
      const uint64_t bytes = std::exchange(reserve_, 0);
      ckpt::FlashCheckpoint c(*options_);
      busy_ = true;
      lock.unlock();
      try {
        const uint64_t got = c.reserve(bytes);
        std::cerr << "agent: " << (got ? "reserved " + std::to_string(got >> 20) + " MiB of shared memory for "
                                        : std::string("cannot allocate shared memory ahead for "))
                  << c.shm_name(0) << " and " << c.shm_name(1) << std::endl;
      } catch (const std::exception& e) {
        std::cerr << "agent: reserving shared memory failed (the first save allocates it): " << e.what() << std::endl;
      }
      lock.lock();
      busy_ = false;
      cv_.notify_all();
      continue;
    }
    reserve_ = 0;
    wanted_ = false;
    if (!options_ || options_->storage_dir.empty()) {
      cv_.notify_all();
      continue;
    }
    busy_ = true;
    if (!ckpt_) ckpt_ = std::make_shared<ckpt::FlashCheckpoint>(*options_);
    // Our own reference: configure() may swap in the next restart's checkpoint meanwhile (a
    // persist-on-exit still running when the new trainer starts), and this one must live on.
    const std::shared_ptr<ckpt::FlashCheckpoint> held = ckpt_;
    ckpt::FlashCheckpoint& c = *held;
    lock.unlock();
    std::vector<int64_t> steps;
    std::string error;
    try {
      c.persist();
    } catch (const std::exception& e) {
      error = e.what();
      std::cerr << "agent: persist failed: " << error << std::endl;
    }
    try {
      steps = c.storage_steps();
    } catch (const std::exception&) {
    }
    lock.lock();
    if (held == ckpt_) steps_ = steps;  // else a listing of the previous restart's: configure() asked anew
    error_ = error;
    busy_ = false;
    cv_.notify_all();
  }
}

void CheckpointHost::replicate_loop() {
  std::unique_lock lock(mu_);
  std::shared_ptr<ckpt::FlashCheckpoint> source;  // our own: newest_copy keeps a buffer per object
  std::optional<ckpt::Options> source_options;
  while (true) {
    cv_.wait(lock, [&] { return stop_ || (replicate_wanted_ && options_ && !replication_.holders.empty()); });
    if (stop_) return;
    replicate_wanted_ = false;
    const Replication r = replication_;
    if (!source || source_options->rank != options_->rank || source_options->shm_prefix != options_->shm_prefix ||
        source_options->world_size != options_->world_size) {
      source_options = options_;
      source = std::make_shared<ckpt::FlashCheckpoint>(*options_);
    }
    const std::shared_ptr<ckpt::FlashCheckpoint> held = source;
    lock.unlock();
    std::string error;
    std::vector<std::pair<std::pair<std::string, uint16_t>, int64_t>> took;
    try {
      if (const std::optional<ckpt::Loaded> image = held->newest_copy()) {
        for (const auto& h : r.holders) {
          {
            std::lock_guard check(mu_);
            if (auto it = sent_.find(h); it != sent_.end() && it->second >= image->manifest.step) continue;
          }
          try {
            send_replica(*image, r.key, h.first, h.second, r.token, r.bytes_per_s, std::chrono::seconds(30));
            took.emplace_back(h, image->manifest.step);
          } catch (const std::exception& e) {
            error = "copy of step " + std::to_string(image->manifest.step) + " to " + h.first + ":" +
                    std::to_string(h.second) + ": " + e.what();
            std::cerr << "agent: replica " << error << std::endl;
          }
        }
      }
    } catch (const std::exception& e) {
      error = std::string("replica: ") + e.what();
      std::cerr << "agent: " << error << std::endl;
    }
    lock.lock();
    if (held == source && source_options && options_ && source_options->rank == options_->rank)
      for (const auto& [h, step] : took) sent_[h] = std::max(sent_[h], step);
    replica_error_ = error;
  }
}

}  // namespace goodput::agent
