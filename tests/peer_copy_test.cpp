// Checkpoint copies in peers' memory (agent/replica.h) over real TCP into real shared memory: a
// trainer's checkpoint sent to a holder, fetched back by a node that never had it, and every way it
// must refuse (a wrong token, a copy it does not hold, a spoiled copy, bytes spoiled on the way).
// The live job that uses them, with real processes killed with SIGKILL: tests/python/test_live.py.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "agent/replica.h"
#include "master_harness.h"

using namespace goodput;
using namespace goodput::ckpt;
using goodput::agent::HeldReplica;
using goodput::agent::ReplicaServer;
using nlohmann::json;

namespace {

std::string shm(const std::string& name) { return "/gp-copy-" + std::to_string(::getpid()) + "-" + name; }

Options node(const std::string& name, int32_t rank = 0, int32_t world = 1) {
  Options o;
  o.job = "copies";
  o.rank = rank;
  o.world_size = world;
  o.shm_prefix = shm(name);
  o.peers_share_memory = false;
  return o;
}

std::vector<uint8_t> bytes_of(int64_t step, size_t n) {
  std::vector<uint8_t> v(n);
  uint32_t x = static_cast<uint32_t>(step) * 2654435761u + 7;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// Saves `step` as a trainer would: 3 MiB of weights (so the copy spans chunks) and a small buffer.
void save(FlashCheckpoint& c, int64_t step) {
  const auto w = bytes_of(step, 3 << 20), o = bytes_of(step + 1000, 4099);
  c.save(step, {{"w", "float32", {static_cast<int64_t>(w.size() / 4)}, w.data(), w.size()},
                {"o", "bytes", {static_cast<int64_t>(o.size())}, o.data(), o.size()}});
}

void check_holds(FlashCheckpoint& c, int64_t step) {
  const auto l = c.load(step);
  REQUIRE(l);
  CHECK(l->tier == ckpt::Tier::Memory);
  uint64_t n = 0;
  const uint8_t* w = l->buffer("w", &n);
  const auto want = bytes_of(step, 3 << 20);
  REQUIRE(n == want.size());
  CHECK(std::memcmp(w, want.data(), n) == 0);
  const uint8_t* o = l->buffer("o", &n);
  REQUIRE(n == 4099);
  CHECK(std::memcmp(o, bytes_of(step + 1000, 4099).data(), n) == 0);
}

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "no error";
}

struct Removed {
  std::vector<FlashCheckpoint*> c;
  ~Removed() {
    for (auto* x : c) x->remove_memory();
  }
};

constexpr auto kTimeout = std::chrono::seconds(10);

}  // namespace

TEST_CASE("a checkpoint copied to a peer comes back bit for bit into a node that never had it") {
  FlashCheckpoint trainer(node("src")), relaunched(node("new"));
  Removed removed{{&trainer, &relaunched}};
  ReplicaServer holder("token", "holder-" + std::to_string(::getpid()));
  save(trainer, 10);
  const auto copy = trainer.newest_copy();
  REQUIRE(copy);
  const auto sent = agent::send_replica(*copy, "copies-run1", "127.0.0.1", holder.port(), "token", 0, kTimeout);
  CHECK(sent.step == 10);
  CHECK(sent.bytes > (3u << 20));
  const auto held = holder.held();
  REQUIRE(held.size() == 1);
  CHECK(held[0].rank == 0);
  CHECK(held[0].step == 10);

  CHECK_FALSE(relaunched.newest_in_memory());
  const auto got = agent::fetch_replica(relaunched, "copies-run1", 10, "127.0.0.1", holder.port(), "token", kTimeout);
  CHECK(got.step == 10);
  CHECK(relaunched.newest_in_memory() == 10);
  check_holds(relaunched, 10);

  SUBCASE("a holder keeps the two newest copies of a rank, as a trainer keeps its own two") {
    save(trainer, 20);
    agent::send_replica(*trainer.newest_copy(), "copies-run1", "127.0.0.1", holder.port(), "token", 4e9, kTimeout);
    save(trainer, 30);
    agent::send_replica(*trainer.newest_copy(), "copies-run1", "127.0.0.1", holder.port(), "token", 0, kTimeout);
    const auto now = holder.held();
    REQUIRE(now.size() == 2);
    CHECK(now[0].step == 20);
    CHECK(now[1].step == 30);
    CHECK(error_of([&] { agent::fetch_replica(relaunched, "copies-run1", 10, "127.0.0.1", holder.port(), "token", kTimeout); })
              .find("holds no copy of rank 0 at step 10") != std::string::npos);
    agent::fetch_replica(relaunched, "copies-run1", 30, "127.0.0.1", holder.port(), "token", kTimeout);
    check_holds(relaunched, 30);
    check_holds(relaunched, 10);  // the fetch took the object that did not hold the newest
  }
  SUBCASE("copies of another run are not this run's") {
    CHECK(error_of([&] { agent::fetch_replica(relaunched, "copies-run2", 10, "127.0.0.1", holder.port(), "token", kTimeout); })
              .find("holds no copy") != std::string::npos);
  }
  SUBCASE("a copy of rank 0 of a world of one is not rank 0 of a world of two") {
    FlashCheckpoint other(node("other", 0, 2));
    Removed also{{&other}};
    CHECK(error_of([&] { agent::fetch_replica(other, "copies-run1", 10, "127.0.0.1", holder.port(), "token", kTimeout); })
              .find("holds rank 0 of 1") != std::string::npos);
    CHECK_FALSE(other.newest_in_memory());
  }
  SUBCASE("a wrong token gets no answer and stores nothing") {
    save(trainer, 40);
    const std::string e = error_of(
        [&] { agent::send_replica(*trainer.newest_copy(), "copies-run1", "127.0.0.1", holder.port(), "other", 0, kTimeout); });
    CHECK(e != "no error");
    CHECK(holder.held().back().step == 10);
  }
}

