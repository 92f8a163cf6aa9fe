// Benchmarks print ratios against baselines measured in the same run; nothing here is asserted.
#include "cli/bench.h"

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <thread>

#include "engine/event_queue.h"
#include "engine/job_state.h"
#include "policies/policy.h"
#include "sim/montecarlo.h"

namespace goodput {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Event started_event() {
  JobStarted j;
  j.job = "bench";
  j.nodes = 64;
  j.accelerators_per_node = 8;
  j.step_time = kSecond;
  return Event{1, 0, j};
}

// The core loop: pop the earliest item, fold its event into JobState, schedule the next one.
// 64 timers are pending at any time, as many as a busy simulated cluster keeps.
double core_loop(int64_t n, uint64_t& sink) {
  JobState s;
  s.apply(started_event());
  EventQueue<int32_t> q;
  for (int32_t i = 0; i < 64; ++i) q.push(i * 1000, i);
  Event e;
  e.payload = CheckpointSaved{};
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t k = 0; k < n; ++k) {
    auto entry = q.pop();
    e.seq = static_cast<uint64_t>(k) + 2;
    e.time = entry.time;
    std::get<CheckpointSaved>(e.payload).step = k;
    s.apply(e);
    q.push(entry.time + 1000 + (entry.item * 7919) % 500, entry.item);
  }
  const double dt = seconds_since(t0);
  sink += static_cast<uint64_t>(s.productive());
  return static_cast<double>(n) / dt;
}

// The naive loop one writes first: an ordered map of type-erased callbacks.
double naive_loop(int64_t n, uint64_t& sink) {
  JobState s;
  s.apply(started_event());
  std::multimap<std::pair<Time, uint64_t>, std::function<void(Time)>> q;
  uint64_t order = 0;
  int64_t k = 0;
  std::function<void(Time, int32_t)> schedule = [&](Time at, int32_t id) {
    q.emplace(std::make_pair(at, order++), [&, id](Time now) {
      Event e{static_cast<uint64_t>(k) + 2, now, CheckpointSaved{k, Tier::Memory, 0, false}};
      s.apply(e);
      schedule(now + 1000 + (id * 7919) % 500, id);
    });
  };
  for (int32_t i = 0; i < 64; ++i) schedule(i * 1000, i);
  auto t0 = std::chrono::steady_clock::now();
  for (k = 0; k < n; ++k) {
    auto it = q.begin();
    auto f = std::move(it->second);
    const Time at = it->first.first;
    q.erase(it);
    f(at);
  }
  const double dt = seconds_since(t0);
  sink += static_cast<uint64_t>(s.productive());
  return static_cast<double>(n) / dt;
}

}  // namespace

int run_bench(const BenchOptions& o) {
  uint64_t sink = 0;
  std::printf("goodput bench (one core unless noted; higher is better)\n\n");
  const int64_t n = 20'000'000;
  const double ours = core_loop(n, sink);
  const double naive = naive_loop(n / 10, sink);
  std::printf("core loop            %8.1f M events/s   naive map+std::function loop %6.1f M events/s   ratio %.1fx\n",
              ours / 1e6, naive / 1e6, ours / naive);

  Trace trace;
  try {
    trace = load_trace(o.trace_path);
  } catch (const TraceError& e) {
    std::fprintf(stderr, "goodput bench: %s\n", e.what());
    return 2;
  }
  const PolicySet policy = default_policy();
  auto t0 = std::chrono::steady_clock::now();
  const JobState one = simulate(trace, policy, SimOptions{1, false});
  const double replay_s = seconds_since(t0);
  std::printf("replay %-40s %.3f s, %llu events (%.1f M events/s), %lld days simulated\n", o.trace_path.c_str(),
              replay_s, static_cast<unsigned long long>(one.last_seq()), one.last_seq() / replay_s / 1e6,
              static_cast<long long>(one.wall() / kDay));

  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  MonteCarloOptions mo{1, o.runs, threads, true, {}};
  t0 = std::chrono::steady_clock::now();
  auto reports = run_monte_carlo(trace, policy, mo);
  const double mc_s = seconds_since(t0);
  const double rate = o.runs / mc_s;
  mo.threads = 1;
  mo.runs = std::max(1, o.runs / 4);
  t0 = std::chrono::steady_clock::now();
  run_monte_carlo(trace, policy, mo);
  const double single = mo.runs / seconds_since(t0);
  std::printf("monte carlo          %8.0f runs/s on %d threads (%.0f runs/s on 1: %.2fx)   10,000 runs: %.1f s\n", rate,
              threads, single, rate / single, 10'000 / rate);
  std::printf("\n(checksum %llu)\n", static_cast<unsigned long long>(sink + reports.size()));
  return 0;
}

}  // namespace goodput
