// The pre-flight node check: the agent's probes against real arithmetic and real TCP sockets, and
// the master's pairing and verdicts driven through its HTTP handler with a real SQLite log. (Real
// agents and PyTorch trainers going through a check: tests/python/test_live.py.)
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <set>

#include "agent/node_check.h"
#include "backends/live/job_spec.h"
#include "backends/live/live_master.h"
#include "engine/event_json.h"
#include "engine/event_store.h"
#include "policies/policy.h"
#include "master_harness.h"

using namespace goodput;
using namespace goodput::test;
using nlohmann::json;
namespace fs = std::filesystem;

TEST_CASE("the compute probe checks every product against the exact result") {
  const auto good = agent::compute_probe(std::chrono::milliseconds(50));
  CHECK(good.ok);
  CHECK(good.error.empty());
  CHECK(good.mflops > 0);
  const auto bad = agent::compute_probe(std::chrono::milliseconds(50), 1, /*corrupt=*/true);
  CHECK_FALSE(bad.ok);
  CHECK(bad.error.find("differs from the exact result at (17,42)") != std::string::npos);
}

TEST_CASE("the link probe moves real bytes over TCP and fails for a wrong token, a dead link or no listener") {
  agent::LinkProbeServer server("job-token");
  REQUIRE(server.port() > 0);
  const auto ok = agent::link_probe("127.0.0.1", server.port(), "job-token", 8 << 20, std::chrono::seconds(10));
  CHECK_MESSAGE(ok.ok, ok.error);
  CHECK(ok.mb_per_s > 0);

  const auto wrong = agent::link_probe("127.0.0.1", server.port(), "other-token", 1 << 20, std::chrono::seconds(10));
  CHECK_FALSE(wrong.ok);

  server.set_down(true);
  const auto down = agent::link_probe("127.0.0.1", server.port(), "job-token", 1 << 20, std::chrono::seconds(10));
  CHECK_FALSE(down.ok);
  CHECK(down.error.find("127.0.0.1:" + std::to_string(server.port())) != std::string::npos);

  uint16_t closed = 0;
  {
    agent::LinkProbeServer gone("job-token");
    closed = gone.port();
  }
  const auto refused = agent::link_probe("127.0.0.1", closed, "job-token", 1 << 20, std::chrono::seconds(5));
  CHECK_FALSE(refused.ok);
  CHECK(refused.error.find("connect") != std::string::npos);
}

TEST_CASE("the collective probe all-reduces through real torch.distributed (gloo) between two agents' sides") {
  // The program is the shipped goodput.collective_probe under Debian's python3-torch.
  const std::vector<std::string> program = {"/usr/bin/python3", "-m", "goodput.collective_probe"};
  const std::vector<std::string> env = {"PYTHONPATH=" + std::string(GOODPUT_SOURCE_DIR) + "/python", "OMP_NUM_THREADS=1"};
  agent::LinkProbeServer server("job-token");
  server.set_collective(program, env);
  const auto ok = agent::collective_probe("127.0.0.1", server.port(), "job-token", 1 << 20, std::chrono::seconds(60), program, env);
  CHECK_MESSAGE(ok.ok, ok.error);
  CHECK(ok.mb_per_s > 0);
  // A peer whose network is down answers nothing: the probe fails and says with whom.
  server.set_down(true);
  const auto down = agent::collective_probe("127.0.0.1", server.port(), "job-token", 1 << 20, std::chrono::seconds(20), program, env);
  CHECK_FALSE(down.ok);
  CHECK(down.error.find("collective with 127.0.0.1:") == 0);
}

namespace {

json result(int32_t round, int64_t mflops, bool link_ok, int64_t link = 1000) {
  json r{{"round", round}, {"compute_mflops", mflops}, {"compute_ok", true}, {"link_ok", link_ok}, {"link_mb_per_s", link_ok ? link : 0}};
  if (!link_ok) r["error"] = "link to 127.0.0.1:1: no acknowledgement";
  return r;
}

}  // namespace

