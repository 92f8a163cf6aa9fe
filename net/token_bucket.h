// A client-side rate limit: a token bucket holding at most `burst` tokens, refilled at `per_second`.
// Each call takes a token; with none left, take() says how long until the next one, so the caller
// waits in its own way (on a condition variable it can be woken from). Not thread-safe by itself:
// callers hold their own lock (ClusterNodes' mutex).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace goodput::net {

class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;

  TokenBucket(double per_second, int32_t burst)
      : per_second_(std::max(per_second, 1e-3)), burst_(std::max(burst, 1)), tokens_(burst_) {}

  // Takes a token at `now` and returns zero, or returns how long until one is there (taking none).
  Clock::duration take(Clock::time_point now) {
    refill(now);
    if (tokens_ >= 1) {
      tokens_ -= 1;
      return Clock::duration::zero();
    }
    const double seconds = (1 - tokens_) / per_second_;
    return std::max(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)),
                    Clock::duration(1));
  }

 private:
  void refill(Clock::time_point now) {
    if (now <= last_) return;  // another thread's earlier `now`
    if (last_ != Clock::time_point{}) {
      const double elapsed = std::chrono::duration<double>(now - last_).count();
      tokens_ = std::min<double>(burst_, tokens_ + elapsed * per_second_);
    }
    last_ = now;
  }

  double per_second_;
  int32_t burst_;
  double tokens_;
  Clock::time_point last_{};
};

}  // namespace goodput::net
