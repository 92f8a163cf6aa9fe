// Replica groups (chief, parameter servers, workers): how a job spec lays them out and checks them,
// what each rank is told it is, and how scaling changes workers only. The master is driven through
// its HTTP handler with a real SQLite log. (Real PyTorch parameter servers killed with real
// signals: tests/python/test_live.py; their pods on the Kubernetes emulator: test_kube.py.)
#include <doctest/doctest.h>

#include <array>

#include "backends/kubernetes/kube_nodes.h"
#include "engine/json_reader.h"
#include "master_harness.h"

using namespace goodput;
using namespace goodput::test;

namespace {

std::string error_of(const json& spec) {
  try {
    live::job_spec_from_json(spec, "", ".");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

json ps_job(json replicas) {
  return json{{"job", "ps"}, {"command", {"python3", "train.py"}}, {"total_steps", 10}, {"env", {{"A", "1"}}},
              {"replicas", std::move(replicas)}, {"heartbeat_timeout", "1h"}, {"hang_timeout", "1h"}};
}

}  // namespace

TEST_CASE("replica groups are laid out chief, parameter servers, workers, each with its own command and env") {
  const live::JobSpec s = live::job_spec_from_json(
      ps_job({{{"type", "worker"}, {"count", 3}},
              {{"type", "ps"}, {"count", 2}, {"command", {"python3", "ps.py"}}, {"env", {{"B", "2"}}}},
              {{"type", "chief"}}}),
      "", ".");
  REQUIRE(s.replicas.size() == 3);
  CHECK(s.nodes == 6);
  CHECK(s.job_started().nodes == 6);
  CHECK(s.fixed_slots() == 3);
  CHECK(live::replica_group(s.replicas, 0).type == "chief");
  CHECK(live::replica_group(s.replicas, 1).type == "ps");
  CHECK(live::replica_group(s.replicas, 2).type == "ps");
  CHECK(live::replica_group(s.replicas, 3).type == "worker");
  CHECK(live::replica_group(s.replicas, 5).first_slot == 3);
  CHECK(live::replica_group(s.replicas, 1).command == std::vector<std::string>{"python3", "ps.py"});
  CHECK(live::replica_group(s.replicas, 1).env == std::map<std::string, std::string>{{"A", "1"}, {"B", "2"}});
  CHECK(live::replica_group(s.replicas, 4).command == std::vector<std::string>{"python3", "train.py"});
  CHECK(live::replica_counts(s.replicas, 6) == json{{"chief", 1}, {"ps", 2}, {"worker", 3}});
  CHECK(live::replica_counts(s.replicas, 4) == json{{"chief", 1}, {"ps", 2}, {"worker", 1}});  // scaled down

  // Without "replicas": one group of workers, as before.
  const live::JobSpec plain = live::job_spec_from_json(
      json{{"job", "j"}, {"nodes", 2}, {"command", {"x"}}, {"total_steps", 10}}, "", ".");
  REQUIRE(plain.replicas.size() == 1);
  CHECK(plain.replicas[0].type == "worker");
  CHECK(plain.replicas[0].count == 2);
  CHECK(plain.fixed_slots() == 0);

  // Each group may bring its own command instead of the job's.
  json own = ps_job({{{"type", "ps"}, {"command", {"ps"}}}, {{"type", "worker"}, {"command", {"w"}}}});
  own.erase("command");
  CHECK(error_of(own) == "no error");
}

TEST_CASE("bad replica groups are refused with the field and the reason") {
  CHECK(error_of(ps_job({{{"type", "boss"}}})) == "field 'replicas[0].type' must be chief, ps or worker");
  CHECK(error_of(ps_job({{{"type", "worker"}}, {{"type", "worker"}}})) ==
        "field 'replicas[1].type' 'worker' is given twice: one group per type");
  CHECK(error_of(ps_job({{{"type", "chief"}, {"count", 2}}})) == "field 'replicas[0].count' must be 1: a job has one chief");
  CHECK(error_of(ps_job({{{"type", "ps"}, {"count", 2}}})) ==
        "field 'replicas' needs a chief or worker group: parameter servers alone do not train");
  CHECK(error_of(ps_job(json::array())) == "field 'replicas' must be a non-empty list of replica groups");
  CHECK(error_of(ps_job({{{"type", "worker"}, {"cpus", 2}}})).find("replicas[0].cpus") != std::string::npos);
  json mismatch = ps_job({{{"type", "ps"}}, {{"type", "worker"}, {"count", 2}}});
  mismatch["nodes"] = 4;
  CHECK(error_of(mismatch) ==
        "field 'nodes' is 4 but the replica groups add up to 3 (leave it out: it follows from them)");
  json no_command = ps_job({{{"type", "ps"}, {"command", {"ps"}}}, {{"type", "worker"}}});
  no_command.erase("command");
  CHECK(error_of(no_command) == "field 'command' is required: the trainer's argv, unless every replica group has its own "
                               "(the worker group has none)");
  // Machine shapes per group are for backends that have machines to shape.
  CHECK(error_of(ps_job({{{"type", "worker"}, {"backend", {{"cpu", "2"}}}}})) ==
        "field 'replicas[0].backend' is for jobs on ray or kubernetes: a local node has no shape to set");
  json kube = ps_job({{{"type", "ps"}, {"backend", {{"namespace", "other"}}}}, {{"type", "worker"}}});
  kube["backend"] = {{"type", "kubernetes"}, {"image", "i"}};
  CHECK(error_of(kube).rfind("field 'replicas[0].backend.namespace' cannot differ between replica groups", 0) == 0);
  kube["replicas"][0]["backend"] = {{"gpus", -1}};
  CHECK(error_of(kube).find("replicas[0].backend.gpus") != std::string::npos);
  // Scaling gives up workers only, so it may not go below the fixed part plus one worker.
  json elastic = ps_job({{{"type", "chief"}}, {{"type", "ps"}, {"count", 2}}, {{"type", "worker"}, {"count", 4}}});
  elastic["policy"] = {{"scaling", {{"policy", "elastic"}, {"min_nodes", 3}}}};
  CHECK(error_of(elastic) ==
        "field 'policy' scales elastically down to min_nodes 3, but the chief and parameter servers hold 3 slots that "
        "scaling never gives up: set scaling.min_nodes to at least 4");
  elastic["policy"]["scaling"]["min_nodes"] = 4;
  CHECK(error_of(elastic) == "no error");
}

TEST_CASE("each group's pods have its type, index and machine shape") {
  json spec = ps_job({{{"type", "ps"}, {"count", 2}, {"backend", {{"cpu", "4"}, {"memory_mb", 8192}, {"gpus", 0}}}},
                      {{"type", "worker"}, {"count", 2}}});
  spec["backend"] = {{"type", "kubernetes"}, {"image", "trainer:1"}, {"cpu", "16"}, {"memory_mb", 65536}, {"gpus", 8},
                     {"node_selector", {{"pool", "h100"}}}};
  const live::JobSpec s = live::job_spec_from_json(spec, "", ".");
  kube::KubeNodesOptions o;
  o.spec = s.kube;
  o.replicas = s.replicas;
  o.job = "ps";
  o.run = "ps-1";
  o.master_url = "http://master:8000";
  const json ps = kube::KubeNodes::manifest_for(o, "ps-1-ps-1", 1, 1000, {});
  CHECK(ps["metadata"]["labels"]["goodput/replica-type"] == "ps");
  CHECK(ps["metadata"]["labels"]["goodput/replica-index"] == "1");
  CHECK(ps["metadata"]["labels"]["goodput/rank"] == "1");
  const json& pc = ps["spec"]["containers"][0];
  CHECK(pc["resources"]["requests"]["cpu"] == "4");
  CHECK(pc["resources"]["limits"]["memory"] == "8192Mi");
  CHECK_FALSE(pc["resources"]["limits"].contains("nvidia.com/gpu"));
  CHECK(ps["spec"]["nodeSelector"]["pool"] == "h100");  // what the group does not set is the job's
  const json w = kube::KubeNodes::manifest_for(o, "ps-1-worker-3", 3, 1500, {});
  CHECK(w["metadata"]["labels"]["goodput/replica-type"] == "worker");
  CHECK(w["metadata"]["labels"]["goodput/replica-index"] == "1");
  CHECK(w["spec"]["containers"][0]["resources"]["limits"]["memory"] == "98304Mi");
  CHECK(w["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8");
}

namespace {

struct PsHarness : Harness {
  // One parameter server and two workers; elastic down to the parameter server and one worker.
  PsHarness()
      : Harness(Spec{[] {
                       json s = ps_job({{{"type", "ps"}, {"command", {"python3", "ps.py"}}}, {{"type", "worker"}, {"count", 2}}});
                       s["policy"] = {{"scaling", {{"policy", "elastic"}, {"min_nodes", 2}}}};
                       return s;
                     }(),
                     load_policy(json{{"scaling", {{"policy", "elastic"}, {"min_nodes", 2}}}})}) {}
  int32_t launched_for(const std::string& name, int32_t slot) {
    return post("/v1/register", json{{"name", name}, {"slot", slot}})["node"].get<int32_t>();
  }
  // The server p and the workers w1 and w2 join for their slots, and the world runs.
  std::array<int32_t, 3> start() {
    const std::array<int32_t, 3> ids{launched_for("p", 0), launched_for("w1", 1), launched_for("w2", 2)};
    REQUIRE(running(ids[0])["action"] == "run");
    return ids;
  }
  json running(int32_t node) {  // the assignment once the world runs
    tick(10 * kSecond);
    return post("/v1/heartbeat", json{{"node", node}, {"trainer", {{"restart", -1}, {"phase", "none"}}}});
  }
  std::vector<std::pair<int, int>> scales() {
    std::vector<std::pair<int, int>> out;
    for (const json& e : events("scale_decided")) out.emplace_back(e["from"].get<int>(), e["to"].get<int>());
    return out;
  }
};

}  // namespace

TEST_CASE("a shrunk world asks for the missing machine again, later each time, and never fails for it") {
  PsHarness h;
  h.start();
  auto launches = [&] { return std::count(h.provider.calls.begin(), h.provider.calls.end(), "launch 2 1000"); };
  h.provider.losses.push_back({"w2", "node w2 is gone", false});
  h.tick();
  h.provider.losses.push_back({"ray-9", "never scheduled", false});
  h.tick();
  REQUIRE(h.scales() == std::vector<std::pair<int, int>>{{3, 2}});
  const auto asked = launches();  // the first, the relaunch, and the first try to grow back at once
  CHECK(asked == 3);
  // Each machine asked for dies as it starts: asked for again after 1 s, 2 s, 4 s, ... (never in
  // a loop), twelve times and more without failing the job, which trains meanwhile.
  Duration wait = kSecond;
  for (int i = 0; i < 12; ++i) {
    h.provider.losses.push_back({"ray-" + std::to_string(10 + i), "agent exited at start", false});
    h.tick(kMillisecond);  // reported lost
    h.tick(wait - kMillisecond);
    CHECK(launches() == asked + i);  // not yet
    h.tick(kMillisecond);
    CHECK(launches() == asked + i + 1);
    wait = std::min<Duration>(wait * 2, 256 * kSecond);
  }
  CHECK(h.events("job_finished").empty());
  CHECK(h.running(0)["world_size"] == 2);
  // One that comes joins, and the world grows back.
  h.launched_for("w3", 2);
  CHECK(h.scales() == std::vector<std::pair<int, int>>{{3, 2}, {2, 3}});
}

TEST_CASE("an operator's growth no machine comes for is undone, and the job goes on as it was") {
  PsHarness h;
  const auto [p, w1, w2] = h.start();
  const json answer = h.post("/v1/scale", json{{"group", "ps"}, {"count", 2}});
  REQUIRE(answer["from"] == 1);
  CHECK(h.provider.calls.back() == "launch 1 1000");  // the new server's slot; the workers moved up
  // Its machine never comes: each one asked for is given up (a Ray job stuck PENDING, an
  // unschedulable pod). Five are asked for again; the sixth loss undoes the scale.
  for (int i = 0; i < 6; ++i) {
    h.provider.losses.push_back({"ray-" + std::to_string(10 + i), "never scheduled", false});
    h.tick();
  }
  CHECK(h.events("job_finished").empty());
  CHECK(h.scales() == std::vector<std::pair<int, int>>{{3, 4}, {4, 3}});
  const json undone = h.events("scale_decided").back();
  CHECK(undone["group"] == "ps");
  CHECK(undone["reason"].get<std::string>().find("no machine came for the ps group's new slot 1") == 0);
  CHECK(std::count(h.provider.calls.begin(), h.provider.calls.end(), "launch 1 1000") == 7);  // at the start (a worker then), for the new server, then five more
  const json a = h.running(w1);
  REQUIRE(a["action"] == "run");
  CHECK(a["rank"] == 1);
  CHECK(a["world_size"] == 3);
  CHECK(json::parse(a["env"]["GOODPUT_REPLICAS"].get<std::string>()) == json{{"ps", 1}, {"worker", 2}});
  CHECK(h.running(w2)["rank"] == 2);
  CHECK(h.running(p)["rank"] == 0);
}

TEST_CASE("every rank is told its replica type, index and command; the world's shape is in the env") {
  PsHarness h;
  const int32_t p = h.launched_for("p", 0), w1 = h.launched_for("w1", 1), w2 = h.launched_for("w2", 2);
  const json a = h.running(p);
  REQUIRE(a["action"] == "run");
  CHECK(a["rank"] == 0);
  CHECK(a["command"] == json{"python3", "ps.py"});
  CHECK(a["env"]["GOODPUT_REPLICA_TYPE"] == "ps");
  CHECK(a["env"]["GOODPUT_REPLICA_INDEX"] == "0");
  CHECK(json::parse(a["env"]["GOODPUT_REPLICAS"].get<std::string>()) == json{{"ps", 1}, {"worker", 2}});
  CHECK(a["env"]["A"] == "1");
  const json b = h.running(w2);
  CHECK(b["rank"] == 2);
  CHECK(b["command"] == json{"python3", "train.py"});
  CHECK(b["env"]["GOODPUT_REPLICA_TYPE"] == "worker");
  CHECK(b["env"]["GOODPUT_REPLICA_INDEX"] == "1");
  CHECK(h.running(w1)["env"]["GOODPUT_REPLICA_INDEX"] == "0");
}

TEST_CASE("a node launched as a worker never takes a parameter server's slot") {
  PsHarness h;
  h.launched_for("p", 0);
  // A worker launched for slot 1 finds it taken (a retry raced it): it takes the other worker slot,
  // not a parameter server's.
  h.launched_for("w1", 1);
  h.launched_for("w1b", 1);
  CHECK(h.events("node_joined")[1]["slot"] == 1);
  CHECK(h.events("node_joined")[2]["slot"] == 2);
  // A third worker has no worker slot left: it joins as a spare, even with no one in the ps slot
  // after the parameter server is relaunched.
  h.provider.losses.push_back({"p", "node p is gone", false});
  h.tick();
  REQUIRE(h.events("recovery_decided").size() == 1);
  CHECK(h.provider.calls.back() == "launch 0 1000");
  const int32_t w3 = h.launched_for("w3", 2);
  CHECK(h.events("node_joined").back()["slot"] == -1);
  CHECK(h.post("/v1/heartbeat", json{{"node", w3}})["action"] == "stop");
  // The parameter server's replacement takes slot 0.
  h.launched_for("p2", 0);
  CHECK(h.events("node_joined").back()["slot"] == 0);
}

TEST_CASE("scaling gives up and takes back workers only; a lost parameter server waits for its replacement") {
  PsHarness h;
  h.start();
  // Worker 2's machine is lost, and the machine launched to replace it never comes: no spare.
  h.provider.losses.push_back({"w2", "node w2 is gone", false});
  h.tick();
  h.provider.losses.push_back({"ray-9", "never scheduled", false});
  h.tick();
  CHECK(h.events("no_spare_node").back()["slot"] == 2);
  CHECK(h.scales() == std::vector<std::pair<int, int>>{{3, 2}});
  json a = h.running(0);
  REQUIRE(a["action"] == "run");
  CHECK(a["world_size"] == 2);
  CHECK(json::parse(a["env"]["GOODPUT_REPLICAS"].get<std::string>()) == json{{"ps", 1}, {"worker", 1}});
  // The machine asked for after that comes: it joins as a spare, the world grows back, it is worker 1.
  const int32_t w3 = h.launched_for("w3", 2);
  CHECK(h.events("node_joined").back()["slot"] == -1);
  CHECK(h.scales() == std::vector<std::pair<int, int>>{{3, 2}, {2, 3}});
  a = h.running(w3);
  REQUIRE(a["action"] == "run");
  CHECK(a["rank"] == 2);
  CHECK(a["world_size"] == 3);
  CHECK(a["env"]["GOODPUT_REPLICA_TYPE"] == "worker");

  // Now the parameter server is lost and its replacement never comes. Giving up a worker cannot
  // stand in for it (the no_spare_node says the slot is fixed), so the elastic policy keeps the
  // world: it waits, and runs again when the parameter server's replacement joins.
  h.provider.losses.push_back({"p", "node p is gone", false});
  h.tick();
  h.provider.losses.push_back({"ray-10", "never scheduled", false});
  h.tick();
  CHECK(h.events("no_spare_node").back()["slot"] == 0);
  CHECK(h.events("no_spare_node").back()["fixed"] == true);
  CHECK(h.events("no_spare_node").front().contains("fixed") == false);  // a worker's slot: left out
  CHECK(h.scales() == std::vector<std::pair<int, int>>{{3, 2}, {2, 3}});
  CHECK(h.running(1)["action"] != "run");
  CHECK(h.master->state().phase() == Phase::WaitingForCapacity);  // waiting for a machine, none to be had
  const int32_t p2 = h.launched_for("p2", 0);
  CHECK(h.events("node_joined").back()["slot"] == 0);
  CHECK(h.scales() == std::vector<std::pair<int, int>>{{3, 2}, {2, 3}});  // no scale in between
  a = h.running(p2);
  REQUIRE(a["action"] == "run");
  CHECK(a["world_size"] == 3);
  CHECK(a["command"] == json{"python3", "ps.py"});
  CHECK(h.running(w3)["rank"] == 2);

  // A master resumed from this log places every node where the running one did.
  json spec = ps_job({{{"type", "ps"}, {"command", {"python3", "ps.py"}}}, {{"type", "worker"}, {"count", 2}}});
  spec["policy"] = {{"scaling", {{"policy", "elastic"}, {"min_nodes", 2}}}};
  h.new_master(spec, load_policy(json{{"scaling", {{"policy", "elastic"}, {"min_nodes", 2}}}}));
  CHECK(h.running(p2)["rank"] == 0);
  CHECK(h.running(1)["rank"] == 1);
  CHECK(h.running(w3)["rank"] == 2);
}
