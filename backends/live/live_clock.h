// The live master's clock (the one place the live side reads the OS's clocks for the engine).
#pragma once

#include <cstdint>

#include "engine/clock.h"

namespace goodput::live {

// The master's clock: nanoseconds since the job started, from the log's epoch (wall clock, read
// once when the master starts) plus a monotonic clock, so later wall-clock jumps change nothing.
class LiveClock final : public Clock {
 public:
  explicit LiveClock(int64_t epoch_unix_ns, Time not_before = 0);
  Time now() const override;
  static int64_t unix_now_ns();

 private:
  Time base_ = 0;
  int64_t mono_start_ = 0;
};

}  // namespace goodput::live
