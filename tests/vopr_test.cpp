// The live master under seeded simulation (vopr/vopr.h): the seeds that found bugs first, then a
// few hundred more, the runs' determinism, and that the checks catch a master that loses what it
// acknowledged. Each bug the simulation found also has a direct test here of the part that was
// wrong. Long campaigns: `goodput vopr --seeds 100000`, scripts/fuzz.sh.
#include <doctest/doctest.h>

#include <cstdlib>
#include <set>

#include "master_harness.h"
#include "vopr/vopr.h"

using namespace goodput;
using nlohmann::json;

namespace {

vopr::Result run_seed(uint64_t seed, int32_t nodes = 3) {
  vopr::Options o;
  o.seed = seed;
  o.nodes = nodes;
  return vopr::run(o);
}

}  // namespace

// Each seed found a bug, fixed since; they are replayed before anything else. (A seed reproduces a
// run of the simulation as it was when found; the simulation has grown since, so these are now
// runs that once failed, and each fix also has a direct test below.)
TEST_CASE("vopr: the regression seeds pass") {
  struct Regression {
    uint64_t seed;
    int32_t nodes;
    const char* found;
  };
  const Regression seeds[] = {
      {9, 3, "a shard completion delivered after the job finished threw out of the API (logic_error)"},
      {10, 3, "the same, another path"},
      {21, 3, "a CheckpointLoaded logged late (a rank's report delayed) requeued the restart's own completed shards"},
      {51, 3, "a stale copy of an old shard request, delivered late, was handed a new shard nobody trained"},
      {5, 3, "a node lost before it joined was relaunched before its no_spare_node was durable"},
      {12, 3, "a machine that died before registering, unseen by its provider, left its slot vacant for ever"},
      {184, 3, "shards acknowledged after their checkpoint committed: a rank dead in between left them in the model twice"},
      {1380, 3, "a storage step of two histories (one rank's file from a world given up) counted complete"},
      {1815, 3, "the same: a restore loaded a step storage no longer had"},
      {511, 3, "(the simulation's own) trainers ran ahead of a rank waiting on the master"},
      {40, 2, "shards lost across a restore in a two-node job"},
      {204257, 3, "a memory step of two histories restored (one rank had not re-saved it since the world it came from)"},
      {204130, 3, "a rank that loaded first got no shard (the ledger still counted the given-up history's work) and the shards stayed untrained"},
  };
  for (const Regression& r : seeds) {
    CAPTURE(r.found);
    vopr::Options o;
    o.seed = r.seed;
    o.nodes = r.nodes;
    const vopr::Result res = vopr::run(o);
    CHECK_MESSAGE(res.ok, vopr::describe(o, res));
    CHECK(res.completed);
  }
}

TEST_CASE("vopr: 300 seeds keep every invariant and complete once the faults stop") {
  std::map<std::string, int64_t> faults, logged;
  int64_t restarts = 0;
  // GOODPUT_VOPR_SEEDS: fewer under the sanitizers (scripts/test.sh), more by hand.
  const char* env = std::getenv("GOODPUT_VOPR_SEEDS");
  const uint64_t count = env ? std::strtoull(env, nullptr, 10) : 300;
  for (uint64_t seed = 1; seed <= count; ++seed) {
    const vopr::Result r = run_seed(seed, static_cast<int32_t>(1 + seed % 5));
    vopr::Options o;
    o.seed = seed;
    o.nodes = static_cast<int32_t>(1 + seed % 5);
    REQUIRE_MESSAGE(r.ok, vopr::describe(o, r));
    CHECK(r.completed);
    restarts += r.master_restarts;
    for (const auto& [k, v] : r.faults) faults[k] += v;
    for (const auto& [k, v] : r.logged) logged[k] += v;
  }
  // Every kind of fault was injected (the runs exercised them, not only configured them).
  if (count < 100) return;
  for (const char* kind : {"request_dropped", "request_delayed", "request_duplicated", "answer_dropped", "agent_died",
                           "agent_silent", "agent_restarted", "trainer_crashed", "trainer_hung", "straggler", "launch_lost",
                           "master_crash"})
    CHECK_MESSAGE(faults[kind] > 0, kind);
  CHECK(restarts > 0);
  // ...and the master saw them for what they are: failures of every kind, stragglers measured.
  for (const char* type : {"failure_observed", "slowdown_observed", "recovery_decided", "no_spare_node"})
    CHECK_MESSAGE(logged[type] > 0, type);
}

