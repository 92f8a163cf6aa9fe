#include "agent/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/checkpoint/flash_checkpoint.h"
#include "agent/node_check.h"
#include "agent/program.h"
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

// Writes committed flash checkpoints of this node's rank to storage, off the trainer's path.
class Persister {
 public:
  Persister() : thread_([this] { loop(); }) {}
  ~Persister() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // The checkpoint identity of the running trainer (rank and world change between restarts).
  void configure(const ckpt::Options& o) {
    std::lock_guard lock(mu_);
    // A new rank (a replica group was scaled and ranks moved): what the old rank's memory holds
    // belongs to another layout, and a later trainer given that rank number must not load it.
    if (options_ && options_->rank != o.rank) ckpt::FlashCheckpoint(*options_).remove_memory();
    options_ = o;
    ckpt_.reset();
    steps_.clear();
    wanted_ = true;  // refresh the storage listing
    cv_.notify_all();
  }
  void request() {
    std::lock_guard lock(mu_);
    wanted_ = true;
    cv_.notify_all();
  }
  // Allocate the shared memory of the configured rank's checkpoints ahead of its first save.
  void reserve(uint64_t data_bytes) {
    std::lock_guard lock(mu_);
    reserve_ = data_bytes;
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !wanted_ && !busy_ && reserve_ == 0; });
  }
  std::vector<int64_t> storage_steps() {
    std::lock_guard lock(mu_);
    return steps_;
  }
  // Why the newest persist failed; empty once one succeeds.
  std::string error() {
    std::lock_guard lock(mu_);
    return error_;
  }
  void remove_memory() {
    std::lock_guard lock(mu_);
    if (options_) ckpt::FlashCheckpoint(*options_).remove_memory();
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || wanted_ || reserve_ > 0; });
      if (stop_) return;
      if (reserve_ > 0 && options_) {
        const uint64_t bytes = std::exchange(reserve_, 0);
        ckpt::FlashCheckpoint c(*options_);
        busy_ = true;
        lock.unlock();
        try {
          const uint64_t got = c.reserve(bytes);
          std::cerr << "agent: " << (got ? "reserved " + std::to_string(got >> 20) + " MiB of shared memory for "
                                          : std::string("cannot allocate shared memory ahead for "))
                    << c.shm_name(0) << " and " << c.shm_name(1) << std::endl;
        } catch (const std::exception& e) {
          std::cerr << "agent: reserving shared memory failed (the first save allocates it): " << e.what() << std::endl;
        }
        lock.lock();
        busy_ = false;
        cv_.notify_all();
        continue;
      }
      reserve_ = 0;
      wanted_ = false;
      if (!options_ || options_->storage_dir.empty()) {
        cv_.notify_all();
        continue;
      }
      busy_ = true;
      if (!ckpt_) ckpt_ = std::make_shared<ckpt::FlashCheckpoint>(*options_);
      // Our own reference: configure() may swap in the next restart's checkpoint meanwhile (a
      // persist-on-exit still running when the new trainer starts), and this one must live on.
      const std::shared_ptr<ckpt::FlashCheckpoint> held = ckpt_;
      ckpt::FlashCheckpoint& c = *held;
      lock.unlock();
      std::vector<int64_t> steps;
      std::string error;
      try {
        c.persist();
      } catch (const std::exception& e) {
        error = e.what();
        std::cerr << "agent: persist failed: " << error << std::endl;
      }
      try {
        steps = c.storage_steps();
      } catch (const std::exception&) {
      }
      lock.lock();
      if (held == ckpt_) steps_ = steps;  // else a listing of the previous restart's: configure() asked anew
      error_ = error;
      busy_ = false;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<ckpt::Options> options_;
  uint64_t reserve_ = 0;  // bytes to reserve for the configured rank, 0: nothing asked
  std::shared_ptr<ckpt::FlashCheckpoint> ckpt_;
  std::string error_;
  std::vector<int64_t> steps_;
  bool wanted_ = false, busy_ = false, stop_ = false;
  std::thread thread_;
};

