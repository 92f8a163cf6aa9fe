// Time comes from a Clock: the simulator's is virtual (moved by its event loop), the live master's
// reads a monotonic clock (backends/). Engine code never asks the OS for the time.
#pragma once

#include <cassert>
#include <stdexcept>

#include "engine/time.h"

namespace goodput {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual Time now() const = 0;
};

class VirtualClock final : public Clock {
 public:
  Time now() const override { return now_; }
  // Time never goes backwards; a caller that tries has a bug.
  void advance_to(Time t) {
    if (t < now_) throw std::logic_error("virtual clock moved backwards");
    now_ = t;
  }

 private:
  Time now_ = 0;
};

}  // namespace goodput