TEST_CASE("vopr: one seed is one run, byte for byte; another seed is another") {
  const vopr::Result a = run_seed(77), b = run_seed(77), c = run_seed(78);
  REQUIRE(a.ok);
  CHECK(a.log_digest == b.log_digest);
  CHECK(a.history == b.history);
  CHECK(a.events == b.events);
  CHECK(a.faults == b.faults);
  CHECK(a.log_digest != c.log_digest);
  // Without faults the job simply completes, and its master never restarts.
  vopr::Options calm;
  calm.faults = false;
  const vopr::Result quiet = vopr::run(calm);
  CHECK(quiet.ok);
  CHECK(quiet.completed);
  CHECK(quiet.master_restarts == 0);
  CHECK(quiet.faults.empty());
}

TEST_CASE("vopr: a disk that loses an event it said was durable is caught, with the seed to reproduce it") {
  bool caught = false;
  for (uint64_t seed = 1; seed <= 50 && !caught; ++seed) {
    vopr::Options o;
    o.seed = seed;
    o.lying_disk = true;
    const vopr::Result r = vopr::run(o);
    if (r.master_restarts == 0) continue;  // the lie shows only when the master resumes
    CHECK_FALSE(r.ok);
    CHECK(r.failure.find("resumed without event") != std::string::npos);
    const std::string text = vopr::describe(o, r);
    CHECK(text.find("reproduce: goodput vopr --seed " + std::to_string(seed)) != std::string::npos);
    CHECK(text.find("master crashes") != std::string::npos);  // the history that led there
    caught = true;
  }
  CHECK(caught);
}

// ---- the parts the simulation found wrong, each tested directly ----------------------------------

TEST_CASE("the shard ledger keeps what a restart trained before its checkpoint_loaded was logged") {
  ShardLedger l;
  l.reset(6);
  uint64_t seq = 0;
  auto apply = [&](EventPayload p) { l.apply(Event{++seq, 0, std::move(p)}); };
  apply(ShardsAssigned{0, 0, {0}});
  apply(ShardsCompleted{0, 40, {0}});      // restart 0's work up to step 40
  apply(RestartJob{1, 1, 0, 20, Tier::Memory});
  apply(ShardsAssigned{0, 0, {1}});
  apply(ShardsCompleted{0, 40, {1}});      // restart 1 trained from 20 to 40 before its load was logged...
  apply(CheckpointLoaded{20, Tier::Memory, 0});  // ...late: it loaded 20
  CHECK(l.done_by(1, 0));   // restart 1's own work stays done
  CHECK_FALSE(l.done_by(0, 0));  // restart 0's work after step 20 is gone from the model
  CHECK(l.done() == 1);
  CHECK(l.next_queued() == 0);
}