constexpr size_t kWorkWindow = 20;  // steps in the straggler window

struct Trainer {
  pid_t pid = -1;
  int32_t restart = -1;
  int32_t rank = 0;
  int32_t world = 1;
  std::string progress_path, log_path, err_path, error_path;
  off_t progress_offset = 0;
  std::string partial_line;
  std::string phase = "none";
  int64_t step = 0;
  Steady::time_point last_progress = Steady::now();
  int64_t saves = 0, save_blocking_ns = 0, saved_step = -1;
  std::optional<json> loaded;
  std::optional<double> loss;
  std::vector<double> work;  // CPU seconds per step, the last kWorkWindow steps
  bool exited = false, done = false;
  int32_t code = 0, signal = 0;
  std::string reason;
  Steady::time_point exited_at;
  int stack_signal = 0;  // the trainer dumps its own stacks on this signal (goodput.live: SIGUSR1)
  bool running() const { return pid > 0 && !exited; }
};

// The full path of an executable on PATH, or empty.
std::string on_path(const std::string& tool) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && ::access((dir + "/" + tool).c_str(), X_OK) == 0) return dir + "/" + tool;
  return "";
}


std::string tail_of(const std::string& path, size_t bytes, int lines) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const auto size = static_cast<size_t>(in.tellg());
  in.seekg(static_cast<std::streamoff>(size > bytes ? size - bytes : 0));
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> kept;
  std::istringstream ss(s);
  for (std::string line; std::getline(ss, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) kept.push_back(line);
  std::string out;
  for (size_t i = kept.size() > static_cast<size_t>(lines) ? kept.size() - lines : 0; i < kept.size(); ++i)
    out += (out.empty() ? "" : " | ") + kept[i];
  return out;
}

// torchelastic's error file: {"message": {"message": "...", ...}} or {"message": "..."}.
std::string error_file_message(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  try {
    const json j = json::parse(in);
    const json& m = j.at("message");
    if (m.is_string()) return m.get<std::string>();
    if (m.is_object() && m.contains("message") && m["message"].is_string()) return m["message"].get<std::string>();
  } catch (const std::exception&) {
  }
  return "";
}

bool process_stopped(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = s.rfind(')');
  return close != std::string::npos && close + 2 < s.size() && s[close + 2] == 'T';
}

int64_t vm_size_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmSize:", 0) == 0) return std::stoll(line.substr(7)) * 1024;
  return 0;
}

class Agent {
 public:
  explicit Agent(AgentOptions o) : o_(std::move(o)), url_(net::Url::parse(o_.master_url)) {
    if (o_.work_dir.empty()) o_.work_dir = "goodput-agent-" + o_.name;
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
      bool urgent = reap();
      urgent |= read_progress();
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
    json t{{"restart", t_.restart}, {"phase", t_.phase}, {"pid", t_.pid}, {"step", t_.step},
           {"progress_age_ms", ms_since(t_.last_progress)}, {"saves", t_.saves},
           {"save_blocking_ns", t_.save_blocking_ns}, {"saved_step", t_.saved_step}, {"done", t_.done},
           {"storage_steps", persister_.storage_steps()}};
    if (t_.running()) t["stopped"] = process_stopped(t_.pid);
    if (t_.loaded) t["loaded"] = *t_.loaded;
    if (t_.loss) t["loss"] = *t_.loss;
    if (t_.work.size() >= kWorkWindow / 2) {  // robust: the median of the window, and its spread (MAD)
      std::vector<double> w = t_.work;
      std::nth_element(w.begin(), w.begin() + w.size() / 2, w.end());
      const double med = w[w.size() / 2];
      for (double& x : w) x = std::abs(x - med);
      std::nth_element(w.begin(), w.begin() + w.size() / 2, w.end());
      t["work_median_s"] = med;
      t["work_mad_s"] = w[w.size() / 2];
    }
    if (t_.exited)
      t["exit"] = {{"code", t_.code}, {"signal", t_.signal}, {"reason", t_.reason}, {"done", t_.done},
                   {"age_ms", ms_since(t_.exited_at)}};
    json out{{"node", node_}, {"trainer", t}};
    if (check_.valid() && check_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) check_result_ = check_.get();
    if (check_result_) out["check"] = *check_result_;
    if (probe_server_) out["check_port"] = probe_server_->port();
    out["rdzv_port"] = rdzv_port_;
    if (const std::string e = persister_.error(); !e.empty()) out["persist_error"] = e.substr(0, 1000);
    if (!o_.host.empty()) out["host"] = o_.host;  // a master resumed from its log learns it again
    return out;
  }

