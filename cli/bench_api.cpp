// `goodput bench api`: thousands of simulated agents heartbeating a real `goodput master` over
// loopback, from one process (one connection each, kept alive). Prints heartbeat latency (p50,
// p99, max), errors, the master's CPU and RSS, and whether any heartbeat was taken for a failure.
// Baseline in the same run: the same load against a no-op server on the same HTTP stack.
#include "cli/bench_api.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "net/http.h"

namespace goodput {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace fs = std::filesystem;
using tcp = asio::ip::tcp;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct LoadResult {
  std::vector<double> latency_ms;
  int64_t errors = 0;
  int64_t requests = 0;
};

// One simulated agent: register once, then heartbeat a training trainer's status every period.
class SimAgent : public std::enable_shared_from_this<SimAgent> {
 public:
  SimAgent(asio::io_context& io, tcp::endpoint ep, std::string token, int index, Clock::duration period,
           Clock::time_point until, LoadResult& out)
      : stream_(io), timer_(io), ep_(ep), token_(std::move(token)), index_(index), period_(period), until_(until),
        out_(out) {}

  void start(Clock::duration delay) {
    timer_.expires_after(delay);
    timer_.async_wait([self = shared_from_this()](beast::error_code) {
      self->stream_.async_connect(self->ep_, [self](beast::error_code ec) {
        if (ec) return self->fail();
        self->send("/v1/register", json{{"name", "sim-" + std::to_string(self->index_)}});
      });
    });
  }

 private:
  void send(const std::string& target, const json& body) {
    req_ = {http::verb::post, target, 11};
    req_.set(http::field::host, "bench");
    req_.set(http::field::authorization, "Bearer " + token_);
    req_.keep_alive(true);
    req_.body() = body.dump();
    req_.prepare_payload();
    res_ = {};
    sent_ = Clock::now();
    http::async_write(stream_, req_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->fail();
      http::async_read(self->stream_, self->buf_, self->res_, [self](beast::error_code ec, size_t) {
        if (ec) return self->fail();
        self->on_response();
      });
    });
  }

  void on_response() {
    const bool registered = node_ >= 0;
    ++out_.requests;
    if (res_.result_int() != 200) ++out_.errors;
    try {
      const json a = json::parse(res_.body());
      if (!registered) node_ = a.value("node", -1);
      if (a.value("action", "") == "run") restart_ = a.value("restart", 0);
    } catch (const std::exception&) {
      ++out_.errors;
    }
    if (registered)
      out_.latency_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - sent_).count());
    if (Clock::now() >= until_) return;
    timer_.expires_after(registered ? period_ : std::chrono::milliseconds(index_ % 1000));
    timer_.async_wait([self = shared_from_this()](beast::error_code) { self->beat(); });
  }

  void beat() {
    ++step_;
    json trainer{{"restart", restart_},
                 {"phase", restart_ < 0 ? "none" : "training"},
                 {"step", step_},
                 {"progress_age_ms", 5},
                 {"saves", 0},
                 {"save_blocking_ns", 0},
                 {"saved_step", -1},
                 {"storage_steps", json::array()}};
    if (restart_ >= 0) trainer["loaded"] = {{"step", 0}, {"tier", "none"}, {"ns", 0}};
    send("/v1/heartbeat", json{{"node", node_}, {"trainer", trainer}});
  }

  void fail() { ++out_.errors; }

  beast::tcp_stream stream_;
  asio::steady_timer timer_;
  tcp::endpoint ep_;
  std::string token_;
  int index_;
  Clock::duration period_;
  Clock::time_point until_;
  LoadResult& out_;
  beast::flat_buffer buf_;
  http::request<http::string_body> req_;
  http::response<http::string_body> res_;
  Clock::time_point sent_;
  int node_ = -1;
  int restart_ = -1;
  int64_t step_ = 0;
};

LoadResult drive(uint16_t port, const std::string& token, int agents, double seconds) {
  asio::io_context io;
  LoadResult out;
  const auto until = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), port);
  for (int i = 0; i < agents; ++i)
    std::make_shared<SimAgent>(io, ep, token, i, std::chrono::seconds(1), until, out)
        ->start(std::chrono::microseconds(static_cast<int64_t>(1e6 * i / agents)));
  io.run_for(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000) + 5000));
  return out;
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

