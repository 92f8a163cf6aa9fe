#include <mutex>

#include "agent/checkpoint/flash_checkpoint.h"

namespace goodput::ckpt {

AsyncPersister::AsyncPersister(FlashCheckpoint& c, std::function<void(const std::string&)> on_error)
    : ckpt_(c), on_error_(std::move(on_error)), thread_([this] { loop(); }) {}

AsyncPersister::~AsyncPersister() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void AsyncPersister::request() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = true;  // several requests while one write runs become one more write
  }
  cv_.notify_all();
}

void AsyncPersister::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !pending_ && !running_; });
}

std::string AsyncPersister::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

void AsyncPersister::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || pending_; });
    if (stop_ && !pending_) return;
    pending_ = false;
    running_ = true;
    lock.unlock();
    std::string error;
    try {
      const PersistStats s = ckpt_.persist();
      if (s.written) {
        persisted_step_ = s.step;
        ++writes_;
      }
    } catch (const std::exception& e) {
      error = std::string("persist failed: ") + e.what();
      if (on_error_) on_error_(error);
    }
    lock.lock();
    if (!error.empty()) last_error_ = error;
    running_ = false;
    cv_.notify_all();
  }
}

}  // namespace goodput::ckpt
