// Benchmarks print ratios against baselines measured in the same run; nothing here is asserted.
#include "cli/bench.h"

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <thread>

#include "engine/event_queue.h"
#include "engine/job_state.h"
#include "policies/policy.h"
#include "report/report.h"
#include "sim/montecarlo.h"
#include "sim/simulator.h"

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

int run_sim_scale_bench(const SimScaleOptions& o) {
  const Trace base = load_trace(o.trace_path);  // a TraceError is the command line's: exit 2 with its message
  if (base.rates.empty()) {
    std::fprintf(stderr, "goodput bench sim: %s: no failure_rates to draw from\n", o.trace_path.c_str());
    return 2;
  }
  if (o.accelerators.empty()) {
    std::fprintf(stderr, "goodput bench sim: --accelerators names no job size\n");
    return 2;
  }
  // flash+diagnose without a failure budget: a year on 100,000 accelerators sees ~19,000 failures.
  const PolicySet policy = load_policy(nlohmann::json::parse(
      R"({"name":"flash+diagnose","recovery":{"policy":"diagnose","max_failures":0},"checkpoint":{"policy":"flash","interval":"2m"}})"));
  std::printf("goodput bench sim: %s's failure rates and cost model, %.0f days, one core for replays\n\n",
              o.trace_path.c_str(), o.days);
  std::printf("%12s %8s %10s %10s %12s %10s %9s  %s\n", "accelerators", "nodes", "failures", "events", "replay s",
              "ns/event", "vs first", "goodput");
  auto sized = [&](int32_t accelerators) {
    Trace t = base;
    t.events.clear();
    t.cluster.nodes = std::max(1, accelerators / std::max(1, t.cluster.accelerators_per_node));
    t.cluster.spare_nodes = std::max(1, t.cluster.nodes / 64);
    t.cluster.node_hours = 0;
    t.job.total_steps = 0;
    t.job.duration = static_cast<Duration>(o.days * static_cast<double>(kDay));
    return t;
  };
  uint64_t sink = 0;
  double first_ns = 0;
  Trace largest;
  for (size_t i = 0; i < o.accelerators.size(); ++i) {
    const Trace t = sized(o.accelerators[i]);
    double best = 1e300;
    JobState s;
    for (int rep = 0; rep < 3; ++rep) {  // the best of three: the machine is shared
      auto t0 = std::chrono::steady_clock::now();
      s = simulate(t, policy, SimOptions{1, true});
      best = std::min(best, seconds_since(t0));
    }
    const double ns = best * 1e9 / static_cast<double>(std::max<uint64_t>(1, s.last_seq()));
    if (i == 0) first_ns = ns;
    const Report r = make_report(s);
    std::printf("%12d %8d %10d %10llu %12.3f %10.0f %8.2fx  %.2f%%\n", o.accelerators[i], t.cluster.nodes, s.failures(),
                static_cast<unsigned long long>(s.last_seq()), best, ns, ns / first_ns, 100 * r.goodput);
    sink += static_cast<uint64_t>(s.productive());
    if (i + 1 == o.accelerators.size()) largest = t;
  }
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("\npeak memory          %.1f MiB (the whole process)\n", static_cast<double>(ru.ru_maxrss) / 1024.0);

  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  MonteCarloOptions mo{1, o.runs, threads, true, {}};
  auto t0 = std::chrono::steady_clock::now();
  const auto reports = run_monte_carlo(largest, policy, mo);
  const double mc_s = seconds_since(t0);
  mo.threads = 1;
  mo.runs = std::max(1, o.runs / 10);
  t0 = std::chrono::steady_clock::now();
  run_monte_carlo(largest, policy, mo);
  const double single = mo.runs / seconds_since(t0);
  std::printf("monte carlo          %d runs of %d accelerators x %.0f days: %.1f s on %d threads (%.1f runs/s; "
              "%.1f runs/s on 1: %.2fx)\n",
              o.runs, o.accelerators.back(), o.days, mc_s, threads, o.runs / mc_s, single, o.runs / mc_s / single);
  std::printf("\n(checksum %llu)\n", static_cast<unsigned long long>(sink + reports.size()));
  return 0;
}

}  // namespace goodput
