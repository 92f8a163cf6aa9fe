// The simulator against numbers worked out by hand, and its promises: determinism, a breakdown
// that sums to wall time, and the right recovery path for each kind of failure.
#include <doctest/doctest.h>

#include "engine/event_json.h"
#include "report/report.h"
#include "report/timeline.h"
#include "sim/montecarlo.h"
#include "sim/policy_file.h"
#include "sim/from_log.h"
#include "sim/simulator.h"
#include "test_util.h"

using namespace goodput;
using namespace goodput::test;

namespace {

PolicySet policy(const std::string& json) { return load_policy(nlohmann::json::parse(json)); }

const char* kStorageEvery100 =
    R"({"name":"fixed","checkpoint":{"policy":"fixed","every_steps":100,"tier":"storage"}})";
const char* kFlashEvery100 =
    R"({"name":"flash","checkpoint":{"policy":"flash","every_steps":100,"persist_every":1}})";

Duration ms(int64_t v) { return v * kMillisecond; }

void check_sums(const JobState& s) {
  CHECK(s.productive() + s.losses_total() == s.wall());
}

}  // namespace

TEST_CASE("failure-free goodput is one minus the checkpoint and start-up overhead, to the nanosecond") {
  // Start-up: nodes placed at 60 s, trainers up at 90 s, rendezvous done at 100 s, nothing to load.
  // Then cycles of 100 one-second steps and a 2 s blocking save: 50 cycles end at 5200 s, and 50 s
  // of training follow until the 5250 s horizon.
  const Trace t = small_trace(5250 * kSecond);
  Simulator sim(t, policy(kStorageEvery100), SimOptions{});
  const JobState& s = sim.run();
  CHECK(s.wall() == 5250 * kSecond);
  CHECK(s.loss(Loss::Scheduling) == 60 * kSecond);
  CHECK(s.loss(Loss::Restart) == 30 * kSecond);
  CHECK(s.loss(Loss::Rendezvous) == 10 * kSecond);
  CHECK(s.loss(Loss::CheckpointSave) == 50 * 2 * kSecond);
  CHECK(s.loss(Loss::Recompute) == 0);
  CHECK(s.productive() == (5250 - 60 - 30 - 10 - 100) * kSecond);
  CHECK(s.checkpoints_saved(Tier::Storage) == 50);
  CHECK(s.steps_done() == 5050);
  const Report r = make_report(s);
  CHECK(r.goodput == doctest::Approx(5050.0 / 5250.0).epsilon(1e-12));
  // No accelerator is held while the nodes are being placed (the first 60 s).
  CHECK(r.accelerator_goodput == doctest::Approx(5050.0 / 5190.0).epsilon(1e-12));
  check_sums(s);
}

TEST_CASE("a software crash restarts processes in place and restores the memory checkpoint") {
  // Flash: 0.2 s memory save every 100 steps, so checkpoint k completes at 100 + 100.2 k s.
  // The crash at 1000.5 s follows checkpoint 8 (step 800, 901.6 s); 898.9 s of training are lost.
  Trace t = small_trace(2000 * kSecond);
  t.events.push_back(failure(ms(1'000'500), TraceEventType::ProcessCrash, "n1", t, "Segmentation fault"));
  t.events.back().signal = 11;
  Simulator sim(t, policy(kFlashEvery100), SimOptions{});
  const JobState& s = sim.run();
  CHECK(s.failures() == 1);
  CHECK(s.failures_by(Diagnosis::SoftwareError) == 1);
  CHECK(s.decisions_by(RecoveryAction::RestartProcess) == 1);
  CHECK(s.loss(Loss::Detection) == kSecond);
  CHECK(s.loss(Loss::Restart) == 2 * 30 * kSecond);
  CHECK(s.loss(Loss::Rendezvous) == 2 * 10 * kSecond);
  CHECK(s.loss(Loss::CheckpointLoad) == ms(200));       // from memory
  CHECK(s.loss(Loss::Recompute) == ms(98'900));         // 898.9 s trained, 800 s kept
  CHECK(s.loss(Loss::Scheduling) == 60 * kSecond);      // start-up only: no node relaunched
  CHECK(s.nodes_held() == 4);
  check_sums(s);
}

TEST_CASE("warm starts: a restart costs warm_restart instead of process_restart; the first start stays cold") {
  // The crash above, with recovery.warm_start: the restart's processes are up 5 s after the
  // decision instead of 30 s, so 25 s less is lost to the restart and 25 s more trained by the
  // horizon; nothing else moves. Off (the default), the log has no trace of the option.
  Trace t = small_trace(2000 * kSecond);
  t.job.warm_restart = 5 * kSecond;
  t.events.push_back(failure(ms(1'000'500), TraceEventType::ProcessCrash, "n1", t, "Segmentation fault"));
  t.events.back().signal = 11;
  const char* warm = R"({"name":"flash-warm","recovery":{"policy":"diagnose","warm_start":true},
                         "checkpoint":{"policy":"flash","every_steps":100,"persist_every":1}})";
  MemoryStore cold_log, warm_log;
  Simulator cold_sim(t, policy(kFlashEvery100), SimOptions{}, {&cold_log});
  Simulator warm_sim(t, policy(warm), SimOptions{}, {&warm_log});
  const JobState& c = cold_sim.run();
  const JobState& w = warm_sim.run();
  CHECK(c.loss(Loss::Restart) == 2 * 30 * kSecond);
  CHECK(w.loss(Loss::Restart) == 30 * kSecond + 5 * kSecond);  // the first start is cold
  CHECK(w.productive() == c.productive() + 25 * kSecond);
  for (Loss l : {Loss::Detection, Loss::Rendezvous, Loss::CheckpointLoad, Loss::Scheduling})
    CHECK(w.loss(l) == c.loss(l));
  CHECK(w.loss(Loss::Recompute) == c.loss(Loss::Recompute));
  check_sums(w);
  std::vector<bool> warm_flags;
  warm_log.for_each([&](const Event& e) {
    if (const auto* r = std::get_if<RestartJob>(&e.payload)) warm_flags.push_back(r->warm);
  });
  CHECK(warm_flags == std::vector<bool>{false, true});
  cold_log.for_each([&](const Event& e) { CHECK(event_to_line(e).find("warm") == std::string::npos); });
  warm_log.for_each([&](const Event& e) { CHECK(event_to_line(event_from_line(event_to_line(e))) == event_to_line(e)); });
  // The trace format carries the cost: written only when it is not the default, read back the same.
  const Trace back = parse_trace(write_trace(t), "t");
  CHECK(back.job.warm_restart == 5 * kSecond);
  CHECK(write_trace(small_trace(kHour)).find("warm_restart") == std::string::npos);
  CHECK_THROWS_WITH_AS(policy(R"({"recovery":{"policy":"restart-all","warm_start":"yes"}})"),
                       doctest::Contains("warm_start"), PolicyError);
}