  Beat beat() {
    int code = 0;
    auto r = call(t_.exited && !exit_reported_ ? "/v1/exit" : "/v1/heartbeat", status(), &code);
    if (!r) return Beat::Unreachable;
    if (code == 404) return Beat::Unknown;
    if (code != 200) return Beat::Unreachable;
    if (t_.exited) exit_reported_ = true;
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
    if (action == "check") {
      stop_trainer();
      start_check(a.value("check", json::object()));
    } else if (action == "stop") {
      stop_trainer();
    } else if (action == "run") {
      const int32_t restart = a.value("restart", 0);
      if (restart != t_.restart) {
        stop_trainer(a.value("dump_stacks", false));
        start_trainer(a);
      }
    }
    return Beat::Ok;
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
    if (fault == "kill-node") {
      if (t_.running()) ::kill(-t_.pid, SIGKILL);
      ::kill(::getpid(), SIGKILL);
    }
    if (!t_.running()) return;
    if (fault == "kill-process") {
      ::kill(t_.pid, SIGKILL);
    } else if (fault == "dump-stacks") {  // a hang the master leaves alone: stacks, and nothing else
      dump_stacks(false);
    } else if (fault == "hang") {
      ::kill(t_.pid, SIGSTOP);
    } else if (fault == "oom") {
      // A real memory limit, lowered under the trainer's feet: its next large allocation fails.
      const int64_t vm = vm_size_bytes(t_.pid);
      const rlimit lim{static_cast<rlim_t>(vm + (16 << 20)), static_cast<rlim_t>(vm + (16 << 20))};
      if (vm <= 0 || ::prlimit(t_.pid, RLIMIT_AS, &lim, nullptr) != 0) log(o_.name, "oom: prlimit failed");
    }
  }

