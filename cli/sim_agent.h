// Simulated node agents for the master's benchmarks: each keeps one HTTP connection to the master,
// registers, then heartbeats every period as a training node would (the restart the master last
// ordered, phase training, its checkpoint loaded), and records each heartbeat's latency. Thousands
// run on one io_context. An agent can be silenced (its machine gone: no goodbye, the connection
// dies) and can register for a slot (as a pod labelled with its rank does).
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

namespace goodput::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct LoadResult {
  std::vector<double> latency_ms;
  std::vector<double> sent_s;  // when each heartbeat was sent, from the start of the load
  int64_t errors = 0;
  int64_t requests = 0;
};

// One simulated agent: register once, then heartbeat a training trainer's status every period.
class SimAgent : public std::enable_shared_from_this<SimAgent> {
 public:
  SimAgent(asio::io_context& io, tcp::endpoint ep, std::string token, std::string name, int index,
           Clock::duration period, Clock::time_point started, Clock::time_point until, LoadResult& out,
           Clock::time_point silent_at = Clock::time_point::max())
      : stream_(io), timer_(io), ep_(ep), token_(std::move(token)), name_(std::move(name)), index_(index), period_(period),
        started_(started), until_(until), silent_at_(silent_at), out_(out) {}

  // Register for this slot (the one its pod was made for); before start().
  void for_slot(int slot) { slot_ = slot; }
  // Its machine is gone: from its next turn on it sends nothing and its connection dies. Call on
  // the io_context's thread (asio::post).
  void silence() { silent_ = true; }

  void start(Clock::duration delay) {
    timer_.expires_after(delay);
    timer_.async_wait([self = shared_from_this()](beast::error_code) {
      self->stream_.async_connect(self->ep_, [self](beast::error_code ec) {
        if (ec) return self->fail();
        json body{{"name", self->name_}};
        if (self->slot_ >= 0) body["slot"] = self->slot_;
        self->send("/v1/register", body);
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
    if (registered) {
      out_.latency_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - sent_).count());
      out_.sent_s.push_back(std::chrono::duration<double>(sent_ - started_).count());
    }
    if (Clock::now() >= until_) return;
    if (silent_ || Clock::now() >= silent_at_) {  // its machine is gone: no goodbye, the connection just dies
      beast::error_code ec;
      stream_.socket().close(ec);
      return;
    }
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

  // A request that got no answer: counted, and the agent connects and registers again a second
  // later, as a real agent does (the master answers a known name with its node).
  void fail() {
    ++out_.errors;
    if (silent_ || Clock::now() >= until_) return;
    beast::error_code ec;
    stream_.socket().close(ec);
    node_ = -1;
    start(std::chrono::seconds(1));
  }

  beast::tcp_stream stream_;
  asio::steady_timer timer_;
  tcp::endpoint ep_;
  std::string token_;
  std::string name_;
  int index_;
  Clock::duration period_;
  Clock::time_point started_;
  Clock::time_point until_;
  Clock::time_point silent_at_;
  LoadResult& out_;
  beast::flat_buffer buf_;
  http::request<http::string_body> req_;
  http::response<http::string_body> res_;
  Clock::time_point sent_;
  int node_ = -1;
  int restart_ = -1;
  int64_t step_ = 0;
  int slot_ = -1;
  bool silent_ = false;
};

inline double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

inline void print(const char* what, const std::vector<double>& latency_ms, int64_t errors) {
  std::printf("%-30s %8lld heartbeats  p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms  errors %lld\n", what,
              static_cast<long long>(latency_ms.size()), pct(latency_ms, 0.5), pct(latency_ms, 0.99), pct(latency_ms, 1.0),
              static_cast<long long>(errors));
}

// utime+stime in seconds, and VmRSS in MiB, of a process.
inline std::pair<double, double> cpu_rss(pid_t pid) {
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



}  // namespace goodput::bench
