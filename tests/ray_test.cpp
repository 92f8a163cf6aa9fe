// The Ray client's reading of Ray's wire format, against the fixtures in shared/data/ray/ (written
// from Ray's source, not by us), and its retry and idempotency rules against a real HTTP server
// that answers the way the dashboard does. (The backend end to end, with real agents and PyTorch
// trainers on the Ray dashboard emulator, is tests/python/test_ray.py.)
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "backends/live/job_spec.h"
#include "backends/ray/ray_client.h"
#include "engine/json_reader.h"

using namespace goodput;
using nlohmann::json;

namespace {

std::string fixture_text(const std::string& name) {
  std::ifstream in(std::string(GOODPUT_SHARED_DATA) + "/ray/" + name);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
json fixture(const std::string& name) { return json::parse(fixture_text(name)); }

// A dashboard on a real socket whose answers the test scripts: one function per request.
struct FakeDashboard {
  using Script = std::function<net::HttpResponse(const net::HttpRequest&)>;
  explicit FakeDashboard(Script s)
      : server(io, "127.0.0.1", 0, [this, s](const net::HttpRequest& r) {
          seen.push_back(r.method + " " + r.target);
          return s(r);
        }) {
    thread = std::thread([this] { io.run(); });
  }
  ~FakeDashboard() {
    io.stop();
    thread.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server.port()); }
  boost::asio::io_context io;
  net::HttpServer server;
  std::vector<std::string> seen;
  std::thread thread;
};

ray::RetryOptions quick() {
  ray::RetryOptions r;
  r.first_backoff_ms = 1;
  r.attempts = 4;
  r.timeout_ms = 2000;
  return r;
}

}  // namespace

TEST_CASE("Ray's job details, job list and node list parse as the fixtures show them") {
  const ray::RayJob running = ray::parse_job(fixture("jobs-get-response-running.json"), "running");
  CHECK(running.status == "RUNNING");
  CHECK(running.submission_id == "raysubmit_4LamXRuQpYdSMg7J");
  CHECK(running.driver_node_id.size() == 56);
  CHECK_FALSE(running.driver_exit_code);
  CHECK_FALSE(running.terminal());
  CHECK(running.metadata.at("owner") == "elastic-master");

  const ray::RayJob failed = ray::parse_job(fixture("jobs-get-response-failed.json"), "failed");
  CHECK(failed.terminal());
  CHECK(failed.error_type == "JOB_ENTRYPOINT_COMMAND_ERROR");
  CHECK(failed.driver_exit_code == 1);
  CHECK(failed.message.find("RuntimeError: boom") != std::string::npos);

  const auto list = ray::parse_job_list(fixture("jobs-list-response.json"), "list");
  REQUIRE(list.size() == 2);
  CHECK(list[0].status == "SUCCEEDED");
  CHECK(list[1].submission_id.empty());  // a DRIVER job: null submission_id

  const auto nodes = ray::parse_node_list(fixture("state-nodes-response.json"), "nodes");
  REQUIRE(nodes.size() == 2);
  CHECK(nodes[0].is_head_node);
  CHECK(nodes[0].state == "ALIVE");
  CHECK(nodes[1].state == "DEAD");
  CHECK(nodes[1].state_message.find("missing too many heartbeats") != std::string::npos);
}

TEST_CASE("a submit request has exactly the fields of Ray's JobSubmitRequest fixture") {
  ray::SubmitRequest r;
  r.entrypoint = "goodput agent";
  r.submission_id = "goodput-j-1-ray-0";
  r.env_vars["GOODPUT_TOKEN"] = "t";
  r.num_cpus = 1;
  r.memory_bytes = 512 << 20;
  r.resources["goodput_node"] = 1;
  const json mine = r.to_json();
  const json theirs = fixture("jobs-submit-request.json");
  std::vector<std::string> a, b;
  for (const auto& [k, v] : mine.items()) a.push_back(k);
  for (const auto& [k, v] : theirs.items()) b.push_back(k);
  CHECK(a == b);
  CHECK(mine["runtime_env"]["env_vars"]["GOODPUT_TOKEN"] == "t");
  CHECK(mine["entrypoint_memory"] == 512 << 20);
}

TEST_CASE("bad dashboard answers are errors that say what is wrong") {
  json j = fixture("jobs-get-response-running.json");
  j["status"] = "WEIRD";
  CHECK_THROWS_WITH_AS(ray::parse_job(j, "GET /api/jobs/x"),
                       "GET /api/jobs/x: field 'status' must be PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED",
                       ray::RayError);
  json n = fixture("state-nodes-response.json");
  n["data"]["result"]["result"] = "nope";
  CHECK_THROWS_WITH_AS(ray::parse_node_list(n, "nodes"),
                       "nodes: field 'data.result.result' must be the list of nodes", ray::RayError);
  CHECK_THROWS_AS(ray::parse_node_list(json::parse(R"({"result":false,"msg":"timed out"})"), "nodes"), ray::RayError);
}

