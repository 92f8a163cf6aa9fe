// The live side's pure parts: the data-shard ledger as a fold, the job spec's strictness, the
// master's clock. (Real processes, signals and PyTorch are in tests/python/test_live.py.)
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "backends/live/job_spec.h"
#include "backends/live/live_master.h"
#include "engine/json_reader.h"
#include "engine/shard_ledger.h"
#include "test_util.h"

using namespace goodput;

TEST_CASE("the shard ledger hands out each shard once and re-queues work a restore threw away") {
  ShardLedger l;
  l.reset(6);
  uint64_t seq = 0;
  auto apply = [&](EventPayload p) { l.apply(Event{++seq, 0, std::move(p)}); };
  apply(ShardsAssigned{0, 0, {0}});
  apply(ShardsAssigned{1, 0, {1}});
  CHECK(l.next_queued() == 2);
  apply(ShardsCompleted{0, 10, {0}});
  apply(ShardsCompleted{1, 10, {1}});
  apply(ShardsAssigned{0, 1, {2}});
  apply(ShardsAssigned{1, 1, {3}});
  apply(ShardsCompleted{0, 20, {2}});
  CHECK(l.done() == 3);
  CHECK_FALSE(l.assigned_to(3, 0));  // node 1 holds it
  apply(ShardsCompleted{0, 20, {3}});  // not node 0's: refused
  CHECK(l.rejected() == 1);
  // A failure: the world restarts (shard 3, held by node 1, goes back) and loads step 10 (shard
  // 2, done at step 20, goes back too: the model no longer contains it).
  apply(RestartJob{2, 1, 0, 10, Tier::Memory});
  apply(CheckpointLoaded{10, Tier::Memory, 0});
  CHECK(l.done() == 2);
  CHECK(l.queued() == 4);
  CHECK(l.next_queued() == 2);
  CHECK(l.done_by(0, 0));
  apply(ShardsCompleted{0, 30, {0}});  // done twice would be a duplicate
  CHECK(l.duplicates() == 1);
}

TEST_CASE("a job spec names the file and field it rejects") {
  const auto dir = std::filesystem::temp_directory_path() / "goodput-spec-test";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& text) {
    std::ofstream(dir / "job.json") << text;
    return (dir / "job.json").string();
  };
  auto error_of = [&](const std::string& text) {
    try {
      live::load_job_spec(write(text));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error_of(R"({"job":"j","command":["x"],"total_steps":10,"nodes":0})").find("nodes") != std::string::npos);
  CHECK(error_of(R"({"job":"j","command":"python train.py","total_steps":10})").find("command") != std::string::npos);
  CHECK(error_of(R"({"job":"j/../x","command":["x"],"total_steps":10})").find("'job'") != std::string::npos);
  CHECK(error_of(R"({"job":"j","command":["x"],"total_steps":10,"nodse":2})").find("nodse") != std::string::npos);
  CHECK(error_of(R"({"job":"j","command":["x"]})").find("total_steps") != std::string::npos);
  CHECK(error_of(R"({"job":"j","command":["x"],"total_steps":10,"heartbeat_timeout":"100ms"})").find("heartbeat_timeout") !=
        std::string::npos);
  CHECK(error_of("{").find("job.json: not valid JSON") != std::string::npos);
  const live::JobSpec s = live::load_job_spec(write(R"({"job":"j","command":["a","b c"],"total_steps":10,"nodes":3,
      "step_time":"2s","env":{"A":"1"},"data_shards":30})"));
  CHECK(s.command == std::vector<std::string>{"a", "b c"});
  CHECK(s.step_time == 2 * kSecond);
  CHECK(s.env.at("A") == "1");
  CHECK(s.job_started().nodes == 3);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the master's clock never goes back, across restarts and wall-clock jumps") {
  const int64_t now = live::LiveClock::unix_now_ns();
  // A restarted master whose wall clock jumped back an hour still starts after its log's last event.
  const live::LiveClock behind(now + 3600 * kSecond, 5 * kSecond);
  CHECK(behind.now() >= 5 * kSecond);
  Time last = behind.now();
  for (int i = 0; i < 1000; ++i) {
    const Time t = behind.now();
    CHECK(t >= last);
    last = t;
  }
  // Normally: the time since the job's epoch.
  const live::LiveClock normal(now - 10 * kSecond, 0);
  CHECK(normal.now() >= 10 * kSecond);
  CHECK(normal.now() < 3600 * kSecond);
}