TEST_CASE("a spoiled copy fails its checksum and is never loadable, on the holder or on the fetching node") {
  FlashCheckpoint trainer(node("src2")), relaunched(node("new2"));
  Removed removed{{&trainer, &relaunched}};
  ReplicaServer holder("token", "holder2-" + std::to_string(::getpid()));
  save(trainer, 10);
  agent::send_replica(*trainer.newest_copy(), "run", "127.0.0.1", holder.port(), "token", 0, kTimeout);

  SUBCASE("spoiled in the holder's memory (a bad DIMM): the holder refuses to hand it out") {
    CHECK(holder.corrupt() == 1);
    const std::string e =
        error_of([&] { agent::fetch_replica(relaunched, "run", 10, "127.0.0.1", holder.port(), "token", kTimeout); });
    CHECK(e.find("failed its check") != std::string::npos);
    CHECK(e.find("checksum mismatch in buffer 'w'") != std::string::npos);
    CHECK_FALSE(relaunched.newest_in_memory());
  }
  SUBCASE("spoiled on the way: the holder verifies before it commits, and keeps the copy it had") {
    save(trainer, 20);
    auto copy = trainer.newest_copy();
    REQUIRE(copy);
    const_cast<uint8_t*>(copy->data())[12345] ^= 1;
    const std::string e =
        error_of([&] { agent::send_replica(*copy, "run", "127.0.0.1", holder.port(), "token", 0, kTimeout); });
    CHECK(e.find("refused: the copy failed its check here: checksum mismatch in buffer 'w'") != std::string::npos);
    const auto held = holder.held();
    REQUIRE(held.size() == 1);
    CHECK(held[0].step == 10);
    agent::fetch_replica(relaunched, "run", 10, "127.0.0.1", holder.port(), "token", kTimeout);
    check_holds(relaunched, 10);
  }
  SUBCASE("a holder that is gone: the fetch says so") {
    std::optional<ReplicaServer> gone(std::in_place, "token", "gone-" + std::to_string(::getpid()));
    const uint16_t port = gone->port();
    gone.reset();
    CHECK(error_of([&] { agent::fetch_replica(relaunched, "run", 10, "127.0.0.1", port, "token", kTimeout); })
              .find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
  }
}

// ---- the master's side: who holds what, when it is logged, and what a relaunched node is told ----

namespace {

struct CopiesHarness : test::Harness {
  CopiesHarness()
      : Harness(Spec{json{{"job", "cp"}, {"nodes", 3}, {"command", {"python3", "train.py"}}, {"total_steps", 100},
                          {"heartbeat_timeout", "1h"}, {"hang_timeout", "1h"}, {"replica_mb_per_s", 0}},
                     load_policy(json{{"checkpoint", {{"policy", "flash"}, {"every_steps", 10}, {"persist_every", 100},
                                                      {"replicas", 1}}}})}) {}
  int32_t launched_for(const std::string& name, int32_t slot, uint16_t port) {
    return post("/v1/register", json{{"name", name}, {"slot", slot}, {"replica_port", port}})["node"].get<int32_t>();
  }
  json beat_with(int32_t node, const json& trainer, const json& held = json::array()) {
    return post("/v1/heartbeat", json{{"node", node}, {"trainer", trainer}, {"held", held}});
  }
  static json trainer(int32_t restart, int64_t saved_step, int64_t saves) {
    return {{"restart", restart}, {"phase", "training"}, {"step", saved_step + 3}, {"saves", saves},
            {"saved_step", saved_step}, {"loaded", {{"step", 0}, {"tier", "none"}, {"ns", 0}}}};
  }
};

}  // namespace

TEST_CASE("the master names each node's holders, logs replica_stored once every holder has the newest save, "
          "and a relaunch restores from the copies") {
  CopiesHarness h;
  const int32_t a = h.launched_for("a", 0, 7001), b = h.launched_for("b", 1, 7002), c = h.launched_for("c", 2, 7003);
  h.tick(10 * kSecond);
  // Ring placement: slot s's copies go to slot s+1.
  const json order = h.beat_with(a, {{"restart", -1}, {"phase", "none"}});
  REQUIRE(order["action"] == "run");
  CHECK(order["replicate"]["key"] == "cp-run1");
  CHECK(order["replicate"]["holders"] == json::array({{{"name", "b"}, {"host", "127.0.0.1"}, {"port", 7002}}}));
  CHECK(order["replicate"]["bytes_per_s"] == 0);
  CHECK(h.beat_with(c, {{"restart", -1}, {"phase", "none"}})["replicate"]["holders"][0]["name"] == "a");
  for (int i = 0; i < 2; ++i)
    for (int32_t n : {a, b, c}) h.beat_with(n, CopiesHarness::trainer(0, 10, 1));
  REQUIRE(h.master->state().phase() == Phase::Training);
  REQUIRE(h.events("checkpoint_saved").size() == 1);

  // b holds a's (rank 0) and c holds b's; a does not hold c's yet: nothing is logged.
  h.beat_with(b, CopiesHarness::trainer(0, 10, 1), json::array({{0, 10}}));
  h.beat_with(c, CopiesHarness::trainer(0, 10, 1), json::array({{1, 10}}));
  h.beat_with(a, CopiesHarness::trainer(0, 10, 1), json::array({{2, 0}}));
  CHECK(h.events("replica_stored").empty());
  CHECK(h.request("/v1/heartbeat", json{{"node", a}, {"held", json::array({{-1, 10}})}}).status == 400);
  h.beat_with(a, CopiesHarness::trainer(0, 10, 1), json::array({{2, 10}}));
  REQUIRE(h.events("replica_stored").size() == 1);
  CHECK(h.events("replica_stored")[0]["step"] == 10);
  h.beat_with(a, CopiesHarness::trainer(0, 10, 1), json::array({{2, 10}}));
  CHECK(h.events("replica_stored").size() == 1);  // once per save

  // a's machine is lost: its slot restores step 10 from b's copy, and the new node is told where it is.
  h.provider.losses.push_back({"a", "node process killed by signal 9 (a)"});
  h.tick();
  const int32_t a2 = h.launched_for("a2", 0, 7004);
  h.tick(10 * kSecond);
  const auto restarts = h.events("restart_job");
  REQUIRE(restarts.size() == 2);
  CHECK(restarts[1]["restore_tier"] == "peer");
  CHECK(restarts[1]["restore_step"] == 10);
  const json relaunched = h.beat_with(a2, {{"restart", -1}, {"phase", "none"}});
  REQUIRE(relaunched["action"] == "run");
  CHECK(relaunched["restore_tier"] == "peer");
  CHECK(relaunched["replicate"]["holders"][0]["name"] == "b");
  // c's copies now go to the new node.
  CHECK(h.beat_with(c, CopiesHarness::trainer(0, 10, 1))["replicate"]["holders"][0]["name"] == "a2");

  // Its fetch failed: the reason is logged once, and the trainers' storage restore is what counts.
  h.post("/v1/heartbeat", json{{"node", a2}, {"fetch_error", "could not fetch step 10 from peers (rank 0: b: refused)"}});
  const auto said = h.events("status_observed");
  REQUIRE(said.size() == 1);
  CHECK(said[0]["object"] == "replica");
  CHECK(said[0]["name"] == "a2");
}