TEST_CASE("the master pairs new nodes, re-pairs suspects with a node that passed, and fails a node that failed twice") {
  Harness h(json::object());
  const int32_t a = h.join("a", 7001), b = h.join("b", 7002), c = h.join("c", 7003);
  h.tick();
  // Round 1: a<->b, and the odd one out (c) measures its link to a.
  const json qa = h.beat(a), qb = h.beat(b), qc = h.beat(c);
  REQUIRE(qa["action"] == "check");
  CHECK(qa["check"]["round"] == 1);
  CHECK(qa["check"]["peer"] == b);
  CHECK(qa["check"]["peer_port"] == 7002);
  CHECK(qb["check"]["peer"] == a);
  CHECK(qc["check"]["peer"] == a);
  CHECK(qa["check"]["compute_ms"] == 500);
  // b's network card is bad: its link to a fails, and a's to it.
  h.beat(a, result(1, 1000, false));
  h.beat(b, result(1, 1000, false));
  CHECK(h.beat(c, result(1, 1000, true, 900))["action"] == "check");  // nobody trains during checks
  h.tick();
  auto checked = h.events("node_checked");
  REQUIRE(checked.size() == 3);
  CHECK(checked[0]["verdict"] == "suspect");
  CHECK(checked[1]["verdict"] == "suspect");
  CHECK(checked[2]["verdict"] == "passed");
  CHECK(checked[2]["link_mb_per_s"] == 900);
  // Round 2: both suspects measure against c, the one that passed.
  const json ra = h.beat(a), rb = h.beat(b);
  CHECK(ra["check"]["round"] == 2);
  CHECK(ra["check"]["peer"] == c);
  CHECK(rb["check"]["peer"] == c);
  CHECK(h.beat(c)["action"] == "stop");  // checked; waits for the others
  h.beat(a, result(2, 1000, true, 950));
  h.beat(b, result(2, 1000, false));
  h.tick();
  checked = h.events("node_checked");
  REQUIRE(checked.size() == 5);
  CHECK(checked[3]["node"] == a);
  CHECK(checked[3]["verdict"] == "passed");
  CHECK(checked[4]["node"] == b);
  CHECK(checked[4]["verdict"] == "faulty");
  CHECK(checked[4]["detail"].get<std::string>().find("two partners") != std::string::npos);
  // The failure goes to the recovery policy as a hardware error: relaunched, its machine excluded.
  const auto failures = h.events("failure_observed");
  REQUIRE(failures.size() == 1);
  CHECK(failures[0]["node"] == b);
  CHECK(failures[0]["reason"].get<std::string>().rfind("node check failed: ", 0) == 0);
  const auto decided = h.events("recovery_decided");
  REQUIRE(decided.size() == 1);
  CHECK(decided[0]["diagnosis"] == "hardware_error");
  CHECK(decided[0]["action"] == "relaunch_node");
  CHECK(decided[0]["rule"].get<std::string>().find("node-check") != std::string::npos);
  const std::vector<std::string> want = {"launch 0 1000", "launch 1 1000", "launch 2 1000", "exclude b", "terminate b",
                                         "launch 1 1000"};
  CHECK(h.provider.calls == want);
  CHECK(h.beat(b)["action"] == "exit");
  const std::string metrics = live::metrics_of(*h.master);
  CHECK(metrics.find("goodput_node_checks_total{verdict=\"suspect\"} 2\n") != std::string::npos);
  CHECK(metrics.find("goodput_node_checks_total{verdict=\"faulty\"} 1\n") != std::string::npos);
  CHECK(metrics.find("goodput_node_checks_total{verdict=\"passed\"} 2\n") != std::string::npos);

  // The replacement is checked alone, against the fastest link that passed (a, 950 MB/s).
  const int32_t d = h.join("d", 7004);
  h.tick();
  const json qd = h.beat(d);
  REQUIRE(qd["action"] == "check");
  CHECK(qd["check"]["peer"] == a);
  CHECK(h.beat(a)["action"] == "stop");
  h.beat(d, result(1, 1000, true, 800));
  h.tick();
  CHECK(h.events("node_checked").back()["verdict"] == "passed");
  CHECK(h.beat(a)["action"] == "run");  // every node of the world passed: training starts
}

