#include "backends/live/live_clock.h"

#include <algorithm>
#include <ctime>

namespace goodput::live {

namespace {
int64_t clock_ns(clockid_t id) {
  timespec ts{};
  ::clock_gettime(id, &ts);
  return static_cast<int64_t>(ts.tv_sec) * kSecond + ts.tv_nsec;
}
}  // namespace

int64_t LiveClock::unix_now_ns() { return clock_ns(CLOCK_REALTIME); }

LiveClock::LiveClock(int64_t epoch_unix_ns, Time not_before)
    : base_(std::max(unix_now_ns() - epoch_unix_ns, not_before)), mono_start_(clock_ns(CLOCK_MONOTONIC)) {}

Time LiveClock::now() const { return base_ + (clock_ns(CLOCK_MONOTONIC) - mono_start_); }

}  // namespace goodput::live
