// The accounting's promises, checked after every event of a few hundred random traces (every event
// type, 1-32 nodes, 0-4 spares, zero durations, operators' scale requests, every shipped policy and
// random variations of them): the breakdown sums to wall time exactly, no loss is negative, goodput
// and accelerator-weighted goodput lie in [0, 1], the accelerator time held never exceeds the
// machines' time, and the stored log folds back into the same report.
//
// GOODPUT_PROPERTY_TRACES sets how many traces (default 300; scripts/fuzz.sh runs many more) and
// GOODPUT_PROPERTY_SEED the first seed; a failure prints the seed, trace and policy that break it.
// Seeds that broke a promise once are replayed first, every time.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/event_json.h"
#include "engine/rng.h"
#include "report/report.h"
#include "sim/policy_file.h"
#include "sim/simulator.h"
#include "test_util.h"

using namespace goodput;
using namespace goodput::test;

namespace {

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

std::string secs(double s) {
  std::ostringstream o;
  o.precision(6);
  o << std::fixed << s << "s";
  return o.str();
}

// A random trace in the file format, so it also goes through the strict loader.
std::string random_trace(Rng& rng) {
  auto pick = [&](uint64_t n) { return static_cast<int64_t>(rng.below(n)); };
  auto maybe_zero = [&](double max_s) { return rng.below(4) == 0 ? 0.0 : rng.uniform() * max_s; };
  const int nodes = 1 + static_cast<int>(pick(32));
  const int spares = static_cast<int>(pick(5));
  const double horizon = 600 + rng.uniform() * 3 * 86400;
  const double hang_timeout = maybe_zero(900);
  nlohmann::ordered_json h;
  h["format"] = "goodput-trace";
  h["version"] = 1;
  h["name"] = "random";
  h["cluster"] = {{"nodes", nodes},
                  {"accelerators_per_node", 1 + pick(8)},
                  {"spare_nodes", spares},
                  {"repair_time", secs(maybe_zero(8 * 3600))},
                  {"check_time", secs(maybe_zero(1800))}};
  nlohmann::ordered_json job = {{"step_time", secs(0.001 + rng.uniform() * 10)},
                                {"duration", secs(horizon)},
                                {"checkpoint_bytes_per_node", rng.below(3) == 0 ? 0 : static_cast<int64_t>(rng.below(60'000'000'000))},
                                {"memory_bandwidth_bytes_per_s", 1'000'000'000 + static_cast<int64_t>(rng.below(50'000'000'000))},
                                {"storage_bandwidth_bytes_per_s", 100'000'000 + static_cast<int64_t>(rng.below(5'000'000'000))},
                                {"process_restart", secs(maybe_zero(180))},
                                {"node_scheduling", secs(maybe_zero(900))},
                                {"rendezvous", secs(maybe_zero(90))},
                                {"exit_detection", secs(maybe_zero(10))},
                                {"heartbeat_timeout", secs(maybe_zero(120))},
                                {"hang_timeout", secs(hang_timeout)}};
  if (rng.below(5) == 0) job["total_steps"] = 1 + pick(200000);
  h["job"] = job;
  const bool rates = rng.below(4) == 0;
  if (rates) {
    const double per = 1.0 / (nodes * (1 + rng.uniform() * 40));  // a job MTBF of 1 to 41 hours
    h["failure_rates"] = nlohmann::ordered_json::array(
        {{{"type", "node_failure"}, {"reason", "Faulty GPU"}, {"per_node_hour", per}},
         {{"type", "process_crash"}, {"reason", "Software bug"}, {"per_node_hour", per}, {"exit_code", 1}},
         {{"type", "hang"}, {"reason", "NCCL timeout"}, {"per_node_hour", per / 2}},
         {{"type", "maintenance"}, {"reason", "Host maintenance"}, {"per_node_hour", per / 4}},
         {{"type", "pause"}, {"reason", "storage stall"}, {"per_node_hour", per / 2}, {"duration", secs(0.001 + rng.uniform() * 1200)}}});
  }
  std::string out = h.dump() + "\n";
  if (rates && rng.below(2) == 0) return out;  // failures drawn from the rates
  const int events = static_cast<int>(pick(40));
  std::vector<double> times;
  for (int i = 0; i < events; ++i) times.push_back(rng.uniform() * horizon);
  std::sort(times.begin(), times.end());
  if (events > 2 && rng.below(3) == 0) times[1] = times[0];  // ties
  int32_t world = nodes;
  for (double t : times) {
    nlohmann::ordered_json e;
    e["t"] = std::floor(t * 1e6) / 1e6;
    const int kind = static_cast<int>(pick(8));
    static const char* kTypes[] = {"node_failure", "process_crash", "hang", "slowdown", "maintenance", "node_return", "pause", "scale"};
    e["type"] = kTypes[kind];
    if (kind != 7) {
      if (rng.below(2) == 0 && kind != 5) e["rank"] = pick(static_cast<uint64_t>(nodes));
      else e["node"] = (rng.below(4) == 0 && spares > 0) ? "s" + std::to_string(pick(spares)) : "n" + std::to_string(pick(nodes));
    }
    switch (kind) {
      case 0:
      case 4:
        e["reason"] = rng.below(2) ? "Faulty GPU" : "GPU HBM3 memory";
        if (rng.below(2)) e["repair"] = secs(maybe_zero(6 * 3600));
        break;
      case 1:
        e["exit_code"] = rng.below(3) == 0 ? 137 : static_cast<int>(pick(3));
        if (rng.below(3) == 0) e["signal"] = 9;
        if (rng.below(4) == 0) {
          e["reason"] = "OOMKilled";
          e["memory_needed"] = 1.0 + rng.uniform() * 2;
          e["recur_after"] = secs(maybe_zero(1800));
        }
        break;
      case 3:
        e["factor"] = 1.0 + rng.uniform() * 3;
        if (rng.below(2)) e["duration"] = secs(maybe_zero(7200));
        break;
      case 6: e["duration"] = secs(0.001 + rng.uniform() * 2 * std::max(hang_timeout, 1.0)); break;
      case 7: {
        const int32_t to = 1 + static_cast<int32_t>(pick(40));
        e["group"] = "worker";
        e["from"] = world;
        e["to"] = to;
        world = to;
        break;
      }
      default: break;
    }
    out += e.dump() + "\n";
  }
  return out;
}

nlohmann::json random_policy(Rng& rng) {
  static const char* kShipped[] = {"flash-diagnose", "flash-elastic", "flash-replace-stragglers", "restart-all",
                                   "young-daly-storage"};
  const std::string name = kShipped[rng.below(5)];
  std::ifstream in(source_path("examples/policies/" + name + ".json"));
  nlohmann::json p = nlohmann::json::parse(in);
  if (rng.below(3) == 0) p["recovery"]["max_failures"] = 1 + rng.below(6);
  if (rng.below(4) == 0) p["recovery"]["restart_window"] = rng.below(2) ? "0s" : "10m";
  if (rng.below(4) == 0) p["recovery"]["backoff_base"] = "5s";
  if (rng.below(5) == 0) p["scaling"] = {{"policy", "elastic"}, {"min_nodes", 1 + rng.below(3)}};
  return p;
}

// Folds the log as it is written and checks every promise after every event.
struct InvariantSink final : EventSink {
  JobState s;
  int32_t machines = 0;
  std::string failure;  // the first broken promise
  void append(const Event& e) override {
    s.apply(e);
    if (!failure.empty()) return;
    auto fail = [&](const std::string& what) { failure = "after seq " + std::to_string(e.seq) + " (" + event_to_line(e) + "): " + what; };
    if (s.productive() + s.losses_total() != s.wall()) return fail("breakdown does not sum to wall time");
    if (s.productive() < 0) return fail("negative productive time");
    for (int i = 0; i < kLossCount; ++i)
      if (s.loss(static_cast<Loss>(i)) < 0) return fail("negative loss " + std::string(to_string(static_cast<Loss>(i))));
    const double held = s.accelerator_ns_held(), productive = s.accelerator_ns_productive();
    if (productive < 0 || held < -1e-3) return fail("negative accelerator time");
    if (productive > held * (1 + 1e-9) + 1e-3)
      return fail("accelerator-weighted goodput above 100%: " + std::to_string(productive / held));
    const double most = static_cast<double>(machines) * s.job().accelerators_per_node * static_cast<double>(s.wall());
    if (held > most * (1 + 1e-9) + 1e-3) return fail("more accelerator time held than the machines have");
  }
};

// A node relaunched (a straggler replaced) while the trainers were still starting: the restart went
// on without it and the world trained with no node held (accelerator-weighted goodput 1,178%).
// A hang noticed late while warm spares were held: the time taken back from the stall to the
// event before its notice was taken back for the slots only, so the spares' was counted twice (all
// of a cluster's machines held: more accelerator time than it has).
constexpr uint64_t kRegressionSeeds[] = {20261204002150, 20261204006200, 20261204012247, 996973, 991706};

}  // namespace

TEST_CASE("property: on random traces the books balance after every event and the log folds back to the same report") {
  const uint64_t traces = env_or("GOODPUT_PROPERTY_TRACES", 300);
  const uint64_t first = env_or("GOODPUT_PROPERTY_SEED", 1);
  int gave_up = 0, scaled = 0, failed = 0, from_peers = 0;
  std::vector<uint64_t> seeds(std::begin(kRegressionSeeds), std::end(kRegressionSeeds));
  for (uint64_t i = 0; i < traces; ++i) seeds.push_back(first + i);
  for (const uint64_t seed : seeds) {
    Rng rng(seed);
    std::string text = random_trace(rng);
    nlohmann::json pj = random_policy(rng);
    // Options added later draw from a stream of their own, so every older seed keeps its trace and policy.
    Rng later(seed ^ 0x5eed0f1a7e4ULL);
    auto set_job_cost = [&](const char* key, double seconds) {  // in the trace's header line
      nlohmann::json header = nlohmann::json::parse(text.substr(0, text.find('\n')));
      header["job"][key] = seconds;
      text = header.dump() + text.substr(text.find('\n'));
    };
    if (later.below(3) == 0) {  // warm starts, at a cost that may be zero or above a cold start's
      pj["recovery"]["warm_start"] = true;
      set_job_cost("warm_restart", later.below(4) == 0 ? 0.0 : later.uniform() * 200);
    }
    if (later.below(3) == 0) {  // warm spares, taking a slot at a cost that may be zero or above a placement's
      pj["scaling"]["warm_spares"] = later.below(4);
      set_job_cost("spare_activation", later.below(4) == 0 ? 0.0 : later.uniform() * 600);
    }
    // Copies in peers' memory, on a link from far slower than storage to far faster than memory.
    const bool memory_tier = pj["checkpoint"].value("tier", pj["checkpoint"].value("policy", "") == "flash" ? "memory" : "") == "memory";
    if (later.below(3) == 0 && memory_tier) {
      pj["checkpoint"]["replicas"] = 1 + later.below(3);
      pj["checkpoint"]["placement"] = later.below(2) == 0 ? "ring" : "groups";
      static constexpr int64_t kLinks[] = {1'000'000, 100'000'000, 2'000'000'000, 12'500'000'000, 400'000'000'000};
      nlohmann::json header = nlohmann::json::parse(text.substr(0, text.find('\n')));
      header["job"]["network_bandwidth_bytes_per_s"] = kLinks[later.below(5)];
      text = header.dump() + text.substr(text.find('\n'));
    }
    const std::string where = "seed " + std::to_string(seed) + "\ntrace:\n" + text + "policy: " + pj.dump();
    Trace t;
    try {
      t = parse_trace(text, "random.jsonl");
    } catch (const TraceError& e) {
      FAIL_CHECK("the generator made a trace the loader refuses: " << std::string(e.what()) << "\n" << where);
      continue;
    }
    InvariantSink inv;
    inv.machines = t.machines();
    MemoryStore log;
    Report r;
    try {
      Simulator sim(t, load_policy(pj), SimOptions{seed, t.events.empty() && !t.rates.empty()}, {&inv, &log});
      r = make_report(sim.run());
    } catch (const std::exception& e) {
      FAIL_CHECK("the simulator threw: " << std::string(e.what()) << "\n" << where);
      ++failed;
      continue;
    }
    if (!inv.failure.empty()) {
      FAIL_CHECK(inv.failure << "\n" << where);
      ++failed;
      continue;
    }
    CHECK(r.goodput >= 0);
    CHECK(r.goodput <= 1);
    CHECK(r.accelerator_goodput >= 0);
    CHECK(r.accelerator_goodput <= 1 + 1e-9);
    if (r.end_reason != "completed" && r.end_reason != "stuck") CHECK_MESSAGE(r.wall == t.job.duration, where);
    // The stored log, written out and read back line by line, folds into the same report.
    JobState again;
    log.for_each([&](const Event& e) { again.apply(event_from_line(event_to_line(e))); });
    if (report_json(make_report(again)) != report_json(r)) {
      FAIL_CHECK("the log does not fold back into the same report\n" << where);
      ++failed;
    }
    gave_up += r.gave_up;
    scaled += r.scale_changes > 0;
    from_peers += r.restores[static_cast<size_t>(Tier::Peer)] > 0;
  }
  MESSAGE(seeds.size() << " random traces: " << gave_up << " gave up, " << scaled << " scaled, " << from_peers
                       << " restored from peers, " << failed << " broke a promise");
  CHECK(failed == 0);
  if (traces >= 300) CHECK(from_peers > 0);  // the peer tier was exercised, not only configured
}
