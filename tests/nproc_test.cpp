// Several trainer processes per node: how a job spec says so, how global ranks are laid out over
// nodes and replica groups, what a node is told to run, and what the master reads of a node of
// several processes (their aggregate, each one's report, the local rank that failed, each one's
// shard requests). The master is driven through its HTTP handler with a real SQLite log. (Real
// processes killed with real signals, and goodput torchrun: tests/python/test_torchrun.py.)
#include <doctest/doctest.h>

#include "engine/json_reader.h"
#include "master_harness.h"

using namespace goodput;
using namespace goodput::test;

namespace {

json job(json over = json::object()) {
  json s{{"job", "np"}, {"nodes", 2}, {"nproc_per_node", 2}, {"command", {"python3", "train.py"}}, {"total_steps", 10},
         {"heartbeat_timeout", "1h"}, {"hang_timeout", "1h"}, {"data_shards", 100}};
  s.update(over);
  return s;
}

std::string error_of(const json& spec) {
  try {
    live::job_spec_from_json(spec, "", ".");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

// The two nodes join for their slots and the world runs restart 0.
struct NprocHarness : Harness {
  explicit NprocHarness(json spec = job()) : Harness(Spec{std::move(spec)}) {}
  int32_t launched_for(const std::string& name, int32_t slot) {
    return post("/v1/register", json{{"name", name}, {"slot", slot}})["node"].get<int32_t>();
  }
  json beat_with(int32_t node, json trainer) { return post("/v1/heartbeat", json{{"node", node}, {"trainer", trainer}}); }
  json running(int32_t node) {
    tick(10 * kSecond);
    return beat_with(node, {{"restart", -1}, {"phase", "none"}});
  }
  // Both nodes report restart 0 training from scratch, each as two processes.
  void train(int32_t a, int32_t b) {
    for (int i = 0; i < 3; ++i)
      for (int32_t n : {a, b}) {
        beat_with(n, training(0, 5));
        tick();
      }
    REQUIRE(master->state().phase() == Phase::Training);
  }
  static json training(int32_t restart, int64_t step) {
    json ranks = json::array({json{{"local_rank", 0}, {"phase", "training"}}, json{{"local_rank", 1}, {"phase", "training"}}});
    return {{"restart", restart}, {"phase", "training"}, {"step", step}, {"processes", 2}, {"ranks", ranks},
            {"loaded", {{"step", 0}, {"tier", "none"}, {"ns", 0}}}};
  }
};

}  // namespace

TEST_CASE("nproc_per_node: job-wide and per replica group; accelerators follow it unless given") {
  const live::JobSpec plain = live::job_spec_from_json(job({{"nproc_per_node", 8}}), "", ".");
  CHECK(plain.nproc_per_node == 8);
  CHECK(plain.accelerators_per_node == 8);  // a node failure costs all eight
  CHECK(plain.replicas.front().nproc_per_node == 8);
  CHECK(plain.job_started().accelerators_per_node == 8);
  CHECK(live::job_spec_from_json(job({{"accelerators_per_node", 4}}), "", ".").accelerators_per_node == 4);
  CHECK(live::job_spec_from_json(job({{"nproc_per_node", 1}}), "", ".").accelerators_per_node == 1);

  json groups = job({{"replicas", {{{"type", "ps"}, {"count", 1}, {"nproc_per_node", 1}}, {{"type", "worker"}, {"count", 2}}}}});
  groups.erase("nodes");
  groups["nproc_per_node"] = 4;
  const live::JobSpec g = live::job_spec_from_json(groups, "", ".");
  REQUIRE(g.replicas.size() == 2);
  CHECK(g.replicas[0].nproc_per_node == 1);
  CHECK(g.replicas[1].nproc_per_node == 4);  // the job's, as the group gives none
  // Global ranks: the parameter server's one process, then the workers' four each.
  CHECK(live::first_process(g.replicas, 0) == 0);
  CHECK(live::first_process(g.replicas, 1) == 1);
  CHECK(live::first_process(g.replicas, 2) == 5);
  CHECK(live::first_process(g.replicas, 3) == 9);  // the world's processes
  CHECK(live::process_counts(g.replicas, live::replica_counts(g.replicas, 3)) == json{{"ps", 1}, {"worker", 8}});

  CHECK(error_of(job({{"nproc_per_node", 0}})).find("nproc_per_node") != std::string::npos);
  CHECK(error_of(job({{"nproc_per_node", "8"}})).find("nproc_per_node") != std::string::npos);
  CHECK(error_of(job({{"role", ""}})).find("role") != std::string::npos);
  CHECK(error_of(job({{"trainer_reports", "no"}})).find("trainer_reports") != std::string::npos);
}

TEST_CASE("a node of several processes is told their global ranks, the world's processes and its role") {
  NprocHarness h;
  const int32_t a = h.launched_for("a", 0), b = h.launched_for("b", 1);
  const json ra = h.running(a), rb = h.running(b);
  REQUIRE(rb["action"] == "run");
  CHECK(rb["rank"] == 1);  // the node's rank (GROUP_RANK)
  CHECK(rb["world_size"] == 2);
  CHECK(rb["nproc"] == 2);
  CHECK(rb["rank_base"] == 2);  // its processes are ranks 2 and 3
  CHECK(rb["process_world_size"] == 4);
  CHECK(ra["rank_base"] == 0);
  CHECK(rb["env"]["GOODPUT_REPLICA_INDEX"] == "2");
  CHECK(json::parse(rb["env"]["GOODPUT_REPLICAS"].get<std::string>()) == json{{"worker", 4}});
  CHECK_FALSE(rb.contains("role"));  // torchrun's "default", the agent's default

  // One process per node: the order is what it always was.
  NprocHarness one(job({{"nproc_per_node", 1}, {"role", "trainer"}}));
  one.launched_for("a", 0);
  const int32_t ob = one.launched_for("b", 1);
  const json o = one.running(ob);
  CHECK_FALSE(o.contains("nproc"));
  CHECK_FALSE(o.contains("rank_base"));
  CHECK(o["role"] == "trainer");
  CHECK(o["role_rank_base"] == 1);
  CHECK(o["role_world_size"] == 2);

  // Replica groups: roles are the groups, ranks laid out group by group.
  json g = job({{"replicas", {{{"type", "ps"}, {"count", 1}, {"nproc_per_node", 1}}, {{"type", "worker"}, {"count", 2}}}}});
  g.erase("nodes");
  NprocHarness gh(g);
  gh.launched_for("p", 0);
  gh.launched_for("w1", 1);
  const int32_t w2 = gh.launched_for("w2", 2);
  const json w = gh.running(w2);
  CHECK(w["rank_base"] == 3);
  CHECK(w["process_world_size"] == 5);
  CHECK(w["role"] == "worker");
  CHECK(w["role_rank_base"] == 2);
  CHECK(w["role_world_size"] == 4);
  CHECK(w["env"]["GOODPUT_REPLICA_INDEX"] == "2");
  CHECK(json::parse(w["env"]["GOODPUT_REPLICAS"].get<std::string>()) == json{{"ps", 1}, {"worker", 4}});
}

TEST_CASE("the master reads a node of several processes strictly and blames the local rank that failed first") {
  NprocHarness h;
  const int32_t a = h.launched_for("a", 0), b = h.launched_for("b", 1);
  h.running(a);
  h.running(b);
  h.train(a, b);
  // /status shows each process as its agent reported it.
  const json st = live::status_of(*h.master);
  CHECK(st["nodes"][0]["trainer"]["processes"] == 2);
  CHECK(st["nodes"][0]["trainer"]["ranks"].size() == 2);

  json bad = NprocHarness::training(0, 6);
  bad["ranks"].erase(1);
  const auto r = h.request("/v1/heartbeat", json{{"node", a}, {"trainer", bad}});
  CHECK(r.status == 400);
  CHECK(r.body.find("trainer.ranks") != std::string::npos);
  bad = NprocHarness::training(0, 6);
  bad["processes"] = 0;
  CHECK(h.request("/v1/heartbeat", json{{"node", a}, {"trainer", bad}}).status == 400);

  // Local rank 1 of node b (rank 3) was SIGKILLed; its sibling was stopped with it.
  json exited = NprocHarness::training(0, 7);
  exited["phase"] = "exited";
  exited["exit"] = {{"code", 137}, {"signal", 9}, {"reason", "local rank 1 (rank 3): killed by signal 9 (Killed)"},
                    {"done", false}, {"age_ms", 0}, {"local_rank", 1}, {"rank", 3}};
  h.post("/v1/exit", json{{"node", b}, {"trainer", exited}});
  for (int i = 0; i < 3; ++i) {  // the exit settles (node a is heard from again), then the culprit is named
    h.tick(kSecond);
    h.beat_with(a, NprocHarness::training(0, 7));
  }
  const auto failures = h.events("failure_observed");
  REQUIRE(failures.size() == 1);
  CHECK(failures[0]["node"] == b);
  CHECK(failures[0]["signal"] == 9);
  CHECK(failures[0]["reason"].get<std::string>().rfind("local rank 1 (rank 3)", 0) == 0);
}

TEST_CASE("each process of a node numbers its own shard requests, and a retry gets its own shard back") {
  NprocHarness h;
  const int32_t a = h.launched_for("a", 0), b = h.launched_for("b", 1);
  h.running(a);
  h.running(b);
  h.train(a, b);
  const json s0 = h.post("/v1/shards/next", json{{"node", a}, {"restart", 0}, {"request", 0}});
  const json s1 = h.post("/v1/shards/next", json{{"node", a}, {"restart", 0}, {"request", 0}, {"local_rank", 1}});
  CHECK(s0["shard"] != s1["shard"]);  // the same request number, two processes: two shards
  CHECK(h.post("/v1/shards/next", json{{"node", a}, {"restart", 0}, {"request", 0}})["shard"] == s0["shard"]);
  CHECK(h.post("/v1/shards/next", json{{"node", a}, {"restart", 0}, {"request", 0}, {"local_rank", 1}})["shard"] ==
        s1["shard"]);
  // The log says which process asked (and a master resumed from it answers the retries the same).
  const auto assigned = h.events("shards_assigned");
  REQUIRE(assigned.size() == 2);
  CHECK_FALSE(assigned[0].contains("local_rank"));  // local rank 0: the event as it always was
  CHECK(assigned[1]["local_rank"] == 1);
  h.new_master(job());
  CHECK(h.post("/v1/shards/next", json{{"node", a}, {"restart", 0}, {"request", 0}, {"local_rank", 1}})["shard"] ==
        s1["shard"]);
  CHECK(h.request("/v1/shards/next", json{{"node", a}, {"restart", 0}, {"request", 1}, {"local_rank", -1}}).status == 400);

  // A process fault aims at one local rank, and only at one the node has.
  CHECK(h.post("/v1/inject", json{{"fault", "kill-process"}, {"slot", 1}, {"local_rank", 1}})["local_rank"] == 1);
  CHECK(h.beat_with(b, NprocHarness::training(0, 8))["inject"] == json{"kill-process@1"});
  const auto refused = h.request("/v1/inject", json{{"fault", "kill-process"}, {"slot", 1}, {"local_rank", 2}});
  CHECK(refused.status == 400);
  CHECK(refused.body.find("no local rank 2") != std::string::npos);
}