  void start_trainer(const json& a) {
    Trainer t;
    t.restart = a.value("restart", 0);
    t.rank = a.value("rank", 0);
    t.world = a.value("world_size", 1);
    const std::string job = a.value("job", std::string("job"));
    const std::string tag = o_.work_dir + "/r" + std::to_string(t.restart);
    t.progress_path = tag + "-progress.jsonl";
    t.log_path = tag + "-stdout.log";
    t.err_path = tag + "-stderr.log";
    t.error_path = tag + "-error.json";
    for (const auto& p : {t.progress_path, t.error_path}) ::unlink(p.c_str());
    const std::string run_id = a.value("run_id", std::string("0"));
    const std::string shm_prefix = "/goodput-" + job + "-" + run_id + "-" + o_.name;
    const std::string storage = a.value("storage_dir", std::string());
    ckpt::Options co;
    co.job = job;
    co.rank = t.rank;
    co.world_size = t.world;
    co.storage_dir = storage;
    co.shm_prefix = shm_prefix;
    persister_.configure(co);
    // The job's checkpoint size: allocate its shared memory now, while the trainer starts up.
    if (const int64_t bytes = a.value("checkpoint_bytes", int64_t{0}); bytes > 0) persister_.reserve(static_cast<uint64_t>(bytes));

    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    auto set = [&](const std::string& k, const std::string& v) {
      std::erase_if(env, [&](const std::string& s) { return s.rfind(k + "=", 0) == 0; });
      env.push_back(k + "=" + v);
    };
    if (a.contains("env"))
      for (const auto& [k, v] : a["env"].items()) set(k, v.get<std::string>());
    const std::string rank = std::to_string(t.rank), world = std::to_string(t.world);
    set("RANK", rank);
    set("GROUP_RANK", rank);
    set("ROLE_RANK", rank);
    set("LOCAL_RANK", "0");
    set("WORLD_SIZE", world);
    set("ROLE_WORLD_SIZE", world);
    set("LOCAL_WORLD_SIZE", "1");
    set("MASTER_ADDR", a.value("master_addr", std::string("127.0.0.1")));
    const uint16_t master_port = a.value("master_port", uint16_t{29500});
    set("MASTER_PORT", std::to_string(master_port));
    if (master_port == rdzv_port_) rdzv_port_ = free_tcp_port();  // taken now: offer another for the next restart
    set("TORCHELASTIC_RESTART_COUNT", std::to_string(t.restart));
    set("TORCHELASTIC_MAX_RESTARTS", "1000000");
    set("TORCHELASTIC_RUN_ID", job + "-" + run_id);
    set("TORCHELASTIC_ERROR_FILE", t.error_path);
    set("GOODPUT_MASTER", o_.master_url);
    set("GOODPUT_NODE", std::to_string(node_));
    set("GOODPUT_NODE_NAME", o_.name);
    set("GOODPUT_JOB", job);
    set("GOODPUT_RESTART", std::to_string(t.restart));
    set("GOODPUT_PROGRESS_FILE", t.progress_path);
    set("GOODPUT_STORAGE_DIR", storage);
    set("GOODPUT_SHM_PREFIX", shm_prefix);
    set("GOODPUT_RESTORE_STEP", std::to_string(a.value("restore_step", 0)));
    set("GOODPUT_RESTORE_TIER", a.value("restore_tier", std::string("none")));
    set("GOODPUT_CHECKPOINT_EVERY", std::to_string(a.value("checkpoint_every_steps", 0)));
    set("GOODPUT_PERSIST_EVERY", std::to_string(a.value("persist_every", 0)));
    set("GOODPUT_TOTAL_STEPS", std::to_string(a.value("total_steps", 0)));
    std::vector<std::string> argv = a.value("command", std::vector<std::string>{});
    if (argv.empty()) {
      log(o_.name, "the master sent no command");
      return;
    }
    const int64_t limit_mb = a.value("memory_limit_mb", int64_t{0}) * o_.memory_permille / 1000;

    std::vector<char*> cargv, cenv;
    for (auto& s : argv) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    for (auto& s : env) cenv.push_back(s.data());
    cenv.push_back(nullptr);
    const int fd = ::open(t.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    const int efd = ::open(t.err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);  // its own process group: the agent stops the whole trainer tree
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // and a node that dies takes its trainer with it
      if (::getppid() != parent) ::_exit(137);
      if (fd >= 0) ::dup2(fd, 1);
      if (efd >= 0) ::dup2(efd, 2);
      if (limit_mb > 0) {
        const rlimit lim{static_cast<rlim_t>(limit_mb) << 20, static_cast<rlim_t>(limit_mb) << 20};
        ::setrlimit(RLIMIT_AS, &lim);
      }
      ::execvpe(cargv[0], cargv.data(), cenv.data());
      const std::string msg = std::string("goodput agent: cannot run ") + cargv[0] + ": " + std::strerror(errno) + "\n";
      (void)!::write(2, msg.data(), msg.size());
      ::_exit(127);
    }
    if (fd >= 0) ::close(fd);
    if (efd >= 0) ::close(efd);
    if (pid < 0) {
      log(o_.name, std::string("fork failed: ") + std::strerror(errno));
      return;
    }
    ::setpgid(pid, pid);
    t.pid = pid;
    t.phase = "launched";  // "starting" once the trainer's first report arrives
    t.last_progress = Steady::now();
    t_ = std::move(t);
    exit_reported_ = false;
    log(o_.name, "started trainer pid " + std::to_string(pid) + " (restart " + std::to_string(t_.restart) + ", rank " +
                     rank + "/" + world + ")");
  }