void print(const char* what, const LoadResult& r) {
  std::printf("%-22s %8lld heartbeats  p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms  errors %lld\n", what,
              static_cast<long long>(r.latency_ms.size()), pct(r.latency_ms, 0.5), pct(r.latency_ms, 0.99),
              pct(r.latency_ms, 1.0), static_cast<long long>(r.errors));
}

// utime+stime in seconds, and VmRSS in MiB, of a process.
std::pair<double, double> cpu_rss(pid_t pid) {
  std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(st)), std::istreambuf_iterator<char>());
  std::istringstream rest(s.substr(s.rfind(')') + 2));
  std::string f;
  double cpu = 0;
  for (int i = 3; i <= 15 && rest >> f; ++i)
    if (i == 14 || i == 15) cpu += std::stod(f) / static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  double rss = 0;
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stod(line.substr(6)) / 1024;
  return {cpu, rss};
}

}  // namespace

int spawn_master(const std::string& dir, const std::string& token, bool resume) {
  const std::string self = fs::canonical("/proc/self/exe").string();
  const std::string spec = dir + "/job.json", run = dir + "/run";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("GOODPUT_TOKEN", token.c_str(), 1);
    ::execl(self.c_str(), self.c_str(), "master", spec.c_str(), "--run-dir", run.c_str(), "--quiet",
            resume ? "--resume" : nullptr, nullptr);
    ::_exit(127);
  }
  return pid;
}

std::string wait_for_master_url(const std::string& dir) {
  std::string url;
  for (int i = 0; i < 200 && url.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream in(dir + "/run/master.url");
    std::getline(in, url);
  }
  return url;
}

int run_api_bench(const ApiBenchOptions& o) {
  rlimit nofile{};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;  // one socket per agent, here and in the master
  ::setrlimit(RLIMIT_NOFILE, &nofile);
  if (static_cast<rlim_t>(o.agents) + 64 > nofile.rlim_cur)
    std::fprintf(stderr, "warning: the file limit (%llu) is below the agent count\n",
                 static_cast<unsigned long long>(nofile.rlim_cur));
  const std::string token = "bench-token";

  // Baseline: the same HTTP stack answering "{}" without any master behind it.
  {
    asio::io_context io;
    net::HttpServer echo(io, "127.0.0.1", 0, [](const net::HttpRequest&) {
      return net::HttpResponse{200, "application/json", R"({"node":0,"action":"stop"})"};
    });
    std::thread t([&] { io.run(); });
    const LoadResult base = drive(echo.port(), token, o.agents, std::min(o.seconds, 10.0));
    io.stop();
    t.join();
    print("no-op server", base);
  }

  const fs::path dir = fs::temp_directory_path() / ("goodput-bench-api-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream spec(dir / "job.json");
    spec << json{{"job", "bench"},           {"nodes", o.agents},           {"command", {"true"}},
                 {"total_steps", 1'000'000}, {"heartbeat_interval", "1s"}, {"heartbeat_timeout", "10s"},
                 {"hang_timeout", "60s"}}
                .dump();
  }
  const pid_t master = spawn_master(dir.string(), token, false);
  const std::string url = wait_for_master_url(dir.string());
  if (url.empty()) {
    std::fprintf(stderr, "goodput: the master did not start\n");
    ::kill(master, SIGKILL);
    return 1;
  }
  const uint16_t port = static_cast<uint16_t>(std::stoi(net::Url::parse(url).port));
  const auto [cpu0, rss0] = cpu_rss(master);
  const auto t0 = Clock::now();
  const LoadResult r = drive(port, token, o.agents, o.seconds);
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto [cpu1, rss1] = cpu_rss(master);
  print("goodput master", r);
  json status;
  if (auto s = net::http_call(net::Url::parse(url), "GET", "/status", "", "", 5000)) status = json::parse(s->body);
  std::printf("master: %.2f CPU s over %.1f s (%.0f%% of a core), RSS %.1f MiB (%.1f at start)\n", cpu1 - cpu0, wall,
              100 * (cpu1 - cpu0) / wall, rss1, rss0);
  std::printf("job: phase %s, %d failures observed (must be 0), %lld events logged\n",
              status.value("phase", std::string("?")).c_str(), status.value("failures", -1),
              static_cast<long long>(status.value("events", 0)));
  ::kill(master, SIGKILL);
  ::waitpid(master, nullptr, 0);
  fs::remove_all(dir);
  return status.value("failures", -1) == 0 && r.errors == 0 ? 0 : 1;
}

}  // namespace goodput
