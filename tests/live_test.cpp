// The live side's pure parts: the data-shard ledger as a fold, the job spec's strictness, the
// master's clock. (Real processes, signals and PyTorch are in tests/python/test_live.py.)
#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "net/http.h"
#include "backends/live/agreement.h"
#include "backends/live/job_spec.h"
#include "backends/live/live_master.h"
#include "engine/json_reader.h"
#include "engine/shard_ledger.h"
#include "master_harness.h"
#include "test_util.h"

using namespace goodput;
using namespace goodput::test;

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
  // A policy option the live side does not have yet is refused, not silently ignored.
  CHECK(error_of(R"({"job":"j","command":["x"],"total_steps":10,"preload":["torch","a b"]})").find("preload") !=
        std::string::npos);
  CHECK(error_of(R"({"job":"j","command":["x"],"total_steps":10,"preload":"torch"})").find("preload") != std::string::npos);
  CHECK(error_of(R"({"job":"j","command":["x"],"total_steps":10,"policy":{"scaling":{"warm_spares":2}}})")
            .find("field 'scaling.warm_spares' is for the simulator so far") != std::string::npos);
  // Copies in peers' memory run live, at the spec's pace.
  const live::JobSpec copies = live::load_job_spec(write(R"({"job":"j","command":["x"],"total_steps":10,
      "policy":{"checkpoint":{"policy":"flash","every_steps":10,"replicas":1}},"replica_mb_per_s":250})"));
  CHECK(copies.replica_mb_per_s == 250);
  CHECK(error_of(R"({"job":"j","command":["x"],"total_steps":10,"replica_mb_per_s":-1})").find("replica_mb_per_s") !=
        std::string::npos);
  const live::JobSpec s = live::load_job_spec(write(R"({"job":"j","command":["a","b c"],"total_steps":10,"nodes":3,
      "step_time":"2s","env":{"A":"1"},"data_shards":30})"));
  CHECK(s.command == std::vector<std::string>{"a", "b c"});
  CHECK(s.step_time == 2 * kSecond);
  CHECK(s.env.at("A") == "1");
  CHECK(s.job_started().nodes == 3);
  CHECK_FALSE(s.warm_start);
  CHECK(s.preload == std::vector<std::string>{"torch"});
  // Warm starts run live: the policy's flag reaches the spec, with the modules to preload.
  const live::JobSpec w = live::load_job_spec(write(R"({"job":"j","command":["x"],"total_steps":10,
      "policy":{"recovery":{"warm_start":true}},"preload":["torch","numpy.linalg"]})"));
  CHECK(w.warm_start);
  CHECK(w.preload == std::vector<std::string>{"torch", "numpy.linalg"});
  CHECK(error_of(R"({"job":"j","command":["x"],"total_steps":10,"spares":-1})").find("spares") != std::string::npos);
  CHECK(live::load_job_spec(write(R"({"job":"j","command":["x"],"total_steps":10,"spares":2})")).spares == 2);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a bad policy is refused with the file it came from, before the run writes anything; an empty log blocks nothing") {
  TempDir dir("bad-policy");
  const std::string bad = R"({"recovery": {"policy": "nonexistent"}})";
  dir.write("policy.json", bad);
  const std::string from_file = dir.write("file.json", R"({"job":"j","command":["/bin/true"],"total_steps":10,"policy":"policy.json"})");
  const std::string inline_spec = dir.write("inline.json", std::string(R"({"job":"j","command":["/bin/true"],"total_steps":10,"policy":)") + bad + "}");
  const std::string run_dir = dir.file("run");
  for (const auto& [spec, names] : {std::pair{from_file, std::string("policy file " + dir.file("policy.json"))},
                                    std::pair{inline_spec, std::string("inline policy (field 'policy')")}}) {
    const auto r = run_command(goodput_cmd("run " + spec + " --run-dir " + run_dir));
    CAPTURE(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(spec + ": " + names + ": field 'recovery.policy'") != std::string::npos);
    CHECK(r.output.find("nonexistent") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(run_dir));  // no directory, no events.db, no token
  }
  // With --termination-log (a pod's terminationMessagePath), the same end as one JSON object.
  const auto refused = run_command(goodput_cmd("run " + inline_spec + " --run-dir " + run_dir + " --termination-log " +
                                               dir.file("termination-log")));
  CHECK(refused.exit_code == 2);
  std::ifstream term(dir.file("termination-log"));
  const nlohmann::json ended = nlohmann::json::parse(term);
  CHECK(ended["exit"] == 2);
  CHECK(ended["error"].get<std::string>().find("field 'recovery.policy'") != std::string::npos);
  // A start that failed after the log was made but before its first event left an empty log: the
  // next start goes ahead (here `goodput master`, which waits for agents; it is stopped at once).
  std::filesystem::create_directories(run_dir);
  { SqliteStore empty(run_dir + "/events.db", SqliteStore::Mode::Create); }
  const std::string good = dir.write("good.json", R"({"job":"j","command":["/bin/true"],"total_steps":10})");
  const auto r = run_command("timeout -s INT 3 " + goodput_cmd("master " + good + " --run-dir " + run_dir));
  CAPTURE(r.output);
  CHECK(r.output.find("already holds") == std::string::npos);
  CHECK(r.output.find("started job j") != std::string::npos);
  // Now it holds a job: a second start is refused, and --resume is the way on.
  const auto again = run_command(goodput_cmd("master " + good + " --run-dir " + run_dir));
  CHECK(again.exit_code == 2);
  CHECK(again.output.find("already holds a job's log") != std::string::npos);
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

