// Policies are pure functions of state and event; these tests feed them states and read decisions.
#include <doctest/doctest.h>

#include "engine/event_json.h"
#include "policies/policy.h"
#include "test_util.h"

using namespace goodput;

namespace {
FailureObserved exit_with(int code, int sig, const char* reason) {
  return FailureObserved{0, FailureKind::ProcessExit, code, sig, reason, 0};
}
Diagnosis diagnose(const FailureObserved& f) { return DiagnosisTable::defaults().diagnose(f).diagnosis; }

JobState running_state(int nodes = 4) {
  JobState s;
  uint64_t seq = 0;
  s.apply(Event{++seq, 0, JobStarted{"j", nodes, 8, kSecond, 0, 2'000'000'000, 10'000'000'000, 1'000'000'000, "p"}});
  for (int i = 0; i < nodes; ++i) s.apply(Event{++seq, 0, NodeJoined{i, i, "n" + std::to_string(i), ""}});
  return s;
}
}  // namespace

TEST_CASE("the default diagnosis table reads exit codes, signals, kinds and reasons") {
  CHECK(diagnose(exit_with(137, 9, "OOMKilled")) == Diagnosis::OutOfMemory);
  CHECK(diagnose(exit_with(1, 0, "torch.cuda.OutOfMemoryError: CUDA out of memory")) == Diagnosis::OutOfMemory);
  CHECK(diagnose(exit_with(1, 0, "RuntimeError: shape mismatch")) == Diagnosis::SoftwareError);
  CHECK(diagnose(exit_with(-11, 11, "")) == Diagnosis::SoftwareError);
  CHECK(diagnose(exit_with(1, 0, "NCCL error: unhandled system error, Xid 79 GPU has fallen off the bus")) ==
        Diagnosis::HardwareError);
  CHECK(diagnose(FailureObserved{0, FailureKind::NodeLost, 0, 0, "", 0}) == Diagnosis::HardwareError);
  CHECK(diagnose(FailureObserved{0, FailureKind::Hang, 0, 0, "", 0}) == Diagnosis::Unknown);
  CHECK(diagnose(FailureObserved{0, FailureKind::Maintenance, 0, 0, "", 0}) == Diagnosis::Preemption);
  // An eviction moves the pod elsewhere, whatever the node was short of.
  CHECK(diagnose(exit_with(1, 0, "The node was low on resource: memory. Evicted")) == Diagnosis::Preemption);
  CHECK(diagnose(exit_with(0, 0, "Pod was Evicted by the kubelet")) == Diagnosis::Preemption);
}

TEST_CASE("a job that cannot run is a configuration error and gives up at once, with the reason") {
  // Exit 126/127 (the shell's "cannot execute" and "not found", and the agent's exec failure), or
  // the agent's "cannot run": nothing a restart or another machine can fix.
  CHECK(diagnose(exit_with(127, 0, "goodput agent: cannot run /nonexistent/python9: No such file or directory")) ==
        Diagnosis::ConfigurationError);
  CHECK(diagnose(exit_with(126, 0, "")) == Diagnosis::ConfigurationError);
  // A Python import or syntax error is one only before the job trained: later it is a bug.
  const FailureObserved import = exit_with(1, 0, "ModuleNotFoundError: No module named 'transformerz'");
  const DiagnosisTable table = DiagnosisTable::defaults();
  CHECK(table.diagnose(import, /*trained=*/false).diagnosis == Diagnosis::ConfigurationError);
  CHECK(table.diagnose(import, /*trained=*/true).diagnosis == Diagnosis::SoftwareError);
  const auto p = default_policy();
  JobState s = running_state();
  const FailureObserved f = exit_with(127, 0, "goodput agent: cannot run /nonexistent/python9: No such file or directory");
  s.apply(Event{s.last_seq() + 1, kSecond, f});
  const RecoveryDecided d = p.recovery->on_failure(s, f);
  CHECK(d.diagnosis == Diagnosis::ConfigurationError);
  CHECK(d.action == RecoveryAction::GiveUp);
  CHECK(d.rule == "cannot-exec: goodput agent: cannot run /nonexistent/python9: No such file or directory");
  // A policy may still choose otherwise for it.
  const auto lenient = load_policy(nlohmann::json::parse(R"({"recovery":{"actions":{"configuration_error":"restart_process"}}})"));
  CHECK(lenient.recovery->on_failure(s, f).action == RecoveryAction::RestartProcess);
}

TEST_CASE("the same failure again and again before the job trains backs off, is no node's fault, and gives up") {
  // Every restart dies the same way before its trainers loaded anything (a bad flag, say): the
  // restarts back off 1 s, 2 s, 4 s; no node is relaunched for it (it would fail anywhere); the
  // fifth gives up. restart-all (torchrun's way) stops the same way.
  for (const char* name : {"diagnose", "restart-all"}) {
    CAPTURE(name);
    const auto p = load_policy(nlohmann::json{{"recovery", {{"policy", name}, {"max_restarts_per_node", 1}}}});
    JobState s = running_state(2);
    const FailureObserved f = exit_with(2, 0, "train.py: error: unrecognized arguments: --lr-schedual");
    std::vector<Duration> backoffs;
    for (int i = 1; i <= 5; ++i) {
      s.apply(Event{s.last_seq() + 1, i * kSecond, RestartJob{2, i - 1, 0, 0, Tier::None}});
      s.apply(Event{s.last_seq() + 1, i * kSecond, f});
      const RecoveryDecided d = p.recovery->on_failure(s, f);
      s.apply(Event{s.last_seq() + 1, i * kSecond, d});
      backoffs.push_back(d.backoff);
      if (i < 5) CHECK(d.action == RecoveryAction::RestartProcess);
      else {
        CHECK(d.action == RecoveryAction::GiveUp);
        CHECK(d.rule.find("the same failure 5 times before the job trained") != std::string::npos);
        CHECK(d.rule.find("--lr-schedual") != std::string::npos);
      }
    }
    CHECK(backoffs == std::vector<Duration>{0, kSecond, 2 * kSecond, 4 * kSecond, 8 * kSecond});
  }
  // Once the job trained, the count starts over: a crash of a running trainer is no startup failure.
  const auto p = default_policy();
  JobState s = running_state(2);
  const FailureObserved f = exit_with(1, 0, "boom");
  for (int i = 1; i <= 8; ++i) {
    s.apply(Event{s.last_seq() + 1, i * kMinute, RestartJob{2, i - 1, 0, 0, Tier::None}});
    s.apply(Event{s.last_seq() + 1, i * kMinute, CheckpointLoaded{0, Tier::None, 0}});
    s.apply(Event{s.last_seq() + 1, i * kMinute + kSecond, f});
    CHECK(p.recovery->on_failure(s, f).action != RecoveryAction::GiveUp);
    CHECK(s.repeated_startup_failures() == 0);
  }
}

TEST_CASE("a policy file can replace the diagnosis table and the action per diagnosis") {
  const auto p = load_policy(nlohmann::json::parse(R"({
    "recovery": {"policy": "diagnose",
                 "diagnosis": [{"name": "segv", "signals": [11], "diagnosis": "hardware_error"},
                               {"name": "rest", "diagnosis": "software_error"}],
                 "actions": {"software_error": "give_up"}}})"));
  JobState s = running_state();
  s.apply(Event{s.last_seq() + 1, 1, exit_with(-11, 11, "")});
  auto d = p.recovery->on_failure(s, exit_with(-11, 11, ""));
  CHECK(d.diagnosis == Diagnosis::HardwareError);
  CHECK(d.action == RecoveryAction::RelaunchNode);
  CHECK(d.rule == "segv");
  d = p.recovery->on_failure(s, exit_with(1, 0, ""));
  CHECK(d.action == RecoveryAction::GiveUp);
}

TEST_CASE("OOM relaunches with more memory; backoff doubles while no checkpoint lands") {
  const auto p = load_policy(nlohmann::json::parse(
      R"({"recovery": {"policy": "diagnose", "oom_memory_factor": 2.0, "backoff_base": "10s", "backoff_max": "35s"}})"));
  JobState s = running_state();
  const auto oom = exit_with(137, 9, "OOMKilled");
  Duration expected[] = {10 * kSecond, 20 * kSecond, 35 * kSecond, 35 * kSecond};
  for (Duration e : expected) {
    s.apply(Event{s.last_seq() + 1, s.now() + 1, oom});
    const auto d = p.recovery->on_failure(s, oom);
    CHECK(d.action == RecoveryAction::RelaunchWithMoreMemory);
    CHECK(d.memory_permille == 2000);
    CHECK(d.backoff == e);
  }
  s.apply(Event{s.last_seq() + 1, s.now() + 1, CheckpointSaved{10, Tier::Memory, 0, false}});
  s.apply(Event{s.last_seq() + 1, s.now() + 1, oom});
  CHECK(p.recovery->on_failure(s, oom).backoff == 10 * kSecond);
}

TEST_CASE("restart-all ignores diagnosis and restores from storage only") {
  const auto p = load_policy(nlohmann::json::parse(R"({"recovery": {"policy": "restart-all"}})"));
  JobState s = running_state();
  CHECK_FALSE(p.recovery->restore_from_memory());
  CHECK(p.recovery->on_failure(s, exit_with(137, 9, "OOMKilled")).action == RecoveryAction::RestartProcess);
  CHECK(p.recovery->on_failure(s, FailureObserved{0, FailureKind::NodeLost, 0, 0, "", 0}).action ==
        RecoveryAction::RelaunchNode);
}

TEST_CASE("Young/Daly plans Daly's higher-order optimum and re-plans as failures are seen") {
  const auto p = load_policy(nlohmann::json::parse(
      R"({"checkpoint": {"policy": "young-daly", "tier": "storage", "mtbf_prior": "8h"}})"));
  JobState s = running_state();
  const EventPayload start = s.job();
  auto plan = p.checkpoint->plan(s, start);
  REQUIRE(plan);
  // Save to storage: 2 GB at 1 GB/s = 2 s (delta). sqrt(2 * 2 s * 28800 s) = 339.4 s (Young);
  // Daly: 339.4 * (1 + sqrt(2 / 57600) / 3 + (2 / 57600) / 9) - 2 = 338.1 s -> 338 one-second steps.
  CHECK(plan->every_steps == 338);
  CHECK(plan->tier == Tier::Storage);
  s.apply(Event{s.last_seq() + 1, s.now(), *plan});
  // Seven failures in the first hour: MTBF estimate (1 h + 8 h) / 8 = 4050 s -> Young sqrt(2*2*4050)
  // = 127.3 s; Daly 127.3 * (1 + sqrt(2 / 8100) / 3 + (2 / 8100) / 9) - 2 = 125.9 s.
  for (int i = 0; i < 7; ++i) s.apply(Event{s.last_seq() + 1, kHour, exit_with(1, 0, "")});
  const EventPayload f = exit_with(1, 0, "");
  auto replan = p.checkpoint->plan(s, f);
  REQUIRE(replan);
  CHECK(replan->every_steps == 126);
}

TEST_CASE("Daly's interval departs from Young's when the save cost is not small against the MTBF") {
  // The issue's numbers: delta = 10 min, M = 2 h -> Young 49.0 min, Daly 42.5 min.
  CHECK(to_seconds(young_interval(10 * kMinute, 2 * kHour)) == doctest::Approx(2939.4).epsilon(1e-4));
  CHECK(to_seconds(daly_interval(10 * kMinute, 2 * kHour)) == doctest::Approx(2553.0).epsilon(1e-4));
  // Small delta: the two agree to within delta.
  CHECK(std::abs(daly_interval(kSecond, 10 * kHour) - young_interval(kSecond, 10 * kHour)) < kSecond);
  // delta >= 2M: checkpoint once per MTBF.
  CHECK(daly_interval(3 * kHour, kHour) == kHour);
  CHECK(daly_interval(0, kHour) == 0);
}

TEST_CASE("elastic scaling shrinks when no spare is free and grows when a node joins") {
  const auto p = load_policy(nlohmann::json::parse(R"({"scaling": {"policy": "elastic", "min_nodes": 3}})"));
  JobState s = running_state(4);
  s.apply(Event{s.last_seq() + 1, 1, RecoveryDecided{2, Diagnosis::HardwareError, RecoveryAction::RelaunchNode, 1, 0, 1000, ""}});
  const EventPayload none = NoSpareNode{2};
  // A parameter server's or chief's slot: giving up a slot cannot stand in for it.
  CHECK_FALSE(p.scaling->decide(s, EventPayload{NoSpareNode{2, true}}));
  auto d = p.scaling->decide(s, none);
  REQUIRE(d);
  CHECK(d->to == 3);
  s.apply(Event{s.last_seq() + 1, 2, *d});
  s.apply(Event{s.last_seq() + 1, 3, NodeJoined{7, 2, "s0", ""}});
  const EventPayload joined = NodeJoined{7, 2, "s0", ""};
  d = p.scaling->decide(s, joined);
  REQUIRE(d);
  CHECK(d->to == 4);
  // Below min_nodes it waits instead.
  JobState t = running_state(3);
  t.apply(Event{t.last_seq() + 1, 1, RecoveryDecided{2, Diagnosis::HardwareError, RecoveryAction::RelaunchNode, 1, 0, 1000, ""}});
  CHECK_FALSE(p.scaling->decide(t, none));
}

TEST_CASE("bad policy files name the field that is wrong") {
  auto err = [](const char* json) {
    try {
      load_policy(nlohmann::json::parse(json));
    } catch (const PolicyError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(err(R"({"recovery": {"policy": "pray"}})").find("recovery.policy' names no known policy: 'pray'") != std::string::npos);
  CHECK(err(R"({"recovery": {"max_restarts_per_node": -1}})").find("recovery.max_restarts_per_node") != std::string::npos);
  CHECK(err(R"({"checkpoint": {"policy": "fixed", "interval": "soon"}})").find("checkpoint.interval' is not a valid duration") != std::string::npos);
  CHECK(err(R"({"checkpoint": {"policy": "fixed", "tier": "storage", "persist_every": 2}})").find("persist_every") != std::string::npos);
  CHECK(err(R"({"scaling": {"policy": "elastic", "min_nodez": 2}})").find("scaling.min_nodez' is not a known setting") != std::string::npos);
  CHECK(err(R"({"recovery": {"diagnosis": [{"diagnosis": "gremlins"}]}})").find("recovery.diagnosis[0].diagnosis") != std::string::npos);
  CHECK(err(R"({"recovery": {"actions": {"software_error": "reboot the datacenter"}}})").find("recovery.actions.software_error") != std::string::npos);
  CHECK(err(R"({"recovry": {}})").find("'recovry' is not a known setting") != std::string::npos);
  CHECK(err(R"([1,2])").find("must be a JSON object") != std::string::npos);
}

TEST_CASE("sweep settings are set by dotted path, typed where they look like numbers") {
  nlohmann::json c = nlohmann::json::object();
  set_config_path(c, "checkpoint.interval", "10m");
  set_config_path(c, "recovery.max_restarts_per_node", "5");
  set_config_path(c, "recovery.policy", "restart-all");
  CHECK(c["checkpoint"]["interval"] == "10m");
  CHECK(c["recovery"]["max_restarts_per_node"] == 5);
  CHECK(c["recovery"]["policy"] == "restart-all");
  CHECK_THROWS_AS(set_config_path(c, "a..b", "1"), PolicyError);
}
