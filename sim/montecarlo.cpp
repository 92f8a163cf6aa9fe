#include "sim/montecarlo.h"
#include "policies/policy.h"

#include <atomic>
#include <exception>
#include <mutex>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <thread>

namespace goodput {

namespace {

// Each run builds and drops a few hundred KiB of vectors (its failures, queue and slots). With
// glibc's defaults those come from mmap and go back with munmap every run, and the page faults and
// TLB flushes cost a third of a run. Keeping freed memory in the process makes runs ~1.4x faster;
// the memory held is bounded by one run per thread.
void keep_freed_memory() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
#endif
}

}  // namespace

std::vector<Report> run_monte_carlo(const Trace& trace, const PolicySet& policy, const MonteCarloOptions& o) {
  keep_freed_memory();
  const int runs = std::max(0, o.runs);
  std::vector<Report> out(static_cast<size_t>(runs));
  int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min(threads, std::max(runs, 1));
  std::atomic<int> next{0}, done{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    for (int i = next++; i < runs; i = next++) {
      try {
        SimOptions so;
        so.seed = o.seed + static_cast<uint64_t>(i);
        so.resample = o.resample && !trace.rates.empty();
        out[static_cast<size_t>(i)] = make_report(simulate(trace, policy, so));
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        next = runs;
      }
      const int d = ++done;
      if (o.progress) o.progress(d, runs);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return out;
}

CheckpointOptimum optimum_checkpoint_interval(const Trace& trace, Tier tier) {
  double per_hour = 0;
  for (const FailureRate& r : trace.rates) per_hour += r.per_node_hour * trace.cluster.nodes;
  if (per_hour <= 0) return {};
  const auto mtbf = static_cast<Duration>(static_cast<double>(kHour) / per_hour);
  const CheckpointCosts costs{trace.job.checkpoint_bytes_per_node, trace.job.memory_bandwidth_bytes_per_s,
                              trace.job.storage_bandwidth_bytes_per_s};
  return {daly_interval(costs.save(tier), mtbf), young_interval(costs.save(tier), mtbf)};
}

}  // namespace goodput