// The whole live path in the binary this suite was built with (so under ASan+UBSan in that pass,
// where the Python suites do not run): `goodput run`, the master, two real agent processes with
// their node check (compute and TCP link probes), C++ trainers that save flash checkpoints through
// the library (tests/ckpt_trainer.cpp, built alike), the agents persisting them, a trainer
// SIGKILLed mid-run and restarted from memory, its bytes checked. Any sanitizer report in an agent
// or a trainer fails the test.
TEST_CASE("a live run with real agents: node check, checkpoints persisted, a killed trainer restored, no sanitizer report") {
  test::TempDir dir("live-agents");
  const nlohmann::json job{{"job", "agents"},
                           {"nodes", 2},
                           {"command", {GOODPUT_CKPT_TRAINER}},
                           {"policy", {{"name", "flash"},
                                       {"recovery", {{"policy", "diagnose"}, {"restore_from", "memory"}}},
                                       {"checkpoint", {{"policy", "flash"}, {"every_steps", 10}, {"persist_every", 2}}}}},
                           {"total_steps", 80},
                           {"step_time", "50ms"},
                           {"heartbeat_interval", "200ms"},
                           {"heartbeat_timeout", "10s"},
                           {"hang_timeout", "20s"},
                           // Not about stragglers: ASan and a parallel CTest make links between agents here uneven.
                           {"node_check", {{"compute", "100ms"}, {"link_mib", 2}, {"straggler_factor", 50}}}};
  const std::string spec = dir.write("job.json", job.dump());
  const std::string faults = dir.write("faults.json", R"([{"fault": "kill-process", "slot": 1, "at_step": 25}])");
  const std::string run_dir = dir.file("run");
  const auto run = test::run_command(test::goodput_cmd("run " + spec + " --run-dir " + run_dir + " --faults " + faults));
  REQUIRE_MESSAGE(run.exit_code == 0, run.output);
  const auto events = test::run_command(test::goodput_cmd("report " + run_dir + "/events.db --format events"));
  REQUIRE(events.exit_code == 0);
  int checked = 0, failures = 0, persisted = 0;
  std::vector<nlohmann::json> loaded;
  std::string finished;
  std::istringstream lines(events.output);
  for (std::string line; std::getline(lines, line);) {
    const auto e = nlohmann::json::parse(line);
    if (e["type"] == "node_checked") {
      ++checked;
      CHECK(e["data"]["verdict"] == "passed");
      CHECK(e["data"]["link_ok"] == true);
      CHECK(e["data"]["compute_ok"] == true);
    } else if (e["type"] == "failure_observed") {
      ++failures;
      CHECK(e["data"]["kind"] == "process_exit");
      CHECK(e["data"]["signal"] == 9);
    } else if (e["type"] == "job_finished") {
      finished = e["data"]["reason"];
    } else if (e["type"] == "checkpoint_persisted") {
      persisted += e["data"]["count"].get<int>();
    } else if (e["type"] == "checkpoint_loaded") {
      loaded.push_back(e["data"]);
    }
  }
  // The restart after the kill (at step 25 or a heartbeat later) loaded a memory checkpoint saved
  // before it (the trainer checked its bytes), and saves reached storage through the agents' persisters.
  REQUIRE(loaded.size() == 2);
  CHECK(loaded[1]["tier"] == "memory");
  CHECK(loaded[1]["step"].get<int>() >= 20);
  CHECK(loaded[1]["step"].get<int>() < 80);
  CHECK(loaded[1]["step"].get<int>() % 10 == 0);
  CHECK(persisted > 0);
  const auto listed = test::run_command(test::goodput_cmd("ckpt ls " + run_dir + "/checkpoints"));
  CHECK_MESSAGE(listed.output.find("step 80: 2 of 2 ranks, complete") != std::string::npos, listed.output);
  CHECK(checked == 2);
  CHECK(failures == 1);
  CHECK(finished == "completed");
  for (const auto& node : std::filesystem::directory_iterator(run_dir + "/nodes"))
    for (const auto& f : std::filesystem::directory_iterator(node.path())) {
      const std::string name = f.path().filename().string();
      if (name != "agent.log" && name.find("stderr") == std::string::npos) continue;
      std::ifstream in(f.path());
      const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const std::string what = f.path().string() + ": " + log;
      CHECK_MESSAGE(log.find("Sanitizer") == std::string::npos, what);
      CHECK_MESSAGE(log.find("runtime error") == std::string::npos, what);
      CHECK_MESSAGE(log.find("ckpt_trainer:") == std::string::npos, what);
    }
}

