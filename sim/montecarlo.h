// Many independent runs of the simulator, spread over threads. Run i always uses seed + i and its
// result always lands in slot i, so the output does not depend on the number of threads.
#pragma once

#include <functional>
#include <vector>

#include "report/report.h"
#include "sim/simulator.h"

namespace goodput {

struct MonteCarloOptions {
  uint64_t seed = 1;
  int runs = 1;
  int threads = 0;  // 0: all hardware threads
  bool resample = true;
  // Called now and then from worker threads with (runs done, runs total); may be empty.
  std::function<void(int, int)> progress;
};

std::vector<Report> run_monte_carlo(const Trace& trace, const PolicySet& policy, const MonteCarloOptions& options);

// The optimum checkpoint interval for this trace and tier, with MTBF from the trace's failure rates
// over the job's nodes: Daly's higher-order formula (daly_interval), or Young's first-order one.
// 0 if the trace has no rates.
struct CheckpointOptimum {
  Duration daly = 0;
  Duration young = 0;
};
CheckpointOptimum optimum_checkpoint_interval(const Trace& trace, Tier tier);

}  // namespace goodput
