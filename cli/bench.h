#pragma once

#include <string>

namespace goodput {

struct BenchOptions {
  std::string trace_path = "traces/llama3-405b-54d.jsonl";
  int runs = 2000;
  int threads = 0;
};

// Prints each figure with its same-run baseline; returns an exit code.
int run_bench(const BenchOptions& options);

}  // namespace goodput