TEST_CASE("raw requests are read as the server reads them: requests, refusals and incomplete bytes") {
  using net::parse_request;
  const auto ok = parse_request("POST /v1/register HTTP/1.1\r\nHost: m\r\nAuthorization: Bearer t\r\nContent-Length: 13\r\n\r\n"
                                "{\"name\":\"n0\"}");
  REQUIRE(ok.request);
  CHECK(ok.request->method == "POST");
  CHECK(ok.request->target == "/v1/register");
  CHECK(ok.request->authorization == "Bearer t");
  CHECK(ok.request->body == "{\"name\":\"n0\"}");
  const auto chunked = parse_request("POST /v1/heartbeat HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n{\"node\":0\r\n1\r\n}\r\n0\r\n\r\n");
  REQUIRE(chunked.request);
  CHECK(chunked.request->body == "{\"node\":0}");
  CHECK(parse_request("POST /v1/inject HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n{").refusal->status == 413);
  CHECK(parse_request("GET / HTTP/1.1\r\nX: " + std::string(17000, 'a') + "\r\n\r\n").refusal->status == 413);
  CHECK(parse_request("GARBAGE\r\n\r\n").refusal->status == 400);
  const auto partial = parse_request("POST /v1/inject HTTP/1.1\r\nContent-Length: 99\r\n\r\n{");
  CHECK_FALSE(partial.request);
  CHECK_FALSE(partial.refusal);
}