TEST_CASE("a node failure relaunches the node on a spare and restores from storage") {
  // Detected after the 30 s heartbeat timeout; the spare is up 60 s later; the newest persisted
  // checkpoint is step 800 (persisted at 903.6 s); loading it from storage takes 2 s.
  Trace t = small_trace(2000 * kSecond, /*spares=*/1);
  t.events.push_back(failure(ms(1'000'500), TraceEventType::NodeFailure, "n2", t, "Faulty GPU"));
  MemoryStore log;
  Simulator sim(t, policy(kFlashEvery100), SimOptions{}, {&log});
  const JobState& s = sim.run();
  CHECK(s.failures_by(Diagnosis::HardwareError) == 1);
  CHECK(s.decisions_by(RecoveryAction::RelaunchNode) == 1);
  CHECK(s.loss(Loss::Detection) == 30 * kSecond);
  CHECK(s.loss(Loss::Scheduling) == 2 * 60 * kSecond);
  CHECK(s.loss(Loss::CheckpointLoad) == 2 * kSecond);
  CHECK(s.loss(Loss::Recompute) == ms(98'900));
  CHECK(s.holds(*t.machine_index("s0")));
  CHECK_FALSE(s.holds(*t.machine_index("n2")));
  // The restart loaded step 800 from storage.
  bool loaded = false;
  for (const Event& e : log.events())
    if (const auto* l = std::get_if<CheckpointLoaded>(&e.payload); l && l->tier == Tier::Storage) {
      CHECK(l->step == 800);
      loaded = true;
    }
  CHECK(loaded);
  check_sums(s);
}

namespace {
// (time in ms, held) of every spares_held event in a log.
std::vector<std::pair<int64_t, int32_t>> spares_held(const MemoryStore& log) {
  std::vector<std::pair<int64_t, int32_t>> out;
  for (const Event& e : log.events())
    if (const auto* h = std::get_if<SparesHeld>(&e.payload)) out.emplace_back(e.time / kMillisecond, h->held);
  return out;
}
const char* kFlashWarmSpare =
    R"({"name":"flash","checkpoint":{"policy":"flash","every_steps":100,"persist_every":1},"scaling":{"policy":"wait","warm_spares":1}})";
}  // namespace

TEST_CASE("a warm spare takes a lost node's slot after spare_activation, and the pool refills at the placement cost") {
  // The node failure above with one warm spare: s0 is placed beside the world at the start (ready
  // at 60 s); at the relaunch (1030.5 s) it takes slot 2 in 5 s instead of 60; s1 is placed to
  // refill the pool (ready at 1090.5 s). Spares count as held accelerators: the job holds s0 from
  // 60 s to 1030.5 s and s1 from 1090.5 s to the end, 8 accelerators each.
  Trace t = small_trace(2000 * kSecond, /*spares=*/2);
  t.job.spare_activation = 5 * kSecond;
  t.events.push_back(failure(ms(1'000'500), TraceEventType::NodeFailure, "n2", t, "Faulty GPU"));
  MemoryStore warm_log, cold_log;
  Simulator warm_sim(t, policy(kFlashWarmSpare), SimOptions{}, {&warm_log});
  Simulator cold_sim(t, policy(kFlashEvery100), SimOptions{}, {&cold_log});
  const JobState& w = warm_sim.run();
  const JobState& c = cold_sim.run();
  CHECK(c.loss(Loss::Scheduling) == 2 * 60 * kSecond);
  CHECK(w.loss(Loss::Scheduling) == 60 * kSecond + 5 * kSecond);
  CHECK(w.holds(*t.machine_index("s0")));
  CHECK(spares_held(warm_log) == std::vector<std::pair<int64_t, int32_t>>{{60'000, 1}, {1'030'500, 0}, {1'090'500, 1}});
  CHECK(spares_held(cold_log).empty());
  CHECK(w.spares_held() == 1);
  const double spare_ns = static_cast<double>((1'030'500 - 60'000) + (2'000'000 - 1'090'500)) * kMillisecond;
  const double slot_sooner_ns = 55.0 * kSecond;  // slot 2 held 55 s longer
  CHECK(w.accelerator_ns_held() - c.accelerator_ns_held() == 8 * (spare_ns + slot_sooner_ns));
  const Report wr = make_report(w), cr = make_report(c);
  CHECK(wr.goodput > cr.goodput);  // 55 s more training
  check_sums(w);
}

TEST_CASE("warm spares: a spare that fails is replaced in the pool; an empty pool and no free machine is a wait for capacity") {
  // s0 warm from 60 s fails at 500 s: s1 is placed in its stead (ready at 560 s). n2 fails at
  // 1000.5 s and takes s1; nothing is free to refill. n1 fails at 1200.5 s: no spare, no free
  // machine, none warming: its slot waits for a repair until the horizon.
  Trace t = small_trace(2000 * kSecond, /*spares=*/2);
  t.job.spare_activation = 5 * kSecond;
  t.events.push_back(failure(500 * kSecond, TraceEventType::NodeFailure, "s0", t, "Faulty GPU"));
  t.events.push_back(failure(ms(1'000'500), TraceEventType::NodeFailure, "n2", t, "Faulty GPU"));
  t.events.push_back(failure(ms(1'200'500), TraceEventType::NodeFailure, "n1", t, "Faulty GPU"));
  MemoryStore log;
  Simulator sim(t, policy(kFlashWarmSpare), SimOptions{}, {&log});
  const JobState& s = sim.run();
  CHECK(spares_held(log) ==
        std::vector<std::pair<int64_t, int32_t>>{{60'000, 1}, {500'000, 0}, {560'000, 1}, {1'030'500, 0}});
  CHECK(s.holds(*t.machine_index("s1")));
  CHECK(s.loss(Loss::Scheduling) == 60 * kSecond + 5 * kSecond);
  CHECK(s.loss(Loss::CapacityWait) == ms(2'000'000 - 1'230'500));  // from n1's detection to the horizon
  check_sums(s);
}

TEST_CASE("without a spare the job waits idle until the machine is repaired") {
  Trace t = small_trace(8000 * kSecond, /*spares=*/0);
  t.events.push_back(failure(ms(1'000'500), TraceEventType::NodeFailure, "n2", t, "GPU HBM3 memory"));
  Simulator sim(t, policy(kFlashEvery100), SimOptions{});
  const JobState& s = sim.run();
  // Decided at 1030.5 s, repaired at 1000.5 + 3600 s: 3570 s idle, then 60 s to place it again.
  CHECK(s.loss(Loss::CapacityWait) == 3570 * kSecond);
  CHECK(s.loss(Loss::Scheduling) == 2 * 60 * kSecond);
  CHECK(s.holds(*t.machine_index("n2")));
  check_sums(s);
}

TEST_CASE("elastic scaling keeps training on fewer nodes and grows back") {
  Trace t = small_trace(8000 * kSecond, /*spares=*/0);
  t.events.push_back(failure(ms(1'000'500), TraceEventType::NodeFailure, "n2", t, "GPU HBM3 memory"));
  Simulator sim(t, policy(R"({"checkpoint":{"policy":"flash","every_steps":100},"scaling":{"policy":"elastic"}})"),
                SimOptions{});
  const JobState& s = sim.run();
  CHECK(s.scale_changes() == 2);  // 4 -> 3, then back to 4
  CHECK(s.world_size() == 4);
  CHECK(s.loss(Loss::CapacityWait) == 0);
  // A quarter of the capacity is missing while 3 nodes train: roughly 3500 s / 4.
  CHECK(s.loss(Loss::ReducedCapacity) > 800 * kSecond);
  CHECK(s.loss(Loss::ReducedCapacity) < 900 * kSecond);
  check_sums(s);

  Simulator waiting(t, policy(R"({"checkpoint":{"policy":"flash","every_steps":100}})"), SimOptions{});
  CHECK(make_report(s).goodput > make_report(waiting.run()).goodput);
}

TEST_CASE("a straggler slows the whole synchronous job") {
  Trace t = small_trace(3000 * kSecond);
  TraceEvent slow = failure(500 * kSecond, TraceEventType::Slowdown, "n3", t);
  slow.slowdown_permille = 2000;
  slow.duration = 1000 * kSecond;
  t.events.push_back(slow);
  Simulator sim(t, policy(kFlashEvery100), SimOptions{});
  const JobState& s = sim.run();
  // Half of the 1000 s at half speed is lost (minus a little: blocking saves are not slowed).
  CHECK(s.loss(Loss::Slowdown) > 495 * kSecond);
  CHECK(s.loss(Loss::Slowdown) <= 500 * kSecond);
  CHECK(s.slowdown_permille() == 1000);
  check_sums(s);
}

TEST_CASE("a hang is noticed after the hang timeout and the processes are restarted") {
  Trace t = small_trace(3000 * kSecond);
  t.events.push_back(failure(1000 * kSecond, TraceEventType::Hang, "n0", t, "NCCL watchdog timeout"));
  Simulator sim(t, policy(kFlashEvery100), SimOptions{});
  const JobState& s = sim.run();
  CHECK(s.loss(Loss::Detection) == 5 * kMinute);
  CHECK(s.failures_by(Diagnosis::Unknown) == 1);
  CHECK(s.decisions_by(RecoveryAction::RestartProcess) == 1);
  check_sums(s);
}

TEST_CASE("a node that keeps crashing is relaunched instead of restarted again") {
  Trace t = small_trace(20000 * kSecond, 1);
  for (int i = 1; i <= 4; ++i) t.events.push_back(failure(i * 1000 * kSecond, TraceEventType::ProcessCrash, "n1", t));
  Simulator sim(t, policy(R"({"recovery":{"policy":"diagnose","max_restarts_per_node":3}})"), SimOptions{});
  const JobState& s = sim.run();
  CHECK(s.decisions_by(RecoveryAction::RestartProcess) == 3);
  CHECK(s.decisions_by(RecoveryAction::RelaunchNode) == 1);
  CHECK_FALSE(s.holds(*t.machine_index("n1")));
}

TEST_CASE("the job gives up after max_failures and says so") {
  Trace t = small_trace(20000 * kSecond, 1);
  for (int i = 1; i <= 5; ++i) t.events.push_back(failure(i * 1000 * kSecond, TraceEventType::ProcessCrash, "n1", t));
  Simulator sim(t, policy(R"({"recovery":{"policy":"diagnose","max_failures":2}})"), SimOptions{});
  const JobState& s = sim.run();
  CHECK(s.gave_up());
  CHECK(s.finish_reason() == "gave-up");
  // It gave up at the third failure's decision (1 s detection), and is charged until the horizon
  // it was meant to run for: giving up never scores better than recovering.
  CHECK(s.wall() == 20000 * kSecond);
  CHECK(s.loss(Loss::GaveUp) == (20000 - 3001) * kSecond);
  CHECK(s.phase() == Phase::Finished);
  check_sums(s);

  // Without a horizon (a step target only) there is nothing to charge it to: it ends at once.
  Trace steps = t;
  steps.job.duration = 0;
  steps.job.total_steps = 100000;
  Simulator sim2(steps, policy(R"({"recovery":{"policy":"diagnose","max_failures":2}})"), SimOptions{});
  const JobState& s2 = sim2.run();
  CHECK(s2.finish_reason() == "gave-up");
  CHECK(s2.wall() == 3001 * kSecond);
  CHECK(s2.loss(Loss::GaveUp) == 0);
  check_sums(s2);
}

TEST_CASE("a configuration error in a trace gives up at once, in the simulator as live") {
  // A rollout that broke the trainer's image at 1000 s: the command is gone (exit 127).
  Trace t = small_trace(kHour, 1);
  t.events.push_back(failure(1000 * kSecond, TraceEventType::ProcessCrash, "n1", t,
                             "goodput agent: cannot run /opt/venv/bin/python: No such file or directory"));
  t.events.back().exit_code = 127;
  Simulator sim(t, default_policy(), SimOptions{});
  const JobState& s = sim.run();
  CHECK(s.failures_by(Diagnosis::ConfigurationError) == 1);
  CHECK(s.decisions_by(RecoveryAction::GiveUp) == 1);
  CHECK(s.decisions_by(RecoveryAction::RelaunchNode) == 0);
  CHECK(s.gave_up_because().rfind("cannot-exec: goodput agent: cannot run /opt/venv/bin/python", 0) == 0);
  CHECK(s.loss(Loss::GaveUp) == (3600 - 1001) * kSecond);
  check_sums(s);
}

TEST_CASE("a job with a step target finishes when it reaches it") {
  Trace t = small_trace(0);
  t.job.total_steps = 1000;
  Simulator sim(t, policy(kStorageEvery100), SimOptions{});
  const JobState& s = sim.run();
  CHECK(s.finish_reason() == "completed");
  CHECK(s.steps_done() == 1000);
  // 100 s start-up, 1000 s of steps, 10 saves of 2 s (the last at step 1000 is not reached).
  CHECK(s.wall() == (100 + 1000 + 9 * 2) * kSecond);
}

TEST_CASE("the same trace, policy and seed give a byte-identical event log") {
  const Trace t = load_trace(source_path("traces/small-2048gpu-7d.jsonl"));
  DigestSink a, b, c;
  MemoryStore la, lb;
  Simulator(t, default_policy(), SimOptions{7, true}, {&a, &la}).run();
  Simulator(t, default_policy(), SimOptions{7, true}, {&b, &lb}).run();
  Simulator(t, default_policy(), SimOptions{8, true}, {&c}).run();
  CHECK(a.hex() == b.hex());
  CHECK(a.count() > 100);
  CHECK(a.hex() != c.hex());  // the seed matters
  REQUIRE(la.events().size() == lb.events().size());
  for (size_t i = 0; i < la.events().size(); ++i) REQUIRE(event_to_line(la.events()[i]) == event_to_line(lb.events()[i]));
}

TEST_CASE("Monte Carlo results do not depend on the number of threads") {
  const Trace t = load_trace(source_path("traces/small-2048gpu-7d.jsonl"));
  MonteCarloOptions one{11, 24, 1, true, {}};
  MonteCarloOptions two{11, 24, 2, true, {}};
  const auto a = run_monte_carlo(t, default_policy(), one);
  const auto b = run_monte_carlo(t, default_policy(), two);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(report_json(a[i]).dump() == report_json(b[i]).dump());
  // And the runs differ from each other: each draws its own failures.
  CHECK(report_json(a[0]).dump() != report_json(a[1]).dump());
}

TEST_CASE("the breakdown sums to wall time under every shipped policy on the Llama 3 trace") {
  const Trace t = load_trace(source_path("traces/llama3-405b-54d.jsonl"));
  for (const char* p : {"flash-diagnose", "restart-all", "young-daly-storage", "flash-elastic", "flash-diagnose-warm",
                        "flash-diagnose-spares-warm", "flash-diagnose-spares-warm-replicas"}) {
    CAPTURE(p);
    const PolicySet ps = load_policy_file(source_path(std::string("examples/policies/") + p + ".json"));
    for (uint64_t seed : {1, 2, 3}) {
      // The simulator itself checks the sum after every event and throws if it breaks.
      const JobState s = simulate(t, ps, SimOptions{seed, true});
      check_sums(s);
      CHECK(s.failures() > 350);
      CHECK(s.wall() == 54 * kDay);
    }
  }
}

TEST_CASE("on the Llama 3 trace warm starts cut the mean restart from process_restart to warm_restart") {
  // Each restart's trainer start goes from the trace's 120 s to the default warm_restart, 10 s.
  const Trace t = load_trace(source_path("traces/llama3-405b-54d.jsonl"));
  const JobState cold = simulate(t, load_policy_file(source_path("examples/policies/flash-diagnose.json")), SimOptions{4, true});
  const JobState warm =
      simulate(t, load_policy_file(source_path("examples/policies/flash-diagnose-warm.json")), SimOptions{4, true});
  // The same failures (drawn from the seed); a restart cut short by the next failure costs what
  // it took, so the losses are not exact multiples: the mean per restart is what moves.
  CHECK(warm.failures() == cold.failures());
  const double cold_mean = static_cast<double>(cold.loss(Loss::Restart)) / cold.restart_jobs() / kSecond;
  const double warm_mean = static_cast<double>(warm.loss(Loss::Restart)) / warm.restart_jobs() / kSecond;
  CHECK(cold_mean == doctest::Approx(120).epsilon(0.02));
  CHECK(warm_mean == doctest::Approx(10).epsilon(0.05));
  CHECK(warm.productive() > cold.productive());
  check_sums(warm);
}

TEST_CASE("on the Llama 3 trace one copy in a peer turns the hardware failures' storage restores into peer restores") {
  const Trace t = load_trace(source_path("traces/llama3-405b-54d.jsonl"));
  const JobState plain =
      simulate(t, load_policy_file(source_path("examples/policies/flash-diagnose-spares-warm.json")), SimOptions{4, true});
  const JobState peers = simulate(
      t, load_policy_file(source_path("examples/policies/flash-diagnose-spares-warm-replicas.json")), SimOptions{4, true});
  CHECK(peers.failures() == plain.failures());
  CHECK(plain.restores_from(Tier::Peer) == 0);
  // Node losses relaunch a node; all but those whose holder went too (or came mid-copy) read a peer.
  const int64_t relaunched = peers.decisions_by(RecoveryAction::RelaunchNode);
  CHECK(peers.restores_from(Tier::Peer) > relaunched * 9 / 10);
  CHECK(peers.restores_from(Tier::Storage) < plain.restores_from(Tier::Storage) / 10);
  CHECK(peers.loss(Loss::CheckpointLoad) < plain.loss(Loss::CheckpointLoad) / 5);
  CHECK(peers.loss(Loss::Recompute) < plain.loss(Loss::Recompute));
  CHECK(peers.productive() > plain.productive());
  check_sums(peers);
}

TEST_CASE("flash checkpoints with diagnosis beat the restart-all baseline on the Llama 3 trace") {
  const Trace t = load_trace(source_path("traces/llama3-405b-54d.jsonl"));
  MonteCarloOptions o{1, 20, 0, true, {}};
  const Summary flash = summarize("flash", run_monte_carlo(t, load_policy_file(source_path("examples/policies/flash-diagnose.json")), o));
  const Summary base = summarize("base", run_monte_carlo(t, load_policy_file(source_path("examples/policies/restart-all.json")), o));
  CHECK(flash.goodput_p5 > base.goodput_p95);
  CHECK(flash.goodput_mean - base.goodput_mean > 0.05);
}

TEST_CASE("a slow persist skips saves (back-pressure) and a node failure restores the newest persisted one") {
  // Saves every 100 s of training (0.2 s each, done at 100 + 100.2 j s); a persist takes 250 s, so
  // saves 1, 4 and 7 are persisted (steps 100 and 400 complete by 750.8 s; 700's would end at
  // 1051.4 s but the node dies at 1000.5 s). The relaunched job restores step 400 from storage.
  Trace t = small_trace(1500 * kSecond, /*spares=*/1);
  t.job.storage_bandwidth_bytes_per_s = 8'000'000;
  t.events.push_back(failure(ms(1'000'500), TraceEventType::NodeFailure, "n0", t, "Faulty GPU"));
  MemoryStore log;
  Simulator sim(t, policy(kFlashEvery100), SimOptions{}, {&log});
  const JobState& s = sim.run();
  int64_t restored = -1;
  for (const Event& e : log.events())
    if (const auto* l = std::get_if<CheckpointLoaded>(&e.payload); l && l->tier == Tier::Storage) restored = l->step;
  CHECK(restored == 400);
  CHECK(s.checkpoints_persisted() == 2);
  // Progress since step 400 (at 500.8 s, i.e. 400 s of training) until the failure is recomputed.
  CHECK(s.loss(Loss::Recompute) == ms(498'900));
  check_sums(s);
}

TEST_CASE("periodic saves between disruptions are reported together, not one event each") {
  const Trace t = small_trace(100 * kHour);
  MemoryStore log;
  Simulator sim(t, policy(kFlashEvery100), SimOptions{}, {&log});
  const JobState& s = sim.run();
  CHECK(s.checkpoints_saved(Tier::Memory) == 3591);  // floor((360000 - 100) / 100.2) saves
  CHECK(s.checkpoints_persisted() == 3591);  // the last one, 2 s after 359918.2 s, is in time
  CHECK(log.events().size() < 30);
}

TEST_CASE("every policy sees the observation itself: Young/Daly re-plans after failures in a run") {
  // A regression: the checkpoint policy used to be shown the recovery decision instead of the
  // failure it answered, so it never re-planned.
  Trace t = small_trace(40 * kHour, 1);
  for (int i = 1; i <= 6; ++i) t.events.push_back(failure(i * 30 * kMinute, TraceEventType::ProcessCrash, "n1", t));
  MemoryStore log;
  Simulator sim(t, policy(R"({"checkpoint":{"policy":"young-daly","tier":"storage","mtbf_prior":"24h"},
                              "recovery":{"max_restarts_per_node":100}})"), SimOptions{}, {&log});
  sim.run();
  std::vector<int64_t> plans;
  bool after_failure = false;
  for (size_t i = 1; i < log.events().size(); ++i)
    if (const auto* p = std::get_if<CheckpointPlanSet>(&log.events()[i].payload)) {
      plans.push_back(p->every_steps);
      after_failure |= std::holds_alternative<RecoveryDecided>(log.events()[i - 1].payload);
    }
  REQUIRE(plans.size() >= 2);
  CHECK(after_failure);
  CHECK(plans.back() < plans.front());  // failures every 30 min shorten the interval
}

TEST_CASE("replacing a straggler beats running at its pace, and the report says why it was replaced") {
  // n1 runs at half speed from the first hour on; one spare is free. Ignoring it halves the job's
  // speed for 9 hours; replacing it costs a relaunch and the work since the last persisted save.
  Trace t = small_trace(10 * kHour, /*spares=*/1);
  TraceEvent slow = failure(kHour, TraceEventType::Slowdown, "n1", t);
  slow.slowdown_permille = 2000;
  t.events.push_back(slow);
  Simulator ignore(t, policy(kFlashEvery100), SimOptions{});
  const JobState& a = ignore.run();
  MemoryStore log;
  Simulator replace(t, policy(R"({"recovery":{"policy":"diagnose","replace_stragglers_above":1.5},
                                 "checkpoint":{"policy":"flash","every_steps":100,"persist_every":1}})"),
                    SimOptions{}, {&log});
  const JobState& b = replace.run();
  CHECK(a.loss(Loss::Slowdown) > 4 * kHour);
  CHECK(b.loss(Loss::Slowdown) == 0);
  CHECK(b.failures_by(Diagnosis::Straggler) == 1);
  CHECK_FALSE(b.holds(*t.machine_index("n1")));
  CHECK(b.holds(*t.machine_index("s0")));
  CHECK(make_report(b).goodput > make_report(a).goodput + 0.3);
  bool explained = false;
  for (const Event& e : log.events())
    if (const auto* d = std::get_if<RecoveryDecided>(&e.payload))
      explained |= d->diagnosis == Diagnosis::Straggler && d->rule.find("2.00x slower") != std::string::npos;
  CHECK(explained);
  check_sums(b);
}

TEST_CASE("an OOM recurs until the rank gets more memory: diagnosis fixes it, restart-all loops") {
  Trace t = small_trace(10 * kHour, 1);
  TraceEvent oom = failure(kHour, TraceEventType::ProcessCrash, "n1", t, "OOMKilled");
  oom.exit_code = 137;
  oom.signal = 9;
  oom.memory_needed_permille = 1400;  // needs 1.4x its memory limit
  t.events.push_back(oom);
  Simulator diagnose(t, policy(R"({"recovery":{"policy":"diagnose","oom_memory_factor":1.5}})"), SimOptions{});
  const JobState& a = diagnose.run();
  CHECK(a.failures() == 1);
  CHECK(a.decisions_by(RecoveryAction::RelaunchWithMoreMemory) == 1);
  Simulator small_steps(t, policy(R"({"recovery":{"policy":"diagnose","oom_memory_factor":1.2}})"), SimOptions{});
  CHECK(small_steps.run().decisions_by(RecoveryAction::RelaunchWithMoreMemory) == 2);  // 1.2, then 1.44
  Simulator restart_all(t, policy(R"({"recovery":{"policy":"restart-all"}})"), SimOptions{});
  const JobState& b = restart_all.run();
  CHECK(b.failures() > 30);  // every 10 minutes of training, for 9 hours
  CHECK(make_report(a).goodput > make_report(b).goodput + 0.05);
  check_sums(b);
}

TEST_CASE("a pause shorter than the hang timeout costs its length as a stall; a longer one is taken for a hang") {
  // The hang timeout is 5 min. A 2 min pause at 1000 s passes by itself: nothing is decided, and
  // exactly its 120 s are a stall. A 7 min pause at 2000 s is noticed at 2300 s as a hang and the
  // processes restart from the memory checkpoint.
  Trace t = small_trace(4000 * kSecond);
  TraceEvent short_pause = failure(1000 * kSecond, TraceEventType::Pause, "n1", t);
  short_pause.duration = 2 * kMinute;
  TraceEvent long_pause = failure(2000 * kSecond, TraceEventType::Pause, "n2", t, "storage stall");
  long_pause.duration = 7 * kMinute;
  t.events = {short_pause, long_pause};
  MemoryStore log;
  Simulator sim(t, policy(kFlashEvery100), SimOptions{}, {&log});
  const JobState& s = sim.run();
  CHECK(s.loss(Loss::Stall) == 120 * kSecond);
  CHECK(s.failures() == 1);
  CHECK(s.failures_by(Diagnosis::Unknown) == 1);
  CHECK(s.decisions_by(RecoveryAction::RestartProcess) == 1);
  CHECK(s.loss(Loss::Detection) == 5 * kMinute);
  std::vector<Event> stalls, failures;
  for (const Event& e : log.events()) {
    if (std::holds_alternative<StallObserved>(e.payload)) stalls.push_back(e);
    if (std::holds_alternative<FailureObserved>(e.payload)) failures.push_back(e);
  }
  REQUIRE(stalls.size() == 1);
  const auto& st = std::get<StallObserved>(stalls[0].payload);
  CHECK(st.stalled_since == 1000 * kSecond);
  CHECK(stalls[0].time == 1120 * kSecond);
  CHECK(st.resumed);
  CHECK(st.reason == "paused for 00:02:00.0");
  REQUIRE(failures.size() == 1);
  const auto& f = std::get<FailureObserved>(failures[0].payload);
  CHECK(f.kind == FailureKind::Hang);
  CHECK(f.stalled_since == 2000 * kSecond);
  CHECK(failures[0].time == 2300 * kSecond);
  CHECK(f.reason == "storage stall");
  // The short pause alone against no pause at all: 120 s less training, give or take a save.
  Trace with = t, without = t;
  with.events = {short_pause};
  without.events.clear();
  const JobState a = Simulator(with, policy(kFlashEvery100), SimOptions{}).run();
  const JobState w = Simulator(without, policy(kFlashEvery100), SimOptions{}).run();
  const Duration save = CheckpointCosts::from(t.job_started("x")).save(Tier::Memory);
  const Duration diff = w.productive() - a.productive();
  CHECK(diff >= 120 * kSecond - 2 * save);
  CHECK(diff <= 120 * kSecond + 2 * save);
  check_sums(s);
}

TEST_CASE("a trace's pauses are read, written and drawn from rates with their duration") {
  const std::string text =
      R"({"format":"goodput-trace","version":1,"name":"p","cluster":{"nodes":4},"job":{"duration":"10h"},)"
      R"("failure_rates":[{"type":"pause","reason":"link flap","per_node_hour":0.5,"duration":"3m"}]})"
      "\n"
      R"({"t":10,"type":"pause","rank":2,"duration":"90s"})"
      "\n";
  const Trace t = parse_trace(text, "p.jsonl");
  REQUIRE(t.events.size() == 1);
  CHECK(t.events[0].type == TraceEventType::Pause);
  CHECK(t.events[0].duration == 90 * kSecond);
  CHECK(t.rates.at(0).duration == 3 * kMinute);
  CHECK(write_trace(parse_trace(write_trace(t), "again")) == write_trace(t));
  const auto drawn = generate_failures(t, 3);
  REQUIRE(drawn.size() > 5);
  for (const TraceEvent& e : drawn) CHECK(e.duration == 3 * kMinute);
  CHECK_THROWS_WITH(parse_trace(R"({"format":"goodput-trace","version":1,"cluster":{"nodes":4},"job":{"duration":"1h"}})"
                                "\n"
                                R"({"t":10,"type":"pause","rank":2})",
                                "q.jsonl"),
                    doctest::Contains("q.jsonl:2: field 'duration' is missing"));
  CHECK_THROWS_WITH(parse_trace(R"({"format":"goodput-trace","version":1,"cluster":{"nodes":4},"job":{"duration":"1h"},)"
                                R"("failure_rates":[{"type":"pause","per_node_hour":1}]})",
                                "r.jsonl"),
                    doctest::Contains("duration"));
}

TEST_CASE("a recorded pause replays from the log as the same pause, and costs the same") {
  Trace t = small_trace(4000 * kSecond);
  TraceEvent pause = failure(1000 * kSecond, TraceEventType::Pause, "n1", t, "link flap");
  pause.duration = 150 * kSecond;
  t.events = {pause};
  MemoryStore log;
  const JobState recorded = Simulator(t, policy(kFlashEvery100), SimOptions{}, {&log}).run();
  const Trace back = trace_from_log(log, "log");
  REQUIRE(back.events.size() == 1);
  CHECK(back.events[0].type == TraceEventType::Pause);
  CHECK(back.events[0].t == 1000 * kSecond);
  CHECK(back.events[0].duration == 150 * kSecond);
  CHECK(back.events[0].reason == "link flap");
  const JobState again = Simulator(back, policy(kFlashEvery100), SimOptions{}).run();
  CHECK(again.loss(Loss::Stall) == recorded.loss(Loss::Stall));
  CHECK(again.productive() == recorded.productive());
}

TEST_CASE("an operator's scale in a trace grows the world on a spare and shrinks it back, restoring from storage") {
  // 4 nodes and one spare; at 1000.5 s a fifth node of the "ps" group is asked for, at 3000.5 s
  // it goes again. Each time the world restarts from the newest persisted checkpoint.
  const std::string text =
      R"({"format":"goodput-trace","version":1,"name":"s","cluster":{"nodes":4,"spare_nodes":1},)"
      R"("job":{"duration":"5000s","step_time":"1s","checkpoint_bytes_per_node":2000000000,)"
      R"("memory_bandwidth_bytes_per_s":10000000000,"storage_bandwidth_bytes_per_s":1000000000}})"
      "\n"
      R"({"t":1000.5,"type":"scale","group":"ps","from":1,"to":2,"reason":"more servers"})"
      "\n"
      R"({"t":3000.5,"type":"scale","group":"ps","from":2,"to":1})"
      "\n";
  const Trace t = parse_trace(text, "s.jsonl");
  REQUIRE(t.events.size() == 2);
  CHECK(t.events[0].type == TraceEventType::Scale);
  CHECK((t.events[0].group == "ps" && t.events[0].from == 1 && t.events[0].to == 2));
  CHECK(write_trace(parse_trace(write_trace(t), "again")) == write_trace(t));

  MemoryStore log;
  Simulator sim(t, policy(kFlashEvery100), SimOptions{}, {&log});
  const JobState& s = sim.run();
  std::vector<std::tuple<int32_t, int32_t, std::string, size_t>> scales;
  std::vector<std::pair<int32_t, Tier>> restarts;
  for (const Event& e : log.events()) {
    if (const auto* d = std::get_if<ScaleDecided>(&e.payload)) scales.emplace_back(d->from, d->to, d->group, d->released.size());
    if (const auto* r = std::get_if<RestartJob>(&e.payload)) restarts.emplace_back(r->world_size, r->restore_tier);
  }
  CHECK(scales == std::vector<std::tuple<int32_t, int32_t, std::string, size_t>>{{4, 5, "ps", 0}, {5, 4, "ps", 1}});
  CHECK(restarts == std::vector<std::pair<int32_t, Tier>>{{4, Tier::None}, {5, Tier::Storage}, {4, Tier::Storage}});
  CHECK(s.target_nodes() == 4);
  CHECK(s.world_size() == 4);
  CHECK(s.nodes_held() == 4);
  CHECK(s.loss(Loss::ReducedCapacity) == 0);  // five of five, then four of four
  CHECK(s.loss(Loss::Scheduling) == 2 * t.job.node_scheduling);  // the first world, then the spare for the fifth slot
  CHECK(s.loss(Loss::Recompute) > 0);
  check_sums(s);

  // The report's timeline: the released machine's lane ends at the second scale.
  TimelineBuilder tb;
  JobState fold;
  NodeId released = -1;
  Time released_at = 0;
  for (const Event& e : log.events()) {
    fold.apply(e);
    tb.add(e, fold);
    if (const auto* d = std::get_if<ScaleDecided>(&e.payload); d && !d->released.empty()) {
      released = d->released.front();
      released_at = e.time;
    }
  }
  const Timeline tl = tb.finish(fold);
  const auto lane = std::find_if(tl.lanes.begin(), tl.lanes.end(), [&](const Timeline::Lane& l) { return l.node == released; });
  REQUIRE(lane != tl.lanes.end());
  REQUIRE_FALSE(lane->spans.empty());
  CHECK(lane->spans.back().end == released_at);
  CHECK(lane->markers.back().label == "released: the ps group shrank");

  // A log with the requests in it replays with them, and decides the same.
  const Trace back = trace_from_log(log, "log");
  MemoryStore again;
  Simulator(back, policy(kFlashEvery100), SimOptions{}, {&again}).run();
  size_t replayed = 0;
  for (const Event& e : again.events()) replayed += std::holds_alternative<ScaleDecided>(e.payload);
  CHECK(replayed == 2);
}

namespace {
std::string flash_replicas(int k, const char* placement) {
  return std::string(R"({"name":"flash+replicas","checkpoint":{"policy":"flash","every_steps":100,"persist_every":1,"replicas":)") +
         std::to_string(k) + R"(,"placement":")" + placement + R"("}})";
}
// (step, tier) of every checkpoint_loaded in a log.
std::vector<std::pair<int64_t, Tier>> loads(const MemoryStore& log) {
  std::vector<std::pair<int64_t, Tier>> out;
  for (const Event& e : log.events())
    if (const auto* l = std::get_if<CheckpointLoaded>(&e.payload)) out.emplace_back(l->step, l->tier);
  return out;
}
}  // namespace

TEST_CASE("replicas: a lost node's rank restores from a peer's copy, at the network's cost, with nothing older recomputed") {
  // The slow-persist case above (storage only has step 400) with one copy of each save in the
  // next slot's memory: 2 GB over 12.5 GB/s is 0.16 s, done long before the next save. n0 dies at
  // 1000.5 s; slot 0's copy of step 800 is on slot 1: the relaunched node fetches it in 0.16 s.
  Trace t = small_trace(1500 * kSecond, /*spares=*/1);
  t.job.storage_bandwidth_bytes_per_s = 8'000'000;
  t.events.push_back(failure(ms(1'000'500), TraceEventType::NodeFailure, "n0", t, "Faulty GPU"));
  MemoryStore log, plain_log;
  Simulator sim(t, policy(flash_replicas(1, "ring")), SimOptions{}, {&log});
  Simulator plain(t, policy(kFlashEvery100), SimOptions{}, {&plain_log});
  const JobState& s = sim.run();
  const JobState& p = plain.run();
  CHECK(loads(log) == std::vector<std::pair<int64_t, Tier>>{{0, Tier::None}, {800, Tier::Peer}});
  CHECK(loads(plain_log) == std::vector<std::pair<int64_t, Tier>>{{0, Tier::None}, {400, Tier::Storage}});
  CHECK(s.loss(Loss::CheckpointLoad) == ms(160));
  CHECK(s.loss(Loss::Recompute) == ms(98'900));   // only since step 800, as a memory restore would
  CHECK(p.loss(Loss::Recompute) == ms(498'900));  // since step 400
  CHECK(s.checkpoints_replicated() >= 8);
  CHECK(s.restores_from(Tier::Peer) == 1);
  const Report r = make_report(s);
  CHECK(report_json(r)["restores"]["peer"] == 1);
  CHECK(report_text(r).find("1 from peers") != std::string::npos);
  // Copies are made beside training: a save blocks it for the memory copy only.
  CHECK(s.loss(Loss::CheckpointSave) == s.checkpoints_saved(Tier::Memory) * ms(200));
  check_sums(s);
}

TEST_CASE("replicas: a failure taking a node and its copy's holder goes to storage; groups place copies so it need not") {
  // n1 and n2 (slots 1 and 2) die together. Ring: slot 1's copy is on slot 2, gone too -> storage
  // (step 400, the slow persist). Groups of two, {0, 1} and {2, 3}: slot 1's copy is on 0 and
  // slot 2's on 3 -> both ranks come back from peers at step 800.
  Trace t = small_trace(1500 * kSecond, /*spares=*/2);
  t.job.storage_bandwidth_bytes_per_s = 8'000'000;
  t.events.push_back(failure(ms(1'000'500), TraceEventType::NodeFailure, "n1", t, "Faulty GPU"));
  t.events.push_back(failure(ms(1'000'500), TraceEventType::NodeFailure, "n2", t, "Faulty GPU"));
  MemoryStore ring_log, groups_log;
  Simulator ring(t, policy(flash_replicas(1, "ring")), SimOptions{}, {&ring_log});
  Simulator groups(t, policy(flash_replicas(1, "groups")), SimOptions{}, {&groups_log});
  const JobState& r = ring.run();
  const JobState& g = groups.run();
  CHECK(loads(ring_log).back() == std::pair<int64_t, Tier>{400, Tier::Storage});
  CHECK(loads(groups_log).back() == std::pair<int64_t, Tier>{800, Tier::Peer});
  CHECK(r.loss(Loss::Recompute) == ms(498'900));
  CHECK(g.loss(Loss::Recompute) == ms(98'900));
  // Two copies in a ring (slots 2 and 3 hold slot 1's) survive it as well.
  MemoryStore two_log;
  Simulator two(t, policy(flash_replicas(2, "ring")), SimOptions{}, {&two_log});
  two.run();
  CHECK(loads(two_log).back() == std::pair<int64_t, Tier>{800, Tier::Peer});
  check_sums(r);
  check_sums(g);
}

TEST_CASE("replicas: a slow network copies every other save, and a node lost mid-copy restores the newest copy that arrived") {
  // 2 GB over 10 MB/s: a copy takes 200 s, saves come every 100.2 s (done at 100 + 100.2 j s).
  // Copies of steps 100 (200.2 -> 400.2 s), 300 (400.6 -> 600.6 s), 500 (601.0 -> 801.0 s) arrive;
  // step 700's (801.4 -> 1001.4 s) is under way when n0 dies at 1000.5 s. Storage has step 400.
  Trace t = small_trace(1500 * kSecond, /*spares=*/1);
  t.job.storage_bandwidth_bytes_per_s = 8'000'000;
  t.job.network_bandwidth_bytes_per_s = 10'000'000;
  t.events.push_back(failure(ms(1'000'500), TraceEventType::NodeFailure, "n0", t, "Faulty GPU"));
  MemoryStore log;
  Simulator sim(t, policy(flash_replicas(1, "ring")), SimOptions{}, {&log});
  const JobState& s = sim.run();
  // Copies are reported with the saves, in batches: three arrived before the failure, the newest 500.
  int64_t copies = 0, newest = 0;
  for (const Event& e : log.events())
    if (const auto* r = std::get_if<ReplicaStored>(&e.payload); r && e.time < ms(1'000'500)) {
      copies += r->count;
      newest = r->step;
    }
  CHECK(copies == 3);
  CHECK(newest == 500);
  CHECK(loads(log).back() == std::pair<int64_t, Tier>{500, Tier::Peer});
  CHECK(s.loss(Loss::CheckpointLoad) == 200 * kSecond);  // the fetch over the slow link
  CHECK(s.loss(Loss::Recompute) == ms(398'900));
  check_sums(s);
}

TEST_CASE("replicas: the policy refuses them on storage checkpoints and names a bad placement; goodput run refuses them for now") {
  CHECK_THROWS_WITH_AS(policy(R"({"checkpoint":{"policy":"fixed","every_steps":10,"tier":"storage","replicas":1}})"),
                       doctest::Contains("replicas"), PolicyError);
  CHECK_THROWS_WITH_AS(policy(R"({"checkpoint":{"policy":"flash","every_steps":10,"replicas":1,"placement":"star"}})"),
                       doctest::Contains("placement"), PolicyError);
  CHECK_NOTHROW(policy(R"({"checkpoint":{"policy":"flash","every_steps":10,"replicas":0,"placement":"groups"}})"));
  CHECK_THROWS_WITH_AS(policy(R"({"checkpoint":{"policy":"flash","every_steps":10,"replicas":65}})"),
                       doctest::Contains("replicas"), PolicyError);
  const Trace t = small_trace(kHour);
  CHECK(write_trace(t).find("network_bandwidth") == std::string::npos);
  Trace n = t;
  n.job.network_bandwidth_bytes_per_s = 5'000'000'000;
  CHECK(parse_trace(write_trace(n), "n.jsonl").job.network_bandwidth_bytes_per_s == 5'000'000'000);
}

TEST_CASE("a live log whose first world had a spare (slot -1) replays it as a spare machine, not as machine -1") {
  // Two ranks and a spare join; the spare later takes slot 0 and its machine fails: the failure
  // must land on a real machine of the replay (the spare's), not be lost or put on an index of -1.
  MemoryStore log;
  Time t = 0;
  uint64_t seq = 0;
  auto add = [&](Duration dt, EventPayload p) { log.append(Event{++seq, t += dt, std::move(p)}); };
  add(0, JobStarted{"j", 2, 8, kSecond, 0, 2'000'000'000, 10'000'000'000, 1'000'000'000, "p"});
  add(kSecond, NodeJoined{0, 0, "local-0", ""});
  add(0, NodeJoined{1, 1, "local-1", ""});
  add(0, NodeJoined{2, -1, "local-2", ""});
  add(0, RestartJob{2, 0, 0, 0, Tier::None});
  add(30 * kSecond, ProcessesStarted{2, 0});
  add(10 * kSecond, RendezvousComplete{2, 0});
  add(0, CheckpointLoaded{0, Tier::None, 0});
  add(100 * kSecond, FailureObserved{0, FailureKind::NodeLost, 0, 0, "gone", t + 70 * kSecond});
  add(0, RecoveryDecided{0, Diagnosis::HardwareError, RecoveryAction::RelaunchNode, 1, 0, 1000, "hw"});
  add(0, RestartJob{2, 1, 0, 0, Tier::None});
  add(30 * kSecond, ProcessesStarted{2, 1});
  add(10 * kSecond, RendezvousComplete{2, 1});
  add(0, CheckpointLoaded{0, Tier::None, 0});
  add(100 * kSecond, FailureObserved{2, FailureKind::NodeLost, 0, 0, "the spare's machine", t + 70 * kSecond});
  add(60 * kSecond, JobFinished{"stopped", 0});
  const Trace back = trace_from_log(log, "log");
  CHECK(back.cluster.nodes == 2);
  CHECK(back.cluster.spare_nodes == 1);
  REQUIRE(back.events.size() == 2);
  CHECK(back.events[0].node == 0);
  CHECK(back.events[1].node == 2);  // the spare: the machine after the two ranks'
  check_sums(Simulator(back, policy(kFlashEvery100), SimOptions{}).run());
}
