// `goodput bench crash`: the event log's crash consistency. Simulated agents (threads, blocking
// HTTP) run a job with data shards against a real `goodput master` process, which is killed with
// SIGKILL at random moments and restarted with --resume each time. Every answer an agent got is an
// acknowledgement (a node id, a shard handed out, a shard completion accepted); at the end each one
// must be in the log, the log must fold, and the job must have completed.
#include "cli/bench_api.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "net/http.h"
#include "engine/event_store.h"
#include "engine/job_state.h"

namespace goodput {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Acks {
  std::mutex mu;
  std::map<std::string, int32_t> nodes;               // name -> node id the master answered
  std::set<std::pair<int32_t, int64_t>> assigned;     // (node, shard) handed out
  std::set<std::pair<int32_t, int64_t>> completed;    // (node, shard) accepted as done
};

class SimTrainerAgent {
 public:
  SimTrainerAgent(std::string url, std::string token, int index, int64_t total_steps, Acks& acks)
      : url_(net::Url::parse(url)), token_(std::move(token)), name_("crash-" + std::to_string(index)),
        total_(total_steps), acks_(acks) {}

  void run(const std::atomic<bool>& stop) {
    while (!stop && !finished_) {
      if (node_ < 0) register_node();
      else beat();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  std::optional<std::pair<int, json>> call(const std::string& target, const json& body) {
    auto r = net::http_call(url_, "POST", target, token_, body.dump(), 1000);
    if (!r) return std::nullopt;
    try {
      return std::make_pair(r->status, json::parse(r->body));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  void register_node() {
    auto r = call("/v1/register", json{{"name", name_}});
    if (!r || r->first != 200) return;
    node_ = r->second.value("node", -1);
    std::lock_guard lock(acks_.mu);
    acks_.nodes[name_] = node_;
  }

  void beat() {
    json t{{"restart", restart_}, {"phase", restart_ < 0 ? "none" : "training"}, {"step", step_},
           {"progress_age_ms", 1}, {"saves", saves_}, {"save_blocking_ns", saves_ * 1000},
           {"saved_step", saved_step_}, {"storage_steps", json::array()}};
    if (restart_ >= 0) t["loaded"] = {{"step", 0}, {"tier", "none"}, {"ns", 0}};
    if (done_) t["exit"] = {{"code", 0}, {"signal", 0}, {"reason", ""}, {"done", true}, {"age_ms", 1}};
    auto r = call(done_ ? "/v1/exit" : "/v1/heartbeat", json{{"node", node_}, {"trainer", t}});
    if (!r) return;
    if (r->first == 404) {
      node_ = -1;
      return;
    }
    const json& a = r->second;
    if (a.value("action", "") == "exit") finished_ = true;
    if (a.value("action", "") != "run") return;
    if (a.value("restart", 0) != restart_) {  // a new world: start over from step 0 (no checkpoints here)
      restart_ = a.value("restart", 0);
      step_ = saves_ = request_ = 0;
      saved_step_ = -1;
      held_.clear();
    }
    if (done_) return;
    // One shard per step; every 5 steps a "checkpoint" completes the shards held.
    auto s = call("/v1/shards/next", json{{"node", node_}, {"restart", restart_}, {"request", request_}});
    if (!s || s->first != 200) return;  // retried with the same request number
    ++request_;
    if (s->second.contains("shard") && s->second["shard"].is_number_integer()) {
      const int64_t shard = s->second["shard"].get<int64_t>();
      held_.push_back(shard);
      std::lock_guard lock(acks_.mu);
      acks_.assigned.insert({node_, shard});
    }
    ++step_;
    if (step_ % 5 == 0 || step_ >= total_) {
      ++saves_;
      saved_step_ = step_;
      if (!held_.empty()) {
        auto c = call("/v1/shards/complete",
                      json{{"node", node_}, {"restart", restart_}, {"step", step_}, {"shards", held_}});
        if (c && c->first == 200) {
          std::lock_guard lock(acks_.mu);
          for (int64_t x : held_) acks_.completed.insert({node_, x});
          held_.clear();
        }
      }
    }
    if (step_ >= total_) done_ = true;
  }

  net::Url url_;
  std::string token_, name_;
  int64_t total_;
  Acks& acks_;
  int32_t node_ = -1;
  int32_t restart_ = -1;
  int64_t step_ = 0, saves_ = 0, saved_step_ = -1, request_ = 0;
  std::vector<int64_t> held_;
  bool done_ = false, finished_ = false;
};

}  // namespace

int run_crash_bench(const CrashBenchOptions& o) {
  const fs::path dir = fs::temp_directory_path() / ("goodput-bench-crash-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const int64_t steps = o.steps;
  {
    std::ofstream spec(dir / "job.json");
    spec << json{{"job", "crash"},
                 {"nodes", o.agents},
                 {"command", {"true"}},
                 {"total_steps", steps},
                 {"data_shards", steps * o.agents},
                 {"heartbeat_interval", "100ms"},
                 {"heartbeat_timeout", "30s"},
                 {"hang_timeout", "60s"}}
                .dump();
  }
  pid_t master = spawn_master(dir.string(), "crash-token", false);
  const std::string url = wait_for_master_url(dir.string());
  if (url.empty()) {
    std::fprintf(stderr, "goodput: the master did not start\n");
    return 1;
  }
  Acks acks;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<SimTrainerAgent>> agents;
  for (int i = 0; i < o.agents; ++i) {
    agents.push_back(std::make_unique<SimTrainerAgent>(url, "crash-token", i, steps, acks));
    threads.emplace_back([&, i] { agents[i]->run(stop); });
  }
  std::mt19937_64 rng(o.seed);
  int kills = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (kills < o.kills) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 400));
    int st = 0;
    if (::waitpid(master, &st, WNOHANG) == master) break;  // the job finished
    ::kill(master, SIGKILL);
    ::waitpid(master, nullptr, 0);
    ++kills;
    master = spawn_master(dir.string(), "crash-token", true);
    if (kills % 10 == 0) std::fprintf(stderr, "  %d kills\n", kills);
  }
  // Let the job finish with the last master.
  int st = 0;
  for (int i = 0; i < 1200 && ::waitpid(master, &st, WNOHANG) != master; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const bool exited = ::kill(master, 0) != 0;
  if (!exited) {
    ::kill(master, SIGKILL);
    ::waitpid(master, nullptr, 0);
  }
  stop = true;
  for (auto& t : threads) t.join();

  // Every acknowledgement must be in the log, and the log must fold to a completed job.
  SqliteStore store((dir / "run" / "events.db").string(), SqliteStore::Mode::OpenReadOnly);
  std::set<std::pair<int32_t, int64_t>> logged_assigned, logged_completed;
  std::map<std::string, int32_t> logged_nodes;
  JobState s;
  store.for_each([&](const Event& e) {
    s.apply(e);
    if (const auto* a = std::get_if<ShardsAssigned>(&e.payload))
      for (int64_t x : a->shards) logged_assigned.insert({a->node, x});
    if (const auto* c = std::get_if<ShardsCompleted>(&e.payload))
      for (int64_t x : c->shards) logged_completed.insert({c->node, x});
    if (const auto* j = std::get_if<NodeJoined>(&e.payload)) logged_nodes[j->name] = j->node;
  });
  size_t lost = 0;
  for (const auto& a : acks.assigned) lost += !logged_assigned.count(a);
  for (const auto& c : acks.completed) lost += !logged_completed.count(c);
  for (const auto& [name, id] : acks.nodes)
    if (id >= 0 && logged_nodes.count(name) && logged_nodes[name] != id) ++lost;  // a node id answered twice
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%d SIGKILLs of the master in %.1f s; %zu shard assignments and %zu completions acknowledged; "
              "%zu missing from the log; %llu events; job %s\n",
              kills, secs, acks.assigned.size(), acks.completed.size(), lost,
              static_cast<unsigned long long>(s.last_seq()), s.finished() ? s.finish_reason().c_str() : "not finished");
  fs::remove_all(dir);
  return lost == 0 && s.finished() && s.finish_reason() == "completed" ? 0 : 1;
}

}  // namespace goodput