TEST_CASE("the client retries 5xx and lost answers, reads plain-text errors, and submits once") {
  int failures_left = 2;
  bool created = false;
  const std::string not_found = fixture_text("jobs-404.txt");
  FakeDashboard d([&](const net::HttpRequest& r) -> net::HttpResponse {
    if (r.target == "/api/jobs/" && r.method == "GET") {
      if (failures_left-- > 0) return {503, "text/plain", "Service Unavailable"};
      return {200, "application/json", "[" + fixture_text("jobs-get-response-running.json") + "]"};
    }
    if (r.target == "/api/jobs/" && r.method == "POST") {
      // As if the first try's answer was lost: the job exists, so Ray refuses the same id.
      if (created) return {400, "text/plain", "Job with submission_id goodput-x already exists. Please use a different submission_id."};
      created = true;
      return {200, "application/json", fixture_text("jobs-submit-response.json")};
    }
    if (r.target == "/api/jobs/goodput-x" && r.method == "DELETE") return {200, "application/json", fixture_text("jobs-delete-response.json")};
    if (r.target == "/api/jobs/goodput-x/logs") return {200, "application/json", fixture_text("jobs-logs-response.json")};
    if (r.target == "/api/jobs/goodput-x/stop") return {200, "application/json", fixture_text("jobs-stop-response.json")};
    if (r.target == "/api/version") return {200, "application/json", fixture_text("version-response.json")};
    if (r.target == "/api/jobs/goodput-x") return {200, "application/json", fixture_text("jobs-get-response-running.json")};
    if (r.target.rfind("/api/jobs/", 0) == 0) return {404, "text/plain", not_found};
    if (r.target.rfind("/api/v0/nodes?", 0) == 0) return {200, "application/json", fixture_text("state-nodes-response.json")};
    return {500, "text/plain", "unexpected"};
  });
  ray::RayClient c(d.url(), {{"Authorization", "Bearer secret"}}, quick());
  CHECK(c.jobs().size() == 1);
  CHECK(c.retries() == 2);
  CHECK_FALSE(c.job("raysubmit_doesnotexist"));
  ray::SubmitRequest r;
  r.entrypoint = "true";
  r.submission_id = "goodput-x";
  c.submit(r);
  c.submit(r);  // the retry of a submit whose answer was lost: not an error, not a second job
  CHECK(std::count(d.seen.begin(), d.seen.end(), "POST /api/jobs/") == 2);
  CHECK(c.ray_version() == "2.40.0");
  CHECK(c.job("goodput-x")->status == "RUNNING");
  CHECK(c.logs("goodput-x") == "epoch 0 loss 2.31\nepoch 1 loss 1.02\n");
  CHECK(c.stop("goodput-x"));
  CHECK(c.remove("goodput-x"));
  CHECK(c.nodes(7).size() == 2);
  CHECK(d.seen.back() == "GET /api/v0/nodes?limit=10000&timeout=7");
  // A refusal is not retried, and says what the dashboard said.
  CHECK_THROWS_WITH_AS(c.stop("raysubmit_doesnotexist"),
                       "POST /api/jobs/raysubmit_doesnotexist/stop: the Ray dashboard answered 404: Job "
                       "raysubmit_doesnotexist does not exist",
                       ray::RayError);
  CHECK_THROWS_AS(c.job("../etc"), std::invalid_argument);
}

TEST_CASE("an unreachable dashboard is a retryable error after the last try") {
  ray::RayClient c("http://127.0.0.1:1", {}, quick());
  try {
    c.ray_version();
    FAIL("no error");
  } catch (const ray::RayError& e) {
    CHECK(e.retryable);
    CHECK(std::string(e.what()).find("no answer from the Ray dashboard at http://127.0.0.1:1") != std::string::npos);
  }
  CHECK(c.calls() == 4);
}

TEST_CASE("a job spec's Ray backend is checked field by field") {
  auto spec = [](const std::string& backend) {
    return json::parse(R"({"job":"j","command":["x"],"total_steps":10,"backend":)" + backend + "}");
  };
  auto error_of = [&](const std::string& backend) {
    try {
      live::job_spec_from_json(spec(backend), "", ".");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error_of(R"({"type":"ray"})") == "field 'backend.address' is required: the Ray dashboard's URL, e.g. http://head:8265");
  CHECK(error_of(R"("kubernetes")").find("field 'backend' must be \"local\", {") == 0);  // an object with an image
  CHECK(error_of(R"({"type":"ray","address":"http://h:8265","num_gpu":1})").find("num_gpu") != std::string::npos);
  CHECK(error_of(R"({"type":"ray","address":"http://h:8265","resources":{"x":-1}})").find("resources") != std::string::npos);
  const live::JobSpec s = live::job_spec_from_json(
      spec(R"({"type":"ray","address":"http://h:8265","num_gpus":1,"memory_mb":2048,"resources":{"trainer":1},
              "headers":{"Authorization":"Bearer x"},"pending_timeout":"30s"})"),
      "", ".");
  CHECK(s.backend == "ray");
  CHECK(s.ray.num_gpus == 1);
  CHECK(s.ray.memory_mb == 2048);
  CHECK(s.ray.resources.at("trainer") == 1);
  CHECK(s.ray.headers.at(0).second == "Bearer x");
  CHECK(s.ray.pending_timeout == 30 * kSecond);
  CHECK(live::job_spec_from_json(spec(R"("local")"), "", ".").backend == "local");
}
