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

}  // namespace goodput::agent