  // dump: first record where the trainer's threads are, so a hang can be diagnosed
  // afterwards: a trainer that said it dumps its own stacks on a signal (goodput.live registers
  // faulthandler on SIGUSR1; they land in its stderr log) gets the signal; any other gets native
  // stacks from py-spy if installed, else from gdb, into stacks-r<restart>-<pid>.txt.
  void stop_trainer(bool dump = false) {
    if (!t_.running()) return;
    if (dump) dump_stacks(true);
    ::kill(-t_.pid, SIGKILL);
    ::kill(-t_.pid, SIGCONT);
    int st = 0;
    ::waitpid(t_.pid, &st, 0);
    t_.pid = -1;
    t_.phase = "none";  // stopped on purpose: not a failure to report
  }

  // wake: continue a stopped trainer first, so that it can answer the signal (it is killed next). A
  // trainer left running stays as it is: a stopped one gets native stacks, which need no cooperation.
  void dump_stacks(bool wake) {
    if (wake) ::kill(t_.pid, SIGCONT);
    if (t_.stack_signal && (wake || !process_stopped(t_.pid))) {
      ::kill(t_.pid, t_.stack_signal);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      log(o_.name, "stacks of the hung trainer (pid " + std::to_string(t_.pid) + ") are in " + t_.err_path);
    } else {
      dump_native_stacks();
    }
  }

  void dump_native_stacks() {
    const std::string pid = std::to_string(t_.pid);
    const std::string out = o_.work_dir + "/stacks-r" + std::to_string(t_.restart) + "-" + pid + ".txt";
    std::vector<std::string> argv;
    if (const std::string py_spy = on_path("py-spy"); !py_spy.empty())
      argv = {py_spy, "dump", "--native", "--pid", pid};
    else if (const std::string gdb = on_path("gdb"); !gdb.empty())
      argv = {gdb, "-batch", "-nx", "-p", pid, "-ex", "thread apply all bt"};
    if (argv.empty()) {
      log(o_.name, "no py-spy or gdb on PATH: no stacks of the hung trainer (pid " + pid + ")");
      return;
    }
    Program p = spawn_program(argv);
    const ProgramResult r = finish_program(p, Steady::now() + std::chrono::seconds(30));
    std::ofstream(out) << r.out;
    const bool ok = r.exited_ok;
    log(o_.name, "stacks of the hung trainer (pid " + pid + ", " + fs::path(argv[0]).filename().string() + ") are in " +
                     out + (ok ? "" : " (the tool failed or timed out; what it said on stderr is above)"));
  }

  // True when the trainer just exited.
  bool reap() {
    if (!t_.running()) return false;
    int st = 0;
    if (::waitpid(t_.pid, &st, WNOHANG) != t_.pid) return false;
    read_progress();
    t_.exited = true;
    t_.exited_at = Steady::now();
    t_.phase = "exited";
    if (WIFSIGNALED(st)) {
      t_.signal = WTERMSIG(st);
      t_.code = 128 + t_.signal;
    } else {
      t_.code = WEXITSTATUS(st);
    }
    std::string reason = error_file_message(t_.error_path);
    if (reason.empty()) reason = tail_of(t_.err_path, 4096, 4);
    if (t_.signal) reason = std::string("killed by signal ") + std::to_string(t_.signal) + " (" + ::strsignal(t_.signal) + ")" + (reason.empty() ? "" : "; " + reason);
    t_.reason = reason.substr(0, 2000);
    if (t_.code == 0 && !t_.done) t_.reason = "exited with code 0 before the last step; " + t_.reason;
    log(o_.name, "trainer exited: code " + std::to_string(t_.code) + (t_.done ? " (done)" : "") +
                     (t_.reason.empty() ? "" : ": " + t_.reason.substr(0, 300)));
    persister_.request();  // persist on failure: the newest memory checkpoint, if storage lacks it
    return true;
  }

