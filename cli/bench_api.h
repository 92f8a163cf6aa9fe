#pragma once

#include <cstdint>
#include <string>

namespace goodput {

struct ApiBenchOptions {
  int agents = 2000;
  double seconds = 60;
  // A mass failure: this many agents fall silent at once (a zone lost) a third of the way in, and
  // as many replacements register once the master has noticed them all (0: none).
  int fail = 0;
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

// For both benchmarks: `goodput master DIR/job.json --run-dir DIR/run` as a child process with
// GOODPUT_TOKEN=token, and its URL once it listens ("" if it did not start within 10 s).
int spawn_master(const std::string& dir, const std::string& token, bool resume);
std::string wait_for_master_url(const std::string& dir);

// `goodput bench crash`: SIGKILL the master at random moments under load; returns an exit code
// (0: every acknowledged event is in the log and the job completed).
int run_crash_bench(const CrashBenchOptions& options);

}  // namespace goodput
