// `goodput bench api`: thousands of simulated agents heartbeating a real `goodput master` over
// loopback, from one process (one connection each, kept alive). Prints heartbeat latency (p50,
// p99, max), errors, the master's CPU and RSS, and whether any heartbeat was taken for a failure.
// Baseline in the same run: the same load against a no-op server on the same HTTP stack.
//
// With --fail N, a mass failure: N agents fall silent at once (their machines gone with a zone),
// the master notices them by the heartbeat timeout and relaunches each slot; N replacement agents
// register as soon as it has noticed them all (machines that come at once: what a cluster makes
// them wait is the Kubernetes and Ray backends' part), and the world restarts. Printed: the time to
// notice, to re-form and train again, the master's CPU meanwhile, the events it logged, and the
// latency of the surviving agents' heartbeats through it all.
#include "cli/bench_api.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

#include "cli/sim_agent.h"
#include "net/http.h"

namespace goodput {
namespace {

using namespace goodput::bench;
namespace fs = std::filesystem;


// How a mass failure went, as seen from /status (polled every 100 ms).
struct FailureTimes {
  Clock::time_point silent, noticed, reformed;  // reformed: training again with every slot held
  bool was_noticed = false, was_reformed = false;
  int64_t events_before = 0, events_after = 0;
  double cpu_before = 0, cpu_after = 0;
};

// Agents at 1 heartbeat/s for `seconds`. fail > 0: the first `fail` of them fall silent at
// `fail_at`, and as many replacements register once the master's /status counts them all failed.
LoadResult drive(uint16_t port, const std::string& token, int agents, double seconds, int fail = 0,
                 double fail_at = 0, pid_t master = 0, FailureTimes* times = nullptr) {
  asio::io_context io;
  LoadResult out;
  const auto started = Clock::now();
  const auto until = started + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  const auto silent_at = started + std::chrono::milliseconds(static_cast<int64_t>(fail_at * 1000));
  const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), port);
  for (int i = 0; i < agents; ++i)
    std::make_shared<SimAgent>(io, ep, token, "sim-" + std::to_string(i), i, std::chrono::seconds(1), started, until, out,
                               i < fail ? silent_at : Clock::time_point::max())
        ->start(std::chrono::microseconds(static_cast<int64_t>(1e6 * i / agents)));
  std::thread watch;
  std::atomic<bool> done{false};
  if (fail > 0 && times) {
    watch = std::thread([&] {
      const net::Url url = net::Url::parse("http://127.0.0.1:" + std::to_string(port));
      auto status = [&] {
        auto r = net::http_call(url, "GET", "/status?nodes=0", "", "", 5000);
        return r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
      };
      std::this_thread::sleep_until(silent_at);
      times->silent = Clock::now();
      times->cpu_before = master ? cpu_rss(master).first : 0;
      const json s0 = status();
      const int failures0 = s0.is_object() ? s0.value("failures", 0) : 0;
      const int restarts0 = s0.is_object() ? s0.value("restart", 0) : 0;
      times->events_before = s0.is_object() ? s0.value("events", int64_t{0}) : 0;
      while (!done && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const json s = status();
        if (!s.is_object()) continue;
        if (!times->was_noticed && s.value("failures", 0) - failures0 >= fail) {
          times->was_noticed = true;
          times->noticed = Clock::now();
          asio::post(io, [&, now = Clock::now()] {  // the replacements' machines are there at once
            for (int i = 0; i < fail; ++i)
              std::make_shared<SimAgent>(io, ep, token, "sim-" + std::to_string(i) + "-b", agents + i, std::chrono::seconds(1),
                                         started, until, out)
                  ->start(std::chrono::microseconds(static_cast<int64_t>(1e5 * i / fail)));
            (void)now;
          });
        }
        if (times->was_noticed && s.value("restart", 0) > restarts0 && s.value("phase", "") == "training" &&
            s.value("nodes_training", 0) == agents) {
          times->was_reformed = true;
          times->reformed = Clock::now();
          times->events_after = s.value("events", int64_t{0});
          times->cpu_after = master ? cpu_rss(master).first : 0;
          return;
        }
      }
    });
  }
  io.run_for(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000) + 5000));
  done = true;
  if (watch.joinable()) watch.join();
  return out;
}