TEST_CASE("a wrong product is faulty at once, and a slow node is a straggler with its measured ratio") {
  Harness h(json{{"straggler_factor", 2.0}});
  const int32_t a = h.join("a", 7001), b = h.join("b", 7002), c = h.join("c", 7003);
  h.tick();
  for (int32_t n : {a, b, c}) h.beat(n);
  h.beat(a, result(1, 1200, true));
  json bad = result(1, 1100, true);
  bad["compute_ok"] = false;
  bad["error"] = "matrix product differs from the exact result at (17,42): 3.000000 instead of 2";
  h.beat(b, bad);
  h.beat(c, result(1, 300, true));  // a quarter of the median compute
  h.tick();
  const auto checked = h.events("node_checked");
  REQUIRE(checked.size() == 3);
  CHECK(checked[1]["verdict"] == "faulty");
  CHECK(checked[1]["compute_ok"] == false);
  CHECK(checked[1]["detail"].get<std::string>().find("(17,42)") != std::string::npos);
  CHECK(checked[2]["verdict"] == "straggler");
  CHECK(checked[2]["detail"].get<std::string>().find("1/") != std::string::npos);
  const auto slow = h.events("slowdown_observed");
  REQUIRE(slow.size() == 1);
  CHECK(slow[0]["node"] == c);
  CHECK(slow[0]["slowdown_permille"] == 4000);  // median 1200 / 300
  CHECK(h.events("recovery_decided").front()["node"] == b);
}

TEST_CASE("a node that sends no check result within the round's timeout fails its check") {
  Harness h(json{{"round_timeout", "5s"}, {"compute", "100ms"}}, 2);
  const int32_t a = h.join("a", 7001), b = h.join("b", 7002);
  h.tick();
  h.beat(a);
  h.beat(b);
  h.beat(a, result(1, 1000, true));
  h.tick(4 * kSecond);
  CHECK(h.events("node_checked").empty());  // still waiting for b
  h.tick(2 * kSecond);
  const auto checked = h.events("node_checked");
  REQUIRE(checked.size() == 2);
  CHECK(checked[1]["node"] == b);
  CHECK(checked[1]["verdict"] == "faulty");
  CHECK(checked[1]["detail"] == "no check result within 00:00:05.0");
}

TEST_CASE("node_check in a job spec is strict and names the field") {
  auto load = [](const json& c) {
    json spec{{"job", "j"}, {"command", {"true"}}, {"total_steps", 1}, {"node_check", c}};
    return live::job_spec_from_json(spec, "job.json", ".");
  };
  CHECK_FALSE(live::job_spec_from_json(json{{"job", "j"}, {"command", {"true"}}, {"total_steps", 1}}, "", ".").node_check.enabled);
  const auto on = load(json::object());
  CHECK(on.node_check.enabled);
  CHECK(on.node_check.straggler_factor == 2.0);
  CHECK(load({{"faults", {{{"slot", 1}, {"fault", "slow:3"}}}}}).node_check.faults.at(1) == "slow:3");
  CHECK_THROWS_WITH(load({{"faults", {{{"slot", 1}, {"fault", "melt"}}}}}),
                    doctest::Contains("job.json.node_check.faults[0]"));
  CHECK_THROWS_WITH(load({{"straggler_factor", 1.0}}), doctest::Contains("straggler_factor"));
  CHECK_THROWS_WITH(load({{"link_gb", 1}}), doctest::Contains("link_gb"));
}