  // True when the trainer reported something the master should hear now rather than at the next
  // heartbeat: a phase change, a checkpoint or the last step (the report's accounting is only as
  // precise as these times).
  bool read_progress() {
    if (t_.progress_path.empty()) return false;
    const int fd = ::open(t_.progress_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char buf[65536];
    while (true) {
      const ssize_t n = ::pread(fd, buf, sizeof buf, t_.progress_offset);
      if (n <= 0) break;
      t_.progress_offset += n;
      t_.partial_line.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    size_t start = 0;
    bool urgent = false;
    for (size_t nl; (nl = t_.partial_line.find('\n', start)) != std::string::npos; start = nl + 1)
      urgent |= on_progress(t_.partial_line.substr(start, nl - start));
    t_.partial_line.erase(0, start);
    return urgent;
  }

  bool on_progress(const std::string& line) {
    json j;
    try {
      j = json::parse(line);
    } catch (const std::exception&) {
      return false;  // not ours; the trainer may print anything
    }
    if (!j.is_object()) return false;
    t_.last_progress = Steady::now();
    const std::string ev = j.value("event", "");
    if (ev == "started") {
      t_.phase = "starting";
      if (j.value("stacks_on", std::string()) == "SIGUSR1") t_.stack_signal = SIGUSR1;
    } else if (ev == "rendezvous") {
      t_.phase = "rendezvous";
    } else if (ev == "loaded") {
      t_.phase = "loaded";
      t_.loaded = json{{"step", j.value("step", int64_t{0})}, {"tier", j.value("tier", std::string("none"))},
                       {"ns", static_cast<int64_t>(j.value("seconds", 0.0) * 1e9)}};
      t_.step = j.value("step", int64_t{0});
    } else if (ev == "step") {
      t_.phase = "training";
      t_.step = j.value("step", t_.step);
      if (j.contains("loss") && j["loss"].is_number()) t_.loss = j["loss"].get<double>();
      if (j.contains("work_s") && j["work_s"].is_number()) {
        t_.work.push_back(j["work_s"].get<double>());
        if (t_.work.size() > kWorkWindow) t_.work.erase(t_.work.begin());
      }
    } else if (ev == "saved") {
      ++t_.saves;
      t_.save_blocking_ns += static_cast<int64_t>(j.value("blocking_s", 0.0) * 1e9);
      t_.saved_step = j.value("step", t_.saved_step);
      if (j.value("persist", false)) persister_.request();
    } else if (ev == "done") {
      t_.done = true;
      t_.step = j.value("step", t_.step);
    }
    return ev != "step";
  }

  // Stops the trainer, lets a running persist finish, and frees this node's host memory: nobody
  // restores from it once its agent is gone.
  int leave(int rc) {
    if (t_.running()) {
      ::kill(-t_.pid, SIGTERM);
      for (int i = 0; i < 100 && !reap(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      stop_trainer();
    }
    persister_.drain();
    persister_.remove_memory();
    log(o_.name, "leaving");
    return rc;
  }

  AgentOptions o_;
  net::Url url_;
  int32_t node_ = -1;
  std::chrono::milliseconds interval_{250};
  Trainer t_;
  bool exit_reported_ = false;
  Steady::time_point last_contact_ = Steady::now();
  Persister persister_;
  std::unique_ptr<LinkProbeServer> probe_server_;
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