TEST_CASE("a shard request before the world's load is logged, or a stale one delivered late, gets no shard") {
  test::Harness h(test::Harness::Spec{json{{"job", "st"}, {"nodes", 1}, {"command", {"true"}}, {"total_steps", 10},
                                           {"heartbeat_timeout", "1h"}, {"hang_timeout", "1h"}, {"data_shards", 10}}});
  const int32_t a = h.join("a", 7001);
  h.tick(10 * kSecond);
  json trainer{{"restart", 0}, {"phase", "training"}, {"step", 1}, {"loaded", {{"step", 0}, {"tier", "none"}, {"ns", 0}}}};
  // Not before the log has the step the world loaded: a rank that loaded first asks again.
  h.post("/v1/heartbeat", json{{"node", a}, {"trainer", {{"restart", 0}, {"phase", "rendezvous"}}}});
  REQUIRE(h.master->state().phase() == Phase::CheckpointLoad);
  const auto loading = h.request("/v1/shards/next", json{{"node", a}, {"restart", 0}, {"request", 0}});
  CHECK(loading.status == 409);
  CHECK(loading.body.find("still loading") != std::string::npos);
  CHECK(h.events("shards_assigned").empty());
  for (int i = 0; i < 3; ++i) h.post("/v1/heartbeat", json{{"node", a}, {"trainer", trainer}});
  REQUIRE(h.master->state().phase() == Phase::Training);
  const json s0 = h.post("/v1/shards/next", json{{"node", a}, {"restart", 0}, {"request", 0}});
  const json s1 = h.post("/v1/shards/next", json{{"node", a}, {"restart", 0}, {"request", 1}});
  CHECK(s0["shard"] != s1["shard"]);
  const auto late = h.request("/v1/shards/next", json{{"node", a}, {"restart", 0}, {"request", 0}});
  CHECK(late.status == 409);
  CHECK(late.body.find("older than the last one answered") != std::string::npos);
  CHECK(h.events("shards_assigned").size() == 2);
  // After the job has finished, a late completion is refused (it was an uncaught error before).
  h.post("/v1/shards/complete", json{{"node", a}, {"restart", 0}, {"step", 5}, {"shards", {s0["shard"], s1["shard"]}}});
  trainer["phase"] = "exited";
  trainer["done"] = true;
  trainer["step"] = 10;
  trainer["exit"] = {{"code", 0}, {"signal", 0}, {"reason", ""}, {"done", true}, {"age_ms", 0}};
  h.post("/v1/exit", json{{"node", a}, {"trainer", trainer}});
  REQUIRE(h.master->finished());
  const auto after = h.request("/v1/shards/complete", json{{"node", a}, {"restart", 0}, {"step", 10}, {"shards", {s1["shard"]}}});
  CHECK(after.status == 409);
  CHECK(after.body.find("the job has finished") != std::string::npos);
}

TEST_CASE("a slot whose machine never registers gets another after join_timeout") {
  test::Harness h(test::Harness::Spec{json{{"job", "jt"}, {"nodes", 2}, {"command", {"true"}}, {"total_steps", 10},
                                           {"heartbeat_timeout", "1h"}, {"hang_timeout", "1h"}, {"join_timeout", "30s"}}});
  CHECK(h.provider.calls == std::vector<std::string>{"launch 0 1000", "launch 1 1000"});
  h.join("a", 7001);  // slot 0's machine came; slot 1's never will, and its provider says nothing
  h.tick(1);           // the master's first look: slot 1 is vacant
  h.tick(20 * kSecond);
  CHECK(h.provider.calls.size() == 2);
  h.tick(11 * kSecond);
  CHECK(h.provider.calls == std::vector<std::string>{"launch 0 1000", "launch 1 1000", "launch 1 1000"});
  h.tick(10 * kSecond);
  CHECK(h.provider.calls.size() == 3);  // asked again only after another join_timeout
  h.join("b", 7002);
  h.tick(60 * kSecond);
  CHECK(h.provider.calls.size() == 3);
  CHECK(h.master->world().ranks_held());
}

TEST_CASE("the culprit of a failure is the rank killed, not a peer that aborted because the connection closed") {
  // Found under the parallel test run (not by the VOPR): gloo aborts a rank whose peer died
  // (SIGABRT, "Connection closed by peer"), and that exit can reach the master first.
  live::Node a, b;
  a.id = 0;
  b.id = 1;
  a.trainer.restart = b.trainer.restart = 3;
  a.trainer.exited = b.trainer.exited = true;
  a.trainer.exit_signal = 6;
  a.trainer.exit_reason = "terminate called after throwing gloo::IoException: [pair.cc:598] Connection closed by peer [127.0.0.1]:28905";
  a.trainer.exited_at = 1 * kSecond;
  b.trainer.exit_signal = 9;
  b.trainer.exit_reason = "local rank 1 (rank 3): killed by signal 9 (Killed)";
  b.trainer.exited_at = 2 * kSecond;
  const live::Ranks ranks{&a, &b};
  CHECK(live::exit_culprit(ranks, 3) == &b);
  b.trainer.exit_signal = 0;  // an exit code with a reason of its own still beats the collateral abort
  b.trainer.exit_reason = "RuntimeError: CUDA error";
  CHECK(live::exit_culprit(ranks, 3) == &b);
}