TEST_CASE("the rendezvous store's port is the one rank 0's agent found free on its own machine") {
  Harness h(nullptr, 2);  // no node check
  const int32_t a = h.join("a", 7001, 29611), b = h.join("b", 7002, 29622);
  h.tick();
  const json ra = h.beat(a), rb = h.beat(b);
  REQUIRE(ra["action"] == "run");
  CHECK(ra["master_port"] == 29611);  // a holds slot 0
  CHECK(rb["master_port"] == 29611);
  CHECK(rb["rank"] == 1);
  // The next restart takes the port rank 0 offers then (it offers a fresh one after each use).
  json next{{"node", a}, {"rdzv_port", 29633}, {"trainer", {{"restart", 0}, {"phase", "exited"},
                                                            {"exit", {{"code", 1}, {"signal", 0}, {"reason", "boom"}}}}}};
  h.post("/v1/exit", next);
  h.tick(kSecond);
  const json again = h.beat(b);
  REQUIRE(again["action"] == "run");
  CHECK(again["restart"] == 1);
  CHECK(again["master_port"] == 29633);
}

TEST_CASE("an operator's check of a running node stops training, checks it against a node that passed, and acts") {
  Harness h(json::object());
  const int32_t a = h.join("a", 7001), b = h.join("b", 7002), c = h.join("c", 7003);
  h.tick();
  for (int32_t n : {a, b, c}) h.beat(n);
  h.beat(a, result(1, 1000, true, 900));
  h.beat(b, result(1, 1000, true, 700));
  h.beat(c, result(1, 1000, true, 800));
  h.tick();
  REQUIRE(h.events("node_checked").size() == 3);
  REQUIRE(h.beat(b)["action"] == "run");
  const int64_t old_id = h.check_ids[b];
  REQUIRE(h.events("restart_job").size() == 1);

  // Refused, with the reason: a slot nobody holds, an unknown drill, a malformed list.
  auto refused = h.request("/v1/check", json{{"slots", {7}}});
  CHECK(refused.status == 409);
  CHECK(refused.body.find("no node holds slot 7") != std::string::npos);
  CHECK(h.request("/v1/check", json{{"slots", {1}}, {"fault", "melt"}}).status == 409);
  CHECK(h.request("/v1/check", json{{"slots", "1"}}).status == 400);
  // A body must say which nodes: a mistyped key was once taken for "check every node", and
  // training went back to its checkpoint.
  auto unknown = h.request("/v1/check", json{{"name", 5}});
  CHECK(unknown.status == 400);
  CHECK(unknown.body.find("unknown field 'name'") != std::string::npos);
  CHECK(h.request("/v1/check", json::object()).body.find("give either 'slots'") != std::string::npos);
  CHECK(h.request("/v1/check", json{{"slots", json::array()}}).status == 400);
  CHECK(h.request("/v1/check", json{{"slots", {1}}, {"all", true}}).status == 400);
  // The other endpoints refuse what they do not know too, naming it (nested fields with their path).
  CHECK(h.request("/v1/register", json{{"name", "x"}, {"slots", 1}}).body.find("unknown field 'slots'") != std::string::npos);
  CHECK(h.request("/v1/heartbeat", json{{"node", b}, {"trainer", {{"restart", 0}, {"phase", "training"}, {"stpe", 3}}}})
            .body.find("unknown field 'trainer.stpe'") != std::string::npos);
  CHECK(h.request("/v1/scale", json{{"group", "ps"}, {"count", 1}, {"force", true}}).status == 400);
  CHECK(h.request("/v1/inject", json{{"fault", "hang"}, {"slot", 0}, {"when", "now"}}).status == 400);
  CHECK(h.events("check_requested").empty());

  const json answer = h.post("/v1/check", json{{"slots", {1}}, {"reason", "loss spikes on rank 1"}});
  REQUIRE(answer["checking"].size() == 1);
  CHECK(answer["checking"][0]["node"] == b);
  const auto asked = h.events("check_requested");
  REQUIRE(asked.size() == 1);
  CHECK(asked[0]["nodes"] == json::array({b}));
  CHECK(asked[0]["reason"] == "loss spikes on rank 1");
  // Training stops at once: the job restarts (from its newest checkpoint) once b has a verdict.
  CHECK(h.events("restart_job").size() == 2);
  CHECK(h.master->state().phase() == Phase::Restart);
  h.tick();
  const json qb = h.beat(b);
  REQUIRE(qb["action"] == "check");
  CHECK(qb["check"]["peer"] == a);  // the fastest link among the nodes that passed
  CHECK(qb["check"]["id"].get<int64_t>() > old_id);
  CHECK(h.beat(a)["action"] == "stop");
  CHECK(h.request("/v1/check", json{{"all", true}}).status == 409);  // one check at a time

  // A result measured for the earlier round is not taken for this one.
  h.beat(b, [&] { json r = result(1, 1000, true, 700); r["id"] = old_id; return r; }());
  h.tick();
  CHECK(h.events("node_checked").size() == 3);
  json bad = result(1, 1000, true);
  bad["compute_ok"] = false;
  bad["error"] = "matrix product differs from the exact result at (3,4)";
  h.beat(b, bad);
  h.tick();
  const auto checked = h.events("node_checked");
  REQUIRE(checked.size() == 4);
  CHECK(checked[3]["node"] == b);
  CHECK(checked[3]["verdict"] == "faulty");
  const auto failures = h.events("failure_observed");
  REQUIRE(failures.size() == 1);
  CHECK(failures[0]["reason"].get<std::string>().rfind("node check failed: ", 0) == 0);
  CHECK(h.events("recovery_decided").back()["action"] == "relaunch_node");
  CHECK(h.provider.calls.back() == "launch 1 1000");
  CHECK(std::find(h.provider.calls.begin(), h.provider.calls.end(), "exclude b") != h.provider.calls.end());

  // A master resumed from this log knows b's verdict and a's and c's: nothing is checked twice.
  h.new_master(json{{"job", "chk"}, {"nodes", 3}, {"command", {"true"}}, {"total_steps", 10},
                    {"heartbeat_timeout", "1h"}, {"hang_timeout", "1h"}, {"node_check", json::object()}});
  h.tick();
  CHECK(h.beat(a)["action"] == "stop");  // slot 1 waits for its replacement
  const int32_t d = h.join("d", 7004);
  h.tick();
  CHECK(h.beat(d)["action"] == "check");
  CHECK(h.beat(c)["action"] == "stop");
}