// The heartbeats sent from `from` seconds on: the steady state, once the world has formed.
std::vector<double> since(const LoadResult& r, double from) {
  std::vector<double> out;
  for (size_t i = 0; i < r.latency_ms.size(); ++i)
    if (r.sent_s[i] >= from) out.push_back(r.latency_ms[i]);
  return out;
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
    print("no-op server", base.latency_ms, base.errors);
  }

  const fs::path dir = fs::temp_directory_path() / ("goodput-bench-api-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream spec(dir / "job.json");
    spec << json{{"job", "bench"},           {"nodes", o.agents},           {"command", {"true"}},
                 {"total_steps", 1'000'000}, {"heartbeat_interval", "1s"}, {"heartbeat_timeout", o.fail > 0 ? "3s" : "10s"},
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
  FailureTimes ft;
  const double fail_at = std::min(15.0, o.seconds / 3);
  const LoadResult r = drive(port, token, o.agents, o.seconds, std::min(o.fail, o.agents), fail_at, master, &ft);
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto [cpu1, rss1] = cpu_rss(master);
  print("goodput master", r.latency_ms, r.errors);
  // The first seconds are the world forming: every agent registers, the join of each is logged and
  // the first restart starts them all. After that, the load is heartbeats of a training world.
  const double settle = std::min(10.0, o.seconds / 3);
  char label[64];
  std::snprintf(label, sizeof label, "  of which after %.0f s", settle);
  print(label, since(r, settle), 0);
  bool failed_ok = true;
  if (o.fail > 0) {
    auto secs = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
    const double silent_s = fail_at;
    if (!ft.was_noticed || !ft.was_reformed) {
      std::printf("mass failure of %d agents: %s within the run (make --seconds longer)\n", o.fail,
                  ft.was_noticed ? "noticed but the world did not re-form" : "not noticed");
      failed_ok = false;
    } else {
      std::vector<double> during;
      const double reformed_s = silent_s + secs(ft.silent, ft.reformed);
      for (size_t i = 0; i < r.latency_ms.size(); ++i)
        if (r.sent_s[i] >= silent_s && r.sent_s[i] <= reformed_s) during.push_back(r.latency_ms[i]);
      std::printf("mass failure of %d agents: all noticed %.2f s after they fell silent (heartbeat timeout 3 s), the world "
                  "training again %.2f s after that (%d replacements registered, restart, every rank training)\n",
                  o.fail, secs(ft.silent, ft.noticed), secs(ft.noticed, ft.reformed), o.fail);
      std::printf("  master: %.2f CPU s from the silence to training again, %lld events logged\n", ft.cpu_after - ft.cpu_before,
                  static_cast<long long>(ft.events_after - ft.events_before));
      print("  heartbeats meanwhile", during, 0);
    }
  }
  json status;
  if (auto s = net::http_call(net::Url::parse(url), "GET", "/status?nodes=0", "", "", 5000)) status = json::parse(s->body);
  std::printf("master: %.2f CPU s over %.1f s (%.0f%% of a core), RSS %.1f MiB (%.1f at start)\n", cpu1 - cpu0, wall,
              100 * (cpu1 - cpu0) / wall, rss1, rss0);
  std::printf("job: phase %s, %d failures observed (must be %d), %lld events logged\n",
              status.value("phase", std::string("?")).c_str(), status.value("failures", -1),
              o.fail > 0 ? std::min(o.fail, o.agents) : 0, static_cast<long long>(status.value("events", 0)));
  ::kill(master, SIGKILL);
  ::waitpid(master, nullptr, 0);
  fs::remove_all(dir);
  const int expected_failures = o.fail > 0 ? std::min(o.fail, o.agents) : 0;
  return status.value("failures", -1) == expected_failures && failed_ok && r.errors <= expected_failures ? 0 : 1;
}

}  // namespace goodput