TEST_CASE("a node that fell silent when the others' collectives broke is blamed, not the ranks it broke") {
  using nlohmann::json;
  // Three ranks train. c's machine dies (its agent with it: no more heartbeats); a's and b's
  // trainers exit with the errors its death causes, well before the backend reports c lost (a
  // Ray provider sees it on its next poll). The master waits for c instead of blaming a or b.
  json spec{{"job", "settle"}, {"nodes", 3}, {"command", {"true"}}, {"total_steps", 100},
            {"heartbeat_timeout", "5s"}, {"hang_timeout", "1h"}};
  auto start = [](test::Harness& h) {
    const int32_t a = h.join("a", 7001), b = h.join("b", 7002), c = h.join("c", 7003);
    h.tick();
    for (int32_t n : {a, b, c}) REQUIRE(h.beat(n)["action"] == "run");
    for (int32_t n : {a, b, c})
      h.post("/v1/heartbeat", json{{"node", n}, {"trainer", {{"restart", 0}, {"phase", "training"}, {"step", 5},
                                                             {"progress_age_ms", 0},
                                                             {"loaded", {{"step", 0}, {"tier", "none"}, {"ns", 1}}}}}});
    h.tick();
    REQUIRE(h.master->state().phase() == Phase::Training);
    return std::array<int32_t, 3>{a, b, c};
  };
  auto broken = [&](test::Harness& h, int32_t node) {
    h.post("/v1/exit", json{{"node", node}, {"trainer", {{"restart", 0}, {"phase", "exited"}, {"step", 5},
                                                         {"exit", {{"code", 1}, {"signal", 0},
                                                                   {"reason", "gloo: Connection closed by peer"}}}}}});
  };
  auto recoveries = [](test::Harness& h) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const json& d : h.events("recovery_decided")) out.emplace_back(d["diagnosis"], d["action"]);
    return out;
  };

  SUBCASE("the backend reports the dead node after failure_settle has passed") {
    test::Harness h(test::Harness::Spec{spec});
    const auto [a, b, c] = start(h);
    broken(h, a);
    broken(h, b);
    h.tick(kSecond);  // failure_settle (300 ms) is long over; a and b have reported since, c has not
    h.beat(a);
    CHECK(h.events("failure_observed").empty());
    h.provider.losses.push_back({"c", "Job supervisor actor died: the node it ran on is dead."});
    h.tick();
    const auto failures = h.events("failure_observed");
    REQUIRE(failures.size() == 1);
    CHECK(failures[0]["node"] == c);
    CHECK(failures[0]["kind"] == "node_lost");
    CHECK(recoveries(h) == std::vector<std::pair<std::string, std::string>>{{"hardware_error", "relaunch_node"}});
  }
  SUBCASE("no backend says so: the heartbeat timeout does") {
    test::Harness h(test::Harness::Spec{spec});
    const auto [a, b, c] = start(h);
    broken(h, a);
    broken(h, b);
    for (int i = 0; i < 4; ++i) {
      h.tick(kSecond);
      h.beat(a);
      h.beat(b);
    }
    CHECK(h.events("failure_observed").empty());
    h.tick(2 * kSecond);
    const auto failures = h.events("failure_observed");
    REQUIRE(failures.size() == 1);
    CHECK(failures[0]["node"] == c);
    CHECK(recoveries(h) == std::vector<std::pair<std::string, std::string>>{{"hardware_error", "relaunch_node"}});
  }
  SUBCASE("every rank still heard from: the exit is diagnosed once failure_settle has passed") {
    test::Harness h(test::Harness::Spec{spec});
    const auto [a, b, c] = start(h);
    broken(h, a);
    h.tick(100 * kMillisecond);
    h.beat(b);
    h.beat(c);
    CHECK(h.events("failure_observed").empty());  // within failure_settle
    h.tick(300 * kMillisecond);
    const auto failures = h.events("failure_observed");
    REQUIRE(failures.size() == 1);
    CHECK(failures[0]["node"] == a);
    CHECK(recoveries(h) == std::vector<std::pair<std::string, std::string>>{{"software_error", "restart_process"}});
  }
}

TEST_CASE("every refusal is counted by reason in /metrics: token, bad requests, and what the HTTP server refused itself") {
  // A real server on loopback with a short read timeout, and raw sockets for what no HTTP client sends.
  Harness h(nullptr, 2);
  boost::asio::io_context io;
  net::HttpServer server(io, "127.0.0.1", 0, [&](const net::HttpRequest& r) { return h.api->handle(r); }, 1 << 20,
                          nullptr, std::chrono::milliseconds(300));
  h.api->set_transport_refusals([&server] { return server.refusals(); });
  std::thread loop([&] { io.run(); });
  auto raw = [&](const std::string& bytes, int wait_ms) {
    boost::asio::io_context cio;
    boost::asio::ip::tcp::socket sock(cio);
    sock.connect({boost::asio::ip::make_address("127.0.0.1"), server.port()});
    boost::asio::write(sock, boost::asio::buffer(bytes));
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    boost::system::error_code ec;
    char buf[4096];
    const size_t n = sock.read_some(boost::asio::buffer(buf), ec);
    return std::string(buf, ec ? 0 : n);
  };
  CHECK(raw("POST /v1/register HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n{", 50).rfind("HTTP/1.1 413", 0) == 0);
  CHECK(raw("GET / HTTP/1.1\r\nX: " + std::string(17000, 'a') + "\r\n\r\n", 50).rfind("HTTP/1.1 413", 0) == 0);
  CHECK(raw("GARBAGE\r\n\r\n", 50).rfind("HTTP/1.1 400", 0) == 0);
  raw("POST /v1/register HTTP/1.1\r\nContent-Le", 700);  // begun, never finished: closed after 300 ms
  raw("", 700);                                            // an idle connection closing is no refusal
  const auto url = net::Url::parse("http://127.0.0.1:" + std::to_string(server.port()));
  CHECK(net::http_call(url, "POST", "/v1/register", "wrong", "{}", 2000)->status == 401);
  CHECK(net::http_call(url, "POST", "/v1/register", "tok", "{not json", 2000)->status == 400);
  CHECK(net::http_call(url, "POST", "/v1/register", "tok", R"({"name": 5})", 2000)->status == 400);
  const std::string m = net::http_call(url, "GET", "/metrics", "", "", 2000)->body;
  io.stop();
  loop.join();
  CAPTURE(m);
  CHECK(m.find("goodput_api_refused_total{reason=\"token\"} 1\n") != std::string::npos);
  CHECK(m.find("goodput_api_refused_total{reason=\"bad_request\"} 2\n") != std::string::npos);
  CHECK(m.find("goodput_api_refused_total{reason=\"body_too_large\"} 1\n") != std::string::npos);
  CHECK(m.find("goodput_api_refused_total{reason=\"headers_too_large\"} 1\n") != std::string::npos);
  CHECK(m.find("goodput_api_refused_total{reason=\"malformed_http\"} 1\n") != std::string::npos);
  CHECK(m.find("goodput_api_refused_total{reason=\"slow_request\"} 1\n") != std::string::npos);
}