TEST_CASE("a straggler checked again and found well is no longer slowing the job") {
  Harness h(json{{"straggler_factor", 2.0}}, 2);
  const int32_t a = h.join("a", 7001), b = h.join("b", 7002);
  h.tick();
  h.beat(a);
  h.beat(b);
  h.beat(a, result(1, 1200, true));
  h.beat(b, result(1, 400, true));
  h.tick();
  REQUIRE(h.events("slowdown_observed").size() == 1);
  CHECK(h.master->state().slowdown_permille() == 3000);
  h.post("/v1/check", json{{"all", true}});  // the whole world
  CHECK(h.events("check_requested").at(0)["nodes"] == json::array({a, b}));
  h.tick();
  h.beat(a);
  h.beat(b);
  h.beat(a, result(1, 1200, true));
  h.beat(b, result(1, 1150, true));  // its neighbour's job ended: full speed again
  h.tick();
  const auto slow = h.events("slowdown_observed");
  REQUIRE(slow.size() == 2);
  CHECK(slow[1]["node"] == b);
  CHECK(slow[1]["slowdown_permille"] == 1000);
  CHECK(h.master->state().slowdown_permille() == 1000);
  CHECK(h.beat(a)["action"] == "run");
}

TEST_CASE("a job without node_check in its spec can still be checked on request") {
  Harness h(nullptr, 2);
  const int32_t a = h.join("a", 7001), b = h.join("b", 7002);
  h.tick();
  REQUIRE(h.beat(a)["action"] == "run");
  h.post("/v1/check", json{{"slots", {0}}, {"fault", "slow:3"}});
  h.tick();
  const json qa = h.beat(a);
  REQUIRE(qa["action"] == "check");
  CHECK(qa["check"]["fault"] == "slow:3");
  CHECK(qa["check"]["peer"] == b);  // its link is measured to b, which is not checked itself
  CHECK(h.beat(b)["action"] == "stop");
}

