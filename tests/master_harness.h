// A live master driven through its HTTP handler with a manual clock, a real SQLite log and a
// provider that records what the master asks of its machines (and reports the losses a test
// queues). Shared by the tests of the master's node checks and of its replica groups.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "backends/live/job_spec.h"
#include "backends/live/live_master.h"
#include "backends/live/master_api.h"
#include "backends/live/master_status.h"
#include "engine/event_json.h"
#include "engine/event_store.h"
#include "policies/policy.h"

namespace goodput::test {

using nlohmann::json;
namespace fs = std::filesystem;

struct ManualClock final : Clock {
  Time t = 0;
  Time now() const override { return t; }
};

// Records what the master asks of its machines.
struct RecordingProvider final : live::NodeProvider {
  std::vector<std::string> calls;
  std::function<void()> on_call;  // run as each call is made (a test looks at the log then)
  void launch(int32_t slot, int32_t memory_permille) override {
    if (on_call) on_call();
    calls.push_back("launch " + std::to_string(slot) + " " + std::to_string(memory_permille));
  }
  void terminate(const std::string& name) override {
    if (on_call) on_call();
    calls.push_back("terminate " + name);
  }
  std::vector<live::LostNode> losses;  // reported with the master's next tick
  std::vector<live::LostNode> lost() override { return std::exchange(losses, {}); }
  void shut_down(int) override {}
  void exclude(const std::string& name) override { calls.push_back("exclude " + name); }
};

struct Harness {
  static inline int harnesses = 0;  // two in one test must not share a log
  fs::path db = fs::temp_directory_path() /
                ("goodput-check-" + std::to_string(::getpid()) + "-" + std::to_string(harnesses++) + ".db");
  ManualClock clock;
  RecordingProvider provider;
  std::unique_ptr<SqliteStore> store;
  std::unique_ptr<live::LiveMaster> master;
  std::unique_ptr<live::MasterApi> api;  // the master's HTTP API, with the token "tok"

  // A job of `nodes` nodes with that node check (null: none).
  explicit Harness(const json& node_check, int nodes = 3) : Harness(spec_with(node_check, nodes)) {}
  struct Spec {
    json spec;  // a job spec
    PolicySet policy = default_policy();
  };
  explicit Harness(Spec s) {
    fs::remove(db);
    store = std::make_unique<SqliteStore>(db.string(), SqliteStore::Mode::Create);
    new_master(s.spec, std::move(s.policy));
  }
  // A master (a fresh one, or one resumed from the log so far) for this job spec.
  void new_master(const json& spec, PolicySet policy = default_policy()) {
    api.reset();
    master.reset();
    master = std::make_unique<live::LiveMaster>(live::job_spec_from_json(spec, "", "."), std::move(policy), *store, clock,
                                                &provider, "run1");
    api = std::make_unique<live::MasterApi>(*master, "tok");
  }
  static Spec spec_with(const json& node_check, int nodes) {
    json spec{{"job", "chk"}, {"nodes", nodes}, {"command", {"true"}}, {"total_steps", 10},
              {"heartbeat_timeout", "1h"}, {"hang_timeout", "1h"}};
    if (!node_check.is_null()) spec["node_check"] = node_check;
    return {spec};
  }
  ~Harness() {
    api.reset();
    master.reset();
    store.reset();
    fs::remove(db);
  }
  net::HttpResponse request(const std::string& path, const json& body) {
    net::HttpRequest r;
    r.method = "POST";
    r.target = path;
    r.authorization = "Bearer tok";
    r.body = body.dump();
    r.peer_address = "127.0.0.1";
    return api->handle(r);
  }
  json post(const std::string& path, const json& body) {  // one that must succeed
    const auto resp = request(path, body);
    REQUIRE_MESSAGE(resp.status == 200, resp.body);
    return json::parse(resp.body);
  }
  int32_t join(const std::string& name, uint16_t port, uint16_t rdzv_port = 0) {
    json body{{"name", name}, {"check_port", port}};
    if (rdzv_port) body["rdzv_port"] = rdzv_port;
    return post("/v1/register", body)["node"].get<int32_t>();
  }
  std::map<int32_t, int64_t> check_ids;  // the round id each node was last asked to check under
  json beat(int32_t node, json check = nullptr) {
    json b{{"node", node}, {"trainer", {{"restart", -1}, {"phase", "none"}}}};
    if (!check.is_null() && !check.contains("id")) check["id"] = check_ids[node];
    if (!check.is_null()) b["check"] = check;
    json a = post("/v1/heartbeat", b);
    if (a.contains("check")) check_ids[node] = a["check"]["id"].get<int64_t>();
    return a;
  }
  void tick(Duration d = 100 * kMillisecond) {
    clock.t += d;
    master->tick();
  }
  std::vector<json> events(const std::string& type) {
    std::vector<json> out;
    store->for_each([&](const Event& e) {
      if (event_type_name(e.payload) == type) out.push_back(payload_to_json(e.payload));
    });
    return out;
  }
};

}  // namespace goodput::test