TEST_CASE("the status endpoints' access: open on loopback, the token elsewhere (metrics open), or as set") {
  Harness h(nullptr, 2);
  auto get = [&](const std::string& path, const std::string& auth) {
    net::HttpRequest r;
    r.method = "GET";
    r.target = path;
    r.authorization = auth;
    return h.api->handle(r).status;
  };
  struct Case {
    live::ReadAccess access;
    const char* listen;
    const char* path;
    const char* auth;
    int status;
  };
  const Case cases[] = {
      {live::ReadAccess::Auto, "127.0.0.1", "/status", "", 200},
      {live::ReadAccess::Auto, "127.0.0.1", "/", "", 200},
      {live::ReadAccess::Auto, "127.0.0.1", "/metrics", "", 200},
      {live::ReadAccess::Auto, "0.0.0.0", "/status", "", 401},
      {live::ReadAccess::Auto, "0.0.0.0", "/", "Bearer nope", 401},
      {live::ReadAccess::Auto, "0.0.0.0", "/status", "Bearer tok", 200},
      {live::ReadAccess::Auto, "0.0.0.0", "/metrics", "", 200},  // a Prometheus scraper on the private network
      {live::ReadAccess::Auto, "0.0.0.0", "/healthz", "", 200},  // the readiness probe: says nothing of the job
      {live::ReadAccess::Token, "::1", "/metrics", "", 401},
      {live::ReadAccess::Token, "::1", "/metrics", "Bearer tok", 200},
      {live::ReadAccess::Token, "::1", "/status", "", 401},
      {live::ReadAccess::Open, "0.0.0.0", "/status", "", 200},
      {live::ReadAccess::Open, "0.0.0.0", "/metrics", "", 200},
  };
  for (const Case& c : cases) {
    CAPTURE(c.listen);
    CAPTURE(c.path);
    CAPTURE(c.auth);
    h.api->set_read_access(c.access, c.listen);
    CHECK(get(c.path, c.auth) == c.status);
  }
}