TEST_CASE("hang_action and stall_after in a job spec are checked and default sensibly") {
  auto load = [](const json& extra) {
    json spec{{"job", "j"}, {"command", {"true"}}, {"total_steps", 1}, {"step_time", "6s"}};
    spec.update(extra);
    return live::job_spec_from_json(spec, "job.json", ".");
  };
  CHECK(load(json::object()).hang_action == live::JobSpec::HangAction::Recover);
  CHECK(load(json::object()).hang_timeout == 5 * kMinute);
  CHECK(load(json::object()).stall_after_or_default() == 2 * kMinute);  // 20 steps of 6 s
  CHECK(load({{"step_time", "10ms"}}).stall_after_or_default() == 10 * kSecond);
  CHECK(load({{"stall_after", "3s"}}).stall_after_or_default() == 3 * kSecond);
  CHECK(load({{"hang_action", "report"}}).hang_action == live::JobSpec::HangAction::Report);
  CHECK_THROWS_WITH(load({{"hang_action", "ignore"}}), doctest::Contains("hang_action"));
  CHECK_THROWS_WITH(load({{"stall_after", "soon"}}), doctest::Contains("stall_after"));
}

TEST_CASE("a flood of requests with a wrong token is logged once a minute, with its count and without the token") {
  Harness h(nullptr, 2);
  net::HttpRequest r;
  r.method = "POST";
  r.target = "/v1/register";
  r.authorization = "Bearer guessed-token-123";
  r.body = R"({"name":"intruder"})";
  r.peer_address = "10.9.8.7";
  for (int i = 0; i < 1000; ++i) CHECK(h.api->handle(r).status == 401);
  auto refused = h.events("api_refused");
  REQUIRE(refused.size() == 1);  // the first at once
  CHECK(refused[0]["count"] == 1);
  CHECK(refused[0]["peer"] == "10.9.8.7");
  h.tick(30 * kSecond);
  CHECK(h.events("api_refused").size() == 1);
  h.tick(31 * kSecond);
  refused = h.events("api_refused");
  REQUIRE(refused.size() == 2);
  CHECK(refused[1]["count"] == 999);
  h.tick(120 * kSecond);
  CHECK(h.events("api_refused").size() == 2);  // nothing new to say
  std::string log;
  h.store->for_each([&](const Event& e) { log += event_to_line(e); });
  CHECK(log.find("guessed-token-123") == std::string::npos);
  CHECK(live::metrics_of(*h.master).find("goodput_api_unauthorized_total 1000\n") != std::string::npos);
}

TEST_CASE("an operator's check of a training job waits for its next checkpoint, so nothing is recomputed") {
  Harness h(nullptr, 2);
  const int32_t a = h.join("a", 7001), b = h.join("b", 7002);
  h.tick();
  REQUIRE(h.beat(a)["action"] == "run");
  auto train = [&](int32_t node, int64_t step, int64_t saves) {
    json t{{"restart", 0}, {"phase", "training"}, {"step", step}, {"progress_age_ms", 0}, {"saves", saves},
           {"save_blocking_ns", saves * 1000}, {"saved_step", saves * 10},
           {"loaded", {{"step", 0}, {"tier", "none"}, {"ns", 1}}}};
    return h.post("/v1/heartbeat", json{{"node", node}, {"trainer", t}});
  };
  train(a, 5, 0);
  train(b, 5, 0);
  h.tick();
  REQUIRE(h.master->state().phase() == Phase::Training);
  const json answer = h.post("/v1/check", json{{"slots", {1}}});
  CHECK(answer["when"] == "after the next checkpoint");
  // Logged as waiting at once (a master that restarts now still carries it out), training goes on.
  REQUIRE(h.events("check_requested").size() == 1);
  CHECK(h.events("check_requested")[0]["waiting"] == true);
  CHECK(h.request("/v1/check", json{{"slots", {0}}}).status == 409);  // one at a time
  h.tick(kSecond);
  CHECK(h.master->state().phase() == Phase::Training);  // still training until the save
  // The master is killed and resumed from its log before the checkpoint comes.
  h.new_master(json{{"job", "chk"}, {"nodes", 2}, {"command", {"true"}}, {"total_steps", 10},
                    {"heartbeat_timeout", "1h"}, {"hang_timeout", "1h"}});
  CHECK(h.request("/v1/check", json{{"slots", {0}}}).status == 409);  // still waiting
  train(a, 12, 1);
  train(b, 12, 1);  // both ranks saved step 10: the checkpoint, and the check right after it
  std::vector<std::string> order;
  h.store->for_each([&](const Event& e) { order.emplace_back(event_type_name(e.payload)); });
  const auto saved = std::find(order.begin(), order.end(), "checkpoint_saved");
  REQUIRE(saved != order.end());
  CHECK(*std::next(saved) == "check_requested");
  REQUIRE(h.events("check_requested").size() == 2);
  CHECK_FALSE(h.events("check_requested")[1].contains("waiting"));
  CHECK(h.events("check_requested").at(1)["nodes"] == json::array({b}));
  CHECK(h.master->state().phase() == Phase::Restart);
  CHECK(h.beat(b)["action"] != "run");
  // --now does not wait.
  Harness g(nullptr, 2);
  const int32_t c = g.join("c", 7001);
  g.join("d", 7002);
  g.tick();
  REQUIRE(g.beat(c)["action"] == "run");
  CHECK(g.post("/v1/check", json{{"slots", {0}}, {"now", true}})["when"] == "now");
  CHECK(g.events("check_requested").size() == 1);
}

