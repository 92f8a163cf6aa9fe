#include "agent/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <iostream>
#include <optional>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/checkpoint_host.h"
#include "agent/node_check.h"
#include "agent/program.h"
#include "agent/replica.h"
#include "agent/trainer_group.h"
#include "net/http.h"

extern char** environ;

namespace goodput::agent {

using nlohmann::json;
using Steady = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

volatile sig_atomic_t g_terminate = 0;

int64_t ms_since(Steady::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - t).count();
}

void log(const std::string& name, const std::string& what) { std::cerr << "agent " << name << ": " << what << std::endl; }

AgentOptions with_work_dir(AgentOptions o) {
  if (o.work_dir.empty()) o.work_dir = "goodput-agent-" + o.name;
  return o;
}

// A restart whose trainers wait for their ranks' checkpoint copies to be fetched from peers.
struct Fetch {
  int32_t restart = 0;
  int64_t step = 0;
  TrainerGroup::Launch launch;
  std::future<std::pair<int, std::string>> done;  // ranks fetched; why some could not be
  bool cancelled = false;                          // the master moved on meanwhile
};

// The master session: register, heartbeat the node's state, and carry out each answer (run the
// trainer of a restart, stop it, run a node check, leave), on the trainer and checkpoint host.
class Agent {
 public:
  explicit Agent(AgentOptions o) : o_(with_work_dir(std::move(o))), url_(net::Url::parse(o_.master_url)) {
    fs::create_directories(o_.work_dir);
  }

