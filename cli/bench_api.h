#pragma once

#include <cstdint>

namespace goodput {

struct ApiBenchOptions {
  int agents = 2000;
  double seconds = 60;
};

// `goodput bench api`: simulated agents against a real master; returns an exit code.
int run_api_bench(const ApiBenchOptions& options);

}  // namespace goodput

namespace goodput {

struct CrashBenchOptions {
  int kills = 100;
  int agents = 4;
  int64_t steps = 400;
  uint64_t seed = 1;
};

// `goodput bench crash`: SIGKILL the master at random moments under load; returns an exit code
// (0: every acknowledged event is in the log and the job completed).
int run_crash_bench(const CrashBenchOptions& options);

}  // namespace goodput