TEST_CASE("spares are checked beside the training world; a faulty one leaves the pool and another is asked for") {
  json spec = Harness::spec_with(json::object(), 2).spec;
  spec["spares"] = 2;
  Harness h(Harness::Spec{spec});
  const int32_t a = h.join("a", 7001), b = h.join("b", 7002);
  h.tick();
  REQUIRE(h.beat(a)["action"] == "check");
  h.beat(b);
  h.beat(a, result(1, 1000, true, 900));
  h.beat(b, result(1, 1000, true, 800));
  h.tick();
  CHECK(h.beat(a)["action"] == "run");  // the world passed and trains

  // Two spares join while it trains: they are checked (against each other), the world is not stopped.
  const int32_t s1 = h.join("s1", 7003), s2 = h.join("s2", 7004);
  h.tick();
  const json q1 = h.beat(s1), q2 = h.beat(s2);
  REQUIRE(q1["action"] == "check");
  CHECK(q1["check"]["peer"] == s2);
  CHECK(q2["check"]["peer"] == s1);
  CHECK(h.beat(a)["action"] == "run");
  CHECK(h.beat(b)["action"] == "run");
  h.beat(s1, result(1, 1000, true, 850));
  json bad = result(1, 1000, true);
  bad["compute_ok"] = false;
  bad["error"] = "matrix product differs from the exact result at (1,2): 5.000000 instead of 4";
  h.beat(s2, bad);
  h.tick();
  const auto checked = h.events("node_checked");
  REQUIRE(checked.size() == 4);
  CHECK(checked[2]["node"] == s1);
  CHECK(checked[2]["verdict"] == "passed");
  CHECK(checked[3]["node"] == s2);
  CHECK(checked[3]["verdict"] == "faulty");
  // Nothing was decided for the world; the faulty spare's machine goes back and another is asked for.
  CHECK(h.events("failure_observed").empty());
  CHECK(h.events("recovery_decided").empty());
  const std::vector<std::string> want = {"launch 0 1000", "launch 1 1000", "launch 2 1000", "launch 3 1000",
                                         "terminate s2", "launch 2 1000"};
  CHECK(h.provider.calls == want);
  CHECK(h.beat(s2)["action"] == "exit");
  CHECK(h.beat(s1)["action"] == "stop");  // checked, idle
  CHECK(h.beat(a)["action"] == "run");

  // A resumed master folds the same: the faulty spare stays out of the pool, replaced once.
  h.new_master(spec);
  h.tick();
  CHECK(h.beat(s2)["action"] == "exit");
  CHECK(h.beat(s1)["action"] == "stop");
  CHECK(h.provider.calls == want);
}