TEST_CASE("a zone of 100 of 200 nodes lost in one tick: logged and committed at once before any action, each slot relaunched once, the world formed again") {
  // Correctness at a scale the test command affords (goodput bench api --fail has the big one):
  // the provider reports half the world lost in one tick, as a zone outage would.
  constexpr int kNodes = 200, kLost = 100;
  json spec{{"job", "zone"}, {"nodes", kNodes}, {"command", {"true"}}, {"total_steps", 1000},
            {"heartbeat_timeout", "1h"}, {"hang_timeout", "1h"}};
  Harness h(Harness::Spec{spec});
  h.provider.calls.clear();  // the first launches
  std::vector<int32_t> node(kNodes);
  for (int s = 0; s < kNodes; ++s)
    node[s] = h.post("/v1/register", json{{"name", "pod-" + std::to_string(s)}, {"slot", s}})["node"].get<int32_t>();
  h.tick();
  auto train = [&](int32_t n, int32_t restart) {
    return h.post("/v1/heartbeat", json{{"node", n}, {"trainer", {{"restart", restart}, {"phase", "training"}, {"step", 5},
                                                                   {"progress_age_ms", 0},
                                                                   {"loaded", {{"step", 0}, {"tier", "none"}, {"ns", 1}}}}}});
  };
  for (int s = 0; s < kNodes; ++s) REQUIRE(train(node[s], 0)["action"] == "run");
  h.tick();
  REQUIRE(h.master->state().phase() == Phase::Training);

  // At each action, what the log on disk holds (a second connection, as a resumed master would read it).
  std::vector<int64_t> committed_decisions;
  h.provider.on_call = [&] {
    SqliteStore disk(h.db.string(), SqliteStore::Mode::OpenReadOnly);
    int64_t decided = 0;
    disk.for_each([&](const Event& e) { decided += std::holds_alternative<RecoveryDecided>(e.payload) ? 1 : 0; });
    committed_decisions.push_back(decided);
  };
  const uint64_t before = h.store->last_seq();
  for (int s = 0; s < kLost; ++s) h.provider.losses.push_back({"pod-" + std::to_string(2 * s), "node zone-a-" + std::to_string(s) + " NotReady"});
  h.tick();
  const auto failures = h.events("failure_observed");
  const auto decisions = h.events("recovery_decided");
  CHECK(failures.size() == kLost);  // no failure missed, none twice
  REQUIRE(decisions.size() == kLost);
  for (const json& d : decisions) CHECK(d["action"] == "relaunch_node");
  // Every action came after all of the tick's decisions were on disk: one commit, then the actions.
  REQUIRE(committed_decisions.size() == 2 * kLost);  // a terminate and a launch for each
  for (int64_t c : committed_decisions) CHECK(c == kLost);
  std::multiset<std::string> launched;
  for (const std::string& c : h.provider.calls)
    if (c.rfind("launch ", 0) == 0) launched.insert(c);
  CHECK(launched.size() == kLost);
  for (int s = 0; s < kLost; ++s) CHECK(launched.count("launch " + std::to_string(2 * s) + " 1000") == 1);  // each lost slot once
  CHECK(h.store->last_seq() - before >= 2 * kLost);

  // The replacements join (each for the slot it was launched for), and the world trains again.
  h.provider.on_call = nullptr;
  for (int s = 0; s < kLost; ++s)
    node[2 * s] = h.post("/v1/register", json{{"name", "pod-" + std::to_string(2 * s) + "-b"}, {"slot", 2 * s}})["node"].get<int32_t>();
  h.tick();
  const auto restarts = h.events("restart_job");
  REQUIRE(restarts.size() == 2);  // the first start and this one: not one per lost node
  CHECK(restarts.back()["world_size"] == kNodes);
  std::set<int32_t> holders;
  for (int s = 0; s < kNodes; ++s) {
    REQUIRE(h.master->world().at(s) == node[s]);  // every slot filled, by the node that joined for it
    holders.insert(h.master->world().at(s));
  }
  CHECK(holders.size() == kNodes);
  for (int s = 0; s < kNodes; ++s) REQUIRE(train(node[s], 1)["action"] == "run");
  h.tick();
  CHECK(h.master->state().phase() == Phase::Training);
  // The log is complete: a master resumed from it lays the world out the same way.
  h.new_master(spec);
  for (int s = 0; s < kNodes; ++s) CHECK(h.master->world().at(s) == node[s]);
  CHECK(h.master->state().restart_jobs() == 2);
}

TEST_CASE("a sweep over the ranks: resumes where it stopped, yet a rank that fell back is never missed") {
  std::vector<live::Node> nodes(6);
  live::Ranks w;
  for (auto& n : nodes) w.push_back(&n);
  int asked = 0;
  auto started = [&](const live::Trainer& t) {
    ++asked;
    return t.phase == "training";
  };
  live::Sweep sweep;
  const live::Sweep::Context ctx{1, 0, 0, 0};
  // One report at a time: each question looks at the rank it stopped at, not the whole world again.
  for (size_t i = 0; i + 1 < nodes.size(); ++i) {
    nodes[i].trainer.phase = "training";
    asked = 0;
    CHECK_FALSE(sweep.all(w, ctx, started));
    CHECK(asked == 2);  // the one that just moved, and the next, still behind
  }
  // The last one: a yes, confirmed over the whole world.
  nodes.back().trainer.phase = "training";
  asked = 0;
  CHECK(sweep.all(w, ctx, started));
  CHECK(asked == 1 + 6);
  // A rank passed earlier falls back (its process exited): the confirmation finds it.
  nodes[1].trainer.phase = "exited";
  CHECK_FALSE(sweep.all(w, ctx, started));
  nodes[1].trainer.phase = "training";
  CHECK(sweep.all(w, ctx, started));
  // Another question (a new restart, a changed world) starts from the first rank.
  nodes[0].trainer.phase = "starting";
  asked = 0;
  CHECK_FALSE(sweep.all(w, {2, 0, 0, 0}, started));
  CHECK(asked == 1);
}
