#pragma once

#include <string>
#include <vector>

namespace goodput {

struct BenchOptions {
  std::string trace_path = "traces/llama3-405b-54d.jsonl";
  int runs = 2000;
  int threads = 0;
};

// Prints each figure with its same-run baseline; returns an exit code.
int run_bench(const BenchOptions& options);

// The simulator at the scale of the largest jobs: the trace's failure rates and cost model (the
// Llama 3 trace's by default) on jobs of each size for `days`, replayed with flash+diagnose and no
// failure budget; time per event against the smallest size's (linear growth reads 1.0x), peak
// memory, and Monte Carlo runs of the largest against one thread.
struct SimScaleOptions {
  std::string trace_path = "traces/llama3-405b-54d.jsonl";
  std::vector<int32_t> accelerators = {10'000, 30'000, 100'000};
  double days = 365;
  int runs = 1000;
  int threads = 0;
};
int run_sim_scale_bench(const SimScaleOptions& options);

}  // namespace goodput