  int run() {
    ::signal(SIGPIPE, SIG_IGN);
    // SIGTERM: the node is being taken away (Ray stopping its job, a pod deleted): stop the
    // trainer, let a running persist finish, free this node's host memory.
    ::signal(SIGTERM, [](int) { g_terminate = 1; });
    try {  // other nodes' link probes come here; without it this node's check fails, visibly
      probe_server_ = std::make_unique<LinkProbeServer>(o_.token);
    } catch (const std::exception& e) {
      log(o_.name, e.what());
    }
    try {  // peers' checkpoint copies come here; without it this node holds none (the master sees no port)
      replicas_ = std::make_unique<ReplicaServer>(o_.token, o_.name);
    } catch (const std::exception& e) {
      log(o_.name, std::string("no replica server: ") + e.what());
    }
    if (!register_node()) return 1;
    auto next_beat = Steady::now();
    while (true) {
      if (g_terminate) {
        log(o_.name, "terminated (SIGTERM)");
        // Say so first: a node stopped on purpose (a pod deleted, a Ray job stopped, an operator)
        // is replaced without its machine being taken for broken.
        if (node_ >= 0) call("/v1/exit", json{{"node", node_}, {"leaving", "received SIGTERM"}});
        return leave(0);
      }
      bool urgent = trainer_.reap();
      urgent |= trainer_.read_progress();
      urgent |= finish_fetch();
      if (urgent || Steady::now() >= next_beat) {
        const auto r = beat();
        next_beat = Steady::now() + interval_;
        if (r == Beat::Exit) return leave(0);  // the job is over, or this node is out of it
        if (r != Beat::Unreachable) last_contact_ = Steady::now();
        if (ms_since(last_contact_) > o_.master_timeout_s * 1000) {
          log(o_.name, "no master for " + std::to_string(o_.master_timeout_s) + " s: giving up");
          return leave(1);
        }
        if (r == Beat::Unknown && !register_node()) return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  enum class Beat { Ok, Unreachable, Unknown, Exit };

  std::optional<json> call(const std::string& target, const json& body, int* status = nullptr) {
    // Stderr tails hold any bytes: invalid UTF-8 is replaced, not thrown.
    const std::string text = body.dump(-1, ' ', false, json::error_handler_t::replace);
    auto r = net::http_call(url_, "POST", target, o_.token, text, 2000);
    if (!r) return std::nullopt;
    if (status) *status = r->status;
    if (r->status == 401) {
      log(o_.name, "the master refused our token (401): check GOODPUT_TOKEN");
      std::exit(1);
    }
    try {
      return json::parse(r->body);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  bool register_node() {
    for (int attempt = 0;; ++attempt) {
      int status = 0;
      json body{{"name", o_.name}, {"pid", ::getpid()}};
      if (!o_.host.empty()) body["host"] = o_.host;
      if (o_.slot >= 0) body["slot"] = o_.slot;
      if (probe_server_) body["check_port"] = probe_server_->port();
      body["rdzv_port"] = rdzv_port_;
      if (replicas_) body["replica_port"] = replicas_->port();
      auto r = call("/v1/register", body, &status);
      if (r && status == 200) {
        node_ = r->value("node", -1);
        interval_ = std::chrono::milliseconds(r->value("heartbeat_interval_ms", 250));
        char mem[32];
        std::snprintf(mem, sizeof mem, "%.2g", o_.memory_permille / 1000.0);
        log(o_.name, "registered as node " + std::to_string(node_) + ", slot " + std::to_string(r->value("slot", -1)) +
                         ", memory x" + mem);
        return true;
      }
      if (r && status >= 400 && status != 503) {
        log(o_.name, "register refused: " + r->dump());
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(2000, 100 << std::min(attempt, 5))));
    }
  }

  json status() {
    json out{{"node", node_}, {"trainer", trainer_.report()}};
    if (check_.valid() && check_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) check_result_ = check_.get();
    if (check_result_) out["check"] = *check_result_;
    if (probe_server_) out["check_port"] = probe_server_->port();
    out["rdzv_port"] = rdzv_port_;
    if (const std::string e = trainer_.persist_error(); !e.empty()) out["persist_error"] = e.substr(0, 1000);
    if (!o_.host.empty()) out["host"] = o_.host;  // a master resumed from its log learns it again
    if (replicas_) {
      out["replica_port"] = replicas_->port();
      json held = json::array();
      for (const HeldReplica& h : replicas_->held()) held.push_back({h.rank, h.step});
      out["held"] = std::move(held);
    }
    if (const std::string e = trainer_.replica_error(); !e.empty()) out["replica_error"] = e.substr(0, 1000);
    if (!fetch_error_.empty()) out["fetch_error"] = fetch_error_.substr(0, 2000);
    return out;
  }

  Beat beat() {
    int code = 0;
    const json report = status();
    auto r = call(trainer_.exited() && !exit_reported_ ? "/v1/exit" : "/v1/heartbeat", report, &code);
    if (!r) return Beat::Unreachable;
    if (code == 404) return Beat::Unknown;
    if (code != 200) return Beat::Unreachable;
    if (trainer_.exited()) exit_reported_ = true;
    if (report.contains("fetch_error")) fetch_error_.clear();  // said once
    const json& a = *r;
    if (a.contains("inject"))
      for (const auto& f : a["inject"]) inject(f.get<std::string>());
    const std::string action = a.value("action", "stop");
    if (action == "exit") return Beat::Exit;
    if (probe_server_ && a.contains("check_collective") && a["check_collective"].is_object()) {
      collective_argv_ = a["check_collective"].value("argv", std::vector<std::string>{});
      collective_env_ = a["check_collective"].value("env", std::vector<std::string>{});
      probe_server_->set_collective(collective_argv_, collective_env_);
    }
    if (fetch_ && (action != "run" || a.value("restart", 0) != fetch_->restart)) fetch_->cancelled = true;
    if (action == "check") {
      trainer_.stop();
      start_check(a.value("check", json::object()));
    } else if (action == "stop") {
      trainer_.stop();
    } else if (action == "run") {
      const int32_t restart = a.value("restart", 0);
      if (restart != trainer_.restart() && !fetch_) {
        trainer_.stop(a.value("dump_stacks", false));
        start_trainer(a);
      }
      replicate_to(a.value("replicate", json()));
    }
    return Beat::Ok;
  }

  // Where this node's checkpoint copies go (the run order's "replicate"; none: nowhere).
  void replicate_to(const json& r) {
    CheckpointHost::Replication rep;
    if (r.is_object()) {
      rep.key = r.value("key", std::string());
      rep.token = o_.token;
      rep.bytes_per_s = r.value("bytes_per_s", 0.0);
      for (const json& h : r.value("holders", json::array()))
        rep.holders.emplace_back(h.value("host", std::string("127.0.0.1")), h.value("port", uint16_t{0}));
    }
    trainer_.replicate_to(rep);
  }

  // The master's pre-flight check of this node: run it in the background (heartbeats go on) and
  // report the numbers with the heartbeats until the master moves on.
  void start_check(const json& c) {
    const int32_t round = c.value("round", 0);
    const int64_t id = c.value("id", int64_t{0});  // unique to the round, across master restarts
    if (round <= 0 || id <= 0 || id == check_id_ || check_.valid()) return;  // asked already, or still measuring
    check_id_ = id;
    check_result_.reset();
    const std::string fault = c.value("fault", "");
    if (probe_server_) probe_server_->set_down(fault == "link-down");  // a drill lasts one check
    log(o_.name, "node check, round " + std::to_string(round) + (fault.empty() ? "" : " (fault drill: " + fault + ")"));
    check_ = std::async(std::launch::async, [c, round, id, fault, token = o_.token, argv = collective_argv_,
                                             env = collective_env_]() -> json {
     try {
      double slow = 1;
      if (fault.rfind("slow:", 0) == 0) slow = std::stod(fault.substr(5));
      const ComputeResult cr = compute_probe(std::chrono::milliseconds(c.value("compute_ms", 500)), slow, fault == "corrupt");
      json out{{"round", round}, {"id", id}, {"compute_mflops", cr.mflops}, {"compute_ok", cr.ok}};
      if (!cr.ok) out["error"] = cr.error;
      if (c.contains("peer_host") && c["peer_host"].is_string()) {
        LinkResult lr;
        if (fault == "link-down") {
          lr.ok = false;
          lr.error = "link down (fault drill)";
        } else {
          const std::string host = c["peer_host"].get<std::string>();
          const uint16_t port = c.value("peer_port", uint16_t{0});
          const int64_t bytes = c.value("link_bytes", int64_t{1} << 20);
          const std::chrono::milliseconds timeout(c.value("timeout_ms", 20000));
          lr = c.value("collective", false) ? collective_probe(host, port, token, bytes, timeout, argv, env)
                                            : link_probe(host, port, token, bytes, timeout);
        }
        out["link_mb_per_s"] = lr.mb_per_s;
        out["link_ok"] = lr.ok;
        if (!lr.ok) out["error"] = out.value("error", std::string()) + (cr.ok ? "" : "; ") + lr.error;
      }
      return out;
     } catch (const std::exception& e) {
      return json{{"round", round}, {"id", id}, {"compute_ok", false}, {"error", std::string("check failed: ") + e.what()}};
     }
    });
  }

  void inject(const std::string& fault) {
    log(o_.name, "injecting " + fault);
    if (fault == "corrupt-replica") {  // the copies this node holds for its peers go bad
      log(o_.name, "spoiled " + std::to_string(replicas_ ? replicas_->corrupt() : 0) + " checkpoint copies held for peers");
      return;
    }
    if (fault == "kill-node") {  // the whole node: its trainers' process groups, and this agent
      trainer_.kill_group();
      ::kill(::getpid(), SIGKILL);
    }
    trainer_.inject(fault);
  }

  // The master's "run" answer: the trainers of a restart, with torchrun's environment and Goodput's.
  void start_trainer(const json& a) {
    TrainerGroup::Launch l;
    l.restart = a.value("restart", 0);
    l.node_rank = a.value("rank", 0);
    l.nodes = a.value("world_size", 1);
    l.nproc = std::clamp(a.value("nproc", 1), 1, 1024);
    l.rank_base = a.value("rank_base", l.node_rank);
    l.world = a.value("process_world_size", l.nodes);
    l.role = a.value("role", std::string("default"));
    l.role_rank_base = a.value("role_rank_base", l.rank_base);
    l.role_world = a.value("role_world_size", l.world);
    const std::string job = a.value("job", std::string("job"));
    const std::string run_id = a.value("run_id", std::string("0"));
    const std::string shm_prefix = "/goodput-" + job + "-" + run_id + "-" + o_.name;
    const std::string storage = a.value("storage_dir", std::string());
    l.checkpoint.job = job;
    l.checkpoint.storage_dir = storage;
    l.checkpoint.shm_prefix = shm_prefix;
    l.checkpoint_bytes = static_cast<uint64_t>(std::max<int64_t>(a.value("checkpoint_bytes", int64_t{0}), 0));

    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    auto set = [&](const std::string& k, const std::string& v) {
      std::erase_if(env, [&](const std::string& s) { return s.rfind(k + "=", 0) == 0; });
      env.push_back(k + "=" + v);
    };
    if (a.contains("env"))
      for (const auto& [k, v] : a["env"].items()) set(k, v.get<std::string>());
    // The per-process part of torchrun's environment (RANK, LOCAL_RANK, ...) is the group's.
    set("MASTER_ADDR", a.value("master_addr", std::string("127.0.0.1")));
    const uint16_t master_port = a.value("master_port", uint16_t{29500});
    set("MASTER_PORT", std::to_string(master_port));
    if (master_port == rdzv_port_) rdzv_port_ = free_tcp_port();  // taken now: offer another for the next restart
    set("TORCHELASTIC_RESTART_COUNT", std::to_string(l.restart));
    // The recovery policy bounds restarts; a job may say what its trainers are told.
    if (!a.contains("env") || !a["env"].contains("TORCHELASTIC_MAX_RESTARTS")) set("TORCHELASTIC_MAX_RESTARTS", "1000000");
    set("TORCHELASTIC_RUN_ID", job + "-" + run_id);
    set("GOODPUT_MASTER", o_.master_url);
    set("GOODPUT_NODE", std::to_string(node_));
    set("GOODPUT_NODE_NAME", o_.name);
    set("GOODPUT_JOB", job);
    set("GOODPUT_RESTART", std::to_string(l.restart));
    set("GOODPUT_STORAGE_DIR", storage);
    set("GOODPUT_SHM_PREFIX", shm_prefix);
    set("GOODPUT_RESTORE_STEP", std::to_string(a.value("restore_step", 0)));
    set("GOODPUT_RESTORE_TIER", a.value("restore_tier", std::string("none")));
    set("GOODPUT_CHECKPOINT_EVERY", std::to_string(a.value("checkpoint_every_steps", 0)));
    set("GOODPUT_PERSIST_EVERY", std::to_string(a.value("persist_every", 0)));
    set("GOODPUT_TOTAL_STEPS", std::to_string(a.value("total_steps", 0)));
    l.limit_mb = a.value("memory_limit_mb", int64_t{0}) * o_.memory_permille / 1000;
    l.plain = a.value("plain", false);
    l.warm_preload = a.value("warm_preload", std::vector<std::string>{});
    l.argv = a.value("command", std::vector<std::string>{});
    l.env = std::move(env);
    if (a.value("restore_tier", std::string()) == "peer") {
      // The world restores a step whose copies peers hold: fetch this node's ranks' copies into
      // its own memory first (a relaunched node has none), then start the trainers.
      start_fetch(l, a.value("restore_step", int64_t{0}), a.value("replicate", json()));
      return;
    }
    if (trainer_.start(l)) exit_reported_ = false;
  }

  void start_fetch(const TrainerGroup::Launch& l, int64_t step, const json& replicate) {
    struct Holder {
      std::string name, host;
      uint16_t port;
    };
    std::vector<Holder> holders;
    std::string key;
    if (replicate.is_object()) {
      key = replicate.value("key", std::string());
      for (const json& h : replicate.value("holders", json::array()))
        holders.push_back({h.value("name", std::string()), h.value("host", std::string("127.0.0.1")), h.value("port", uint16_t{0})});
    }
    fetch_.emplace();
    fetch_->restart = l.restart;
    fetch_->step = step;
    fetch_->launch = l;
    fetch_->done = std::async(std::launch::async, [l, step, holders, key, token = o_.token, name = o_.name] {
      int fetched = 0;
      std::string errors;
      for (int32_t i = 0; i < l.nproc; ++i) {
        const int32_t rank = l.rank_base + i;
        std::string why;
        try {
          ckpt::Options co = l.checkpoint;
          co.rank = rank;
          co.world_size = l.world;
          ckpt::FlashCheckpoint dest(co);
          const auto have = dest.memory_steps();
          if (std::find(have.begin(), have.end(), step) != have.end()) continue;  // its own memory has it
          for (const Holder& h : holders) {
            try {
              const ReplicaTransfer t = fetch_replica(dest, key, step, h.host, h.port, token, std::chrono::seconds(30));
              log(name, "fetched rank " + std::to_string(rank) + "'s step " + std::to_string(step) + " from " + h.name + " (" +
                            std::to_string(t.bytes >> 10) + " KiB in " + std::to_string(t.seconds) + " s)");
              why.clear();
              ++fetched;
              break;
            } catch (const std::exception& e) {
              why += (why.empty() ? "" : "; ") + (h.name.empty() ? h.host : h.name) + ": " + e.what();
            }
          }
          if (holders.empty()) why = "no holder of its copies is left";
        } catch (const std::exception& e) {
          why = e.what();
        }
        if (!why.empty()) errors += (errors.empty() ? "" : "; ") + std::string("rank ") + std::to_string(rank) + ": " + why;
      }
      if (!errors.empty()) {
        errors = "could not fetch step " + std::to_string(step) + " from peers (" + errors + "): restoring from storage";
        log(name, errors);
      }
      return std::make_pair(fetched, errors);
    });
  }

  // A fetch that finished: its trainers start now (unless the master moved on). True when it did.
  bool finish_fetch() {
    if (!fetch_ || fetch_->done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    auto [fetched, error] = fetch_->done.get();
    fetch_error_ = error;
    TrainerGroup::Launch l = std::move(fetch_->launch);
    // The trainers say "peer" for a restore of the copies fetched (goodput.live).
    if (fetched > 0 && error.empty()) l.env.push_back("GOODPUT_PEER_STEP=" + std::to_string(fetch_->step));
    const bool cancelled = fetch_->cancelled;
    fetch_.reset();
    if (!cancelled && trainer_.start(l)) exit_reported_ = false;
    return true;
  }

  // Stops the trainer, lets a running persist finish, and frees this node's host memory: nobody
  // restores from it once its agent is gone.
  int leave(int rc) {
    trainer_.leave();
    trainer_.drain_and_free();
    if (replicas_) replicas_->remove_all();
    log(o_.name, "leaving");
    return rc;
  }

  AgentOptions o_;
  net::Url url_;
  int32_t node_ = -1;
  std::chrono::milliseconds interval_{250};
  TrainerGroup trainer_{o_.name, o_.work_dir};
  bool exit_reported_ = false;
  Steady::time_point last_contact_ = Steady::now();
  std::unique_ptr<LinkProbeServer> probe_server_;
  std::unique_ptr<ReplicaServer> replicas_;
  std::optional<Fetch> fetch_;  // a restart waiting for its ranks' copies from peers
  std::string fetch_error_;     // why the newest fetch failed, until a heartbeat said so
  uint16_t rdzv_port_ = free_tcp_port();  // offered for the rendezvous store when this node is rank 0
  int64_t check_id_ = 0;  // the newest check round the master asked for
  std::vector<std::string> collective_argv_, collective_env_;  // the collective probe's program
  std::future<json> check_;
  std::optional<json> check_result_;
};

}  // namespace

int run_agent(const AgentOptions& options) {
  try {
    return Agent(options).run();
  } catch (const std::exception& e) {
    log(options.name, e.what());
    return 1;
  }
}

}  // namespace goodput::agent
