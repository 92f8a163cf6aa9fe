// The `goodput` binary end to end: replay -> SQLite log -> report, compare and sweep, determinism
// across thread counts, and the Young/Daly check of sweep.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

using namespace goodput::test;

namespace {
nlohmann::json run_json(const std::string& args) {
  auto r = run_command(goodput_cmd(args));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.output);
}
const std::string kSmall = source_path("traces/small-2048gpu-7d.jsonl");
const std::string kLlama = source_path("traces/llama3-405b-54d.jsonl");
}  // namespace

TEST_CASE("goodput report on a replay's SQLite log prints the replay's own report") {
  TempDir dir("cli-report");
  const std::string db = dir.file("events.db");
  auto replay = run_json("replay " + kSmall + " --events " + db + " --format json --digest");
  auto report = run_json("report " + db + " --format json --digest");
  CHECK(replay == report);
  CHECK(replay["failures"].get<int>() > 0);
  // The text form carries the same digest.
  auto text = run_command(goodput_cmd("report " + db + " --digest"));
  CHECK(text.output.find(replay["digest"].get<std::string>()) != std::string::npos);
  // An existing log is never overwritten.
  auto again = run_command(goodput_cmd("replay " + kSmall + " --events " + db));
  CHECK(again.exit_code == 2);
  CHECK(again.output.find("already exists") != std::string::npos);
}

TEST_CASE("replay digests agree across runs and compare/sweep agree across thread counts") {
  auto a = run_json("replay " + kLlama + " --format json --digest --seed 4 --resample");
  auto b = run_json("replay " + kLlama + " --format json --digest --seed 4 --resample");
  CHECK(a["digest"] == b["digest"]);
  const std::string cmp = "compare " + kSmall + " --policy " + source_path("examples/policies/flash-diagnose.json") +
                          " --policy " + source_path("examples/policies/restart-all.json") + " --runs 16 --format json";
  CHECK(run_json(cmp + " --threads 1") == run_json(cmp + " --threads 2"));
  const std::string sw = "sweep " + kSmall + " --set checkpoint.interval=1m,5m --runs 8 --format json";
  CHECK(run_json(sw + " --threads 1") == run_json(sw + " --threads 2"));
}

TEST_CASE("the Llama 3 comparison: flash checkpoints with diagnosis beat restart-all") {
  auto j = run_json("compare " + kLlama + " --policy " + source_path("examples/policies/flash-diagnose.json") +
                    " --policy " + source_path("examples/policies/restart-all.json") + " --runs 10 --format json");
  const double flash = j["policies"][0]["goodput_mean"], base = j["policies"][1]["goodput_mean"];
  MESSAGE("flash+diagnose " << flash << " vs restart-all " << base);
  CHECK(flash > base + 0.05);
}

TEST_CASE("with a constant failure rate, sweep finds Daly's optimum interval within 15%") {
  // 16 nodes, one software crash per 4 h on average (MTBF M = 14400 s), 60 s synchronous saves
  // (delta). Young: sqrt(2 * delta * M) = sqrt(2 * 60 * 14400) = 1314.5 s; Daly's higher-order
  // optimum: 1314.5 * (1 + sqrt(60 / 28800) / 3 + (60 / 28800) / 9) - 60 = 1274.8 s.
  TempDir dir("cli-yd");
  const std::string trace = dir.write("constant.jsonl",
      R"({"format":"goodput-trace","version":1,"name":"constant rate","cluster":{"nodes":16,"accelerators_per_node":8},)"
      R"("job":{"step_time":"1s","duration":"30d","checkpoint_bytes_per_node":60000000000,"storage_bandwidth_bytes_per_s":1000000000,)"
      R"("process_restart":"30s","rendezvous":"10s","node_scheduling":"1m","exit_detection":"1s"},)"
      R"("failure_rates":[{"type":"process_crash","reason":"Software bug","per_node_hour":0.015625}]})" "\n");
  const std::string base = dir.write("fixed.json",
      R"({"name":"fixed","recovery":{"policy":"diagnose","restore_from":"storage"},"checkpoint":{"policy":"fixed","tier":"storage"}})");
  auto j = run_json("sweep " + trace + " --policy " + base +
                    " --set checkpoint.interval=600s,800s,950s,1100s,1200s,1315s,1450s,1600s,1800s,2100s,2600s"
                    " --runs 200 --seed 1 --format json");
  CHECK(j["young_interval_s"]["storage"].get<double>() == doctest::Approx(1314.5).epsilon(0.001));
  const double yd = j["daly_interval_s"]["storage"];
  CHECK(yd == doctest::Approx(1274.8).epsilon(0.001));
  const std::string best = j["best"];
  const double best_s = std::stod(best.substr(best.find('=') + 1));
  MESSAGE("best interval " << best_s << " s, Daly " << yd << " s");
  CHECK(std::abs(best_s - yd) / yd < 0.15);
  // The curve falls off on both sides of the optimum.
  const auto& pts = j["points"];
  CHECK(pts[0]["goodput_mean"].get<double>() < j["points"][5]["goodput_mean"].get<double>());
  CHECK(pts[10]["goodput_mean"].get<double>() < j["points"][5]["goodput_mean"].get<double>());
}

TEST_CASE("bad arguments and bad policies exit 2 with a reason") {
  TempDir dir("cli-args");
  auto r = run_command(goodput_cmd("replay " + kSmall + " --format yaml"));
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("--format must be text or json") != std::string::npos);
  const std::string bad = dir.write("bad.json", R"({"checkpoint": {"policy": "fixed", "interval": "often"}})");
  r = run_command(goodput_cmd("replay " + kSmall + " --policy " + bad));
  CHECK(r.exit_code == 2);
  CHECK(r.output.find(bad + ": field 'checkpoint.interval'") != std::string::npos);
  r = run_command(goodput_cmd("sweep " + kSmall + " --set checkpoint.interval"));
  CHECK(r.exit_code == 2);
  r = run_command(goodput_cmd("sweep " + kSmall + " --set checkpoint.tier=tape --runs 2"));
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("checkpoint.tier=tape") != std::string::npos);
  r = run_command(goodput_cmd("report " + dir.file("nothing.db")));
  CHECK(r.exit_code == 2);
  r = run_command(goodput_cmd("--help"));
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("replay") != std::string::npos);
}

TEST_CASE("goodput explain tells one node's story from the log, in order") {
  TempDir dir("cli-explain");
  const std::string db = dir.file("events.db");
  REQUIRE(run_command(goodput_cmd("replay " + kSmall + " --events " + db)).exit_code == 0);
  auto r = run_command(goodput_cmd("explain " + db + " --node n236"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  const auto joined = r.output.find("joined as slot 236");
  const auto observed = r.output.find("observed node_lost");
  const auto decided = r.output.find("decided: hardware_error by rule 'node-lost' -> relaunch_node");
  const auto resumed = r.output.find("job: training again from step");
  CHECK(joined != std::string::npos);
  CHECK(observed > joined);
  CHECK(decided > observed);
  CHECK(resumed > decided);
  CHECK(resumed != std::string::npos);
  auto bad = run_command(goodput_cmd("explain " + db + " --node n99999x"));
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("no node 'n99999x'") != std::string::npos);
}

TEST_CASE("a recorded log replays as a trace: the same policy gives the same goodput, another policy its own") {
  TempDir dir("cli-fromlog");
  const std::string small = dir.file("small.db"), llama = dir.file("llama.db");
  const std::string flash = " --policy " + source_path("examples/policies/flash-diagnose.json");
  auto recorded = run_json("replay " + kSmall + flash + " --events " + small + " --format json");
  auto again = run_json("replay --from-log " + small + flash + " --format json");
  CHECK(again["goodput"] == recorded["goodput"]);
  CHECK(again["failures"] == recorded["failures"]);
  auto other = run_json("replay --from-log " + small + " --policy " + source_path("examples/policies/restart-all.json") +
                        " --format json");
  CHECK(other["goodput"].get<double>() < recorded["goodput"].get<double>());
  // 54 days with hundreds of relaunches: spares are reused in a different order, still within 0.5 points.
  auto long_run = run_json("replay " + kLlama + " --events " + llama + " --format json");
  auto long_again = run_json("replay --from-log " + llama + " --format json");
  CHECK(std::abs(long_again["goodput"].get<double>() - long_run["goodput"].get<double>()) < 0.005);
  auto both = run_command(goodput_cmd("replay " + kSmall + " --from-log " + small));
  CHECK(both.exit_code == 2);
}
