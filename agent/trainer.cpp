#include "agent/trainer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "agent/program.h"

namespace goodput::agent {

using nlohmann::json;
using Steady = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

constexpr size_t kWorkWindow = 20;  // steps in the straggler window

int64_t ms_since(Steady::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - t).count();
}

void log(const std::string& name, const std::string& what) { std::cerr << "agent " << name << ": " << what << std::endl; }

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

// A trainer-like child: its own process group (the agent stops the whole tree), killed with the
// agent, stdin/stdout/stderr from the given descriptors (-1: left as they are), under an
// address-space limit (0: none). Returns its pid, or -1 if fork failed.
pid_t fork_exec(std::vector<std::string> argv, std::vector<std::string> env, int in, int out, int err,
                int64_t limit_mb) {
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a node that dies takes its trainers with it
    if (::getppid() != parent) ::_exit(137);
    if (in >= 0) ::dup2(in, 0);
    if (out >= 0) ::dup2(out, 1);
    if (err >= 0) ::dup2(err, 2);
    if (limit_mb > 0) {
      const rlimit lim{static_cast<rlim_t>(limit_mb) << 20, static_cast<rlim_t>(limit_mb) << 20};
      ::setrlimit(RLIMIT_AS, &lim);
    }
    ::execvpe(cargv[0], cargv.data(), cenv.data());
    const std::string msg = std::string("goodput agent: cannot run ") + cargv[0] + ": " + std::strerror(errno) + "\n";
    (void)!::write(2, msg.data(), msg.size());
    ::_exit(127);
  }
  if (pid > 0) ::setpgid(pid, pid);
  return pid;
}

int64_t vm_size_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmSize:", 0) == 0) return std::stoll(line.substr(7)) * 1024;
  return 0;
}

}  // namespace

TrainerProcess::TrainerProcess(std::string node_name, std::string work_dir, std::string file_tag,
                               std::function<void(bool persist)> saved)
    : name_(std::move(node_name)),
      work_dir_(std::move(work_dir)),
      file_tag_(std::move(file_tag)),
      saved_(std::move(saved)) {}

TrainerProcess::Files TrainerProcess::prepare(int32_t restart) const {
  const std::string tag = work_dir_ + "/r" + std::to_string(restart) + file_tag_;
  Files f{tag + "-progress.jsonl", tag + "-stdout.log", tag + "-stderr.log", tag + "-error.json"};
  for (const auto& p : {f.progress, f.error}) ::unlink(p.c_str());
  return f;
}

bool TrainerProcess::start(int32_t restart, int32_t rank, int32_t world, const Files& files, std::vector<std::string> argv,
                           std::vector<std::string> env, int64_t limit_mb, bool plain) {
  if (argv.empty()) {
    log(name_, "the master sent no command");
    return false;
  }
  last_ = LastStart{argv[0], env, limit_mb};
  pid_t pid = -1;
  bool warm = false;
  if (warm_.pid > 0) {
    const pid_t warm_pid = warm_.pid;
    const std::string why = warm_unfit(argv, env, limit_mb);
    if (why.empty() && hand_over(argv, env, files)) {
      pid = warm_.pid;
      warm = true;
      ::close(warm_.fd);
      warm_ = Warm{};
    } else {
      log(name_, "warm interpreter pid " + std::to_string(warm_pid) + " not used, starting cold: " +
                     (why.empty() ? std::string("it did not take the orders") : why));
      // One that could not even wait (a preload that does not import) would fail the same way again.
      if (warm_.pid < 0) {
        log(name_, "no more warm interpreters on this node for this job");
        warm_failed_ = true;
      }
      drop_warm();
    }
  }
  if (!warm) {
    const int fd = ::open(files.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    const int efd = ::open(files.err.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    pid = fork_exec(std::move(argv), std::move(env), -1, fd, efd, limit_mb);
    if (fd >= 0) ::close(fd);
    if (efd >= 0) ::close(efd);
    if (pid < 0) {
      log(name_, std::string("fork failed: ") + std::strerror(errno));
      return false;
    }
  }
  State t;
  t.restart = restart;
  t.files = files;
  t.pid = pid;
  t.warm = warm;
  t.phase = "launched";  // "starting" once the trainer's first report arrives
  t.last_progress = Steady::now();
  if (plain) {  // nothing will say more: it is training from the start, from its own checkpoints
    t.plain = true;
    t.phase = "training";
    t.loaded = json{{"step", 0}, {"tier", "none"}, {"ns", 0}};
  }
  t_ = std::move(t);
  log(name_, "started trainer pid " + std::to_string(pid) + " (restart " + std::to_string(restart) + ", rank " +
                 std::to_string(rank) + "/" + std::to_string(world) + (warm ? ", in a warm interpreter" : "") + ")");
  return true;
}

// ---- warm starts ----------------------------------------------------------------------------------

namespace {
// Read by the interpreter or by what it imports, at start: a warm interpreter started under other
// values would not be the process a cold start makes.
bool import_time(std::string_view var) {
  const std::string_view name = var.substr(0, var.find('='));
  if (name == "PATH") return true;
  if (name.starts_with("TORCHELASTIC_")) return false;  // per restart, read by the script
  for (std::string_view p : {"PYTHON", "LD_", "CUDA_", "OMP_", "MKL_", "TORCH_"})
    if (name.starts_with(p)) return true;
  return false;
}
std::vector<std::string> import_time_env(const std::vector<std::string>& env) {
  std::vector<std::string> out;
  for (const auto& e : env)
    if (import_time(e)) out.push_back(e);
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

void TrainerProcess::set_warm(std::vector<std::string> preload) {
  preload_ = std::move(preload);
  if (preload_.empty()) drop_warm();
}

void TrainerProcess::drop_warm() {
  if (warm_.fd >= 0) ::close(warm_.fd);
  if (warm_.pid > 0) {
    ::kill(-warm_.pid, SIGKILL);
    int st = 0;
    ::waitpid(warm_.pid, &st, 0);
  }
  warm_ = Warm{};
}

// Why the warm interpreter cannot take this start (empty: it can).
std::string TrainerProcess::warm_unfit(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                       int64_t limit_mb) {
  int st = 0;
  if (::waitpid(warm_.pid, &st, WNOHANG) == warm_.pid) {
    const std::string how = WIFSIGNALED(st) ? "killed by signal " + std::to_string(WTERMSIG(st))
                                             : "code " + std::to_string(WEXITSTATUS(st));
    const std::string why = "it exited, " + how + " (see " + work_dir_ + "/warm" + file_tag_ + ".log)";
    warm_.pid = -1;  // reaped: nothing to kill
    return why;
  }
  if (argv[0] != warm_.like.interpreter) return "the command's program is not " + warm_.like.interpreter;
  if (argv.size() < 2 || (argv[1] == "-m" ? argv.size() < 3 : argv[1].empty() || argv[1][0] == '-'))
    return "the command is not PYTHON SCRIPT ... or PYTHON -m MODULE ...";
  if (limit_mb != warm_.like.limit_mb) return "the memory limit changed";
  if (import_time_env(env) != import_time_env(warm_.like.env)) return "the environment read at interpreter start changed";
  return "";
}

bool TrainerProcess::hand_over(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                               const Files& files) {
  json vars = json::object();
  for (const auto& e : env)
    if (const auto eq = e.find('='); eq != std::string::npos) vars[e.substr(0, eq)] = e.substr(eq + 1);
  std::error_code ec;
  const std::string cwd = fs::current_path(ec).string();
  const std::string order = json{{"argv", std::vector<std::string>(argv.begin() + 1, argv.end())},
                                 {"env", vars},
                                 {"cwd", cwd},
                                 {"stdout", files.log},
                                 {"stderr", files.err}}
                                .dump(-1, ' ', false, json::error_handler_t::replace) +
                            "\n";
  size_t done = 0;
  while (done < order.size()) {
    const ssize_t n = ::write(warm_.fd, order.data() + done, order.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// An interpreter for the next restart, made like the trainer that now trains.
void TrainerProcess::spawn_warm() {
  if (preload_.empty() || warm_failed_ || warm_.pid > 0 || last_.interpreter.empty()) return;
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return;
  std::vector<std::string> argv{last_.interpreter, "-m", "goodput.warm"};
  argv.insert(argv.end(), preload_.begin(), preload_.end());
  const int lfd = ::open((work_dir_ + "/warm" + file_tag_ + ".log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  const pid_t pid = fork_exec(argv, last_.env, pipefd[0], lfd, lfd, last_.limit_mb);
  ::close(pipefd[0]);
  if (lfd >= 0) ::close(lfd);
  if (pid < 0) {
    ::close(pipefd[1]);
    return;
  }
  warm_ = Warm{pid, pipefd[1], last_};
  std::string modules;
  for (const auto& m : preload_) modules += " " + m;
  log(name_, "warm interpreter pid " + std::to_string(pid) + " started for the next restart (preload:" + modules + ")");
}

// dump: first record where the trainer's threads are, so a hang can be diagnosed
// afterwards: a trainer that said it dumps its own stacks on a signal (goodput.live registers
// faulthandler on SIGUSR1; they land in its stderr log) gets the signal; any other gets native
// stacks from py-spy if installed, else from gdb, into stacks-r<restart>-<pid>.txt.
void TrainerProcess::stop(bool dump) {
  if (!running()) return;
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
void TrainerProcess::dump_stacks(bool wake) {
  if (wake) ::kill(t_.pid, SIGCONT);
  if (t_.stack_signal && (wake || !process_stopped(t_.pid))) {
    ::kill(t_.pid, t_.stack_signal);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    log(name_, "stacks of the hung trainer (pid " + std::to_string(t_.pid) + ") are in " + t_.files.err);
  } else {
    dump_native_stacks();
  }
}

void TrainerProcess::dump_native_stacks() {
  const std::string pid = std::to_string(t_.pid);
  const std::string out = work_dir_ + "/stacks-r" + std::to_string(t_.restart) + "-" + pid + ".txt";
  std::vector<std::string> argv;
  if (const std::string py_spy = on_path("py-spy"); !py_spy.empty())
    argv = {py_spy, "dump", "--native", "--pid", pid};
  else if (const std::string gdb = on_path("gdb"); !gdb.empty())
    argv = {gdb, "-batch", "-nx", "-p", pid, "-ex", "thread apply all bt"};
  if (argv.empty()) {
    log(name_, "no py-spy or gdb on PATH: no stacks of the hung trainer (pid " + pid + ")");
    return;
  }
  Program p = spawn_program(argv);
  const ProgramResult r = finish_program(p, Steady::now() + std::chrono::seconds(30));
  std::ofstream(out) << r.out;
  const bool ok = r.exited_ok;
  log(name_, "stacks of the hung trainer (pid " + pid + ", " + fs::path(argv[0]).filename().string() + ") are in " +
                   out + (ok ? "" : " (the tool failed or timed out; what it said on stderr is above)"));
}

// True when the trainer just exited.
bool TrainerProcess::reap() {
  if (!running()) return false;
  int st = 0;
  if (::waitpid(t_.pid, &st, WNOHANG) != t_.pid) return false;
  read_progress();
  t_.exited = true;
  t_.exited_at = Steady::now();
  if (t_.plain && WIFEXITED(st) && WEXITSTATUS(st) == 0) t_.done = true;  // torchrun's judgement: exit 0 is success
  t_.phase = "exited";
  if (WIFSIGNALED(st)) {
    t_.signal = WTERMSIG(st);
    t_.code = 128 + t_.signal;
  } else {
    t_.code = WEXITSTATUS(st);
  }
  std::string reason = error_file_message(t_.files.error);
  if (reason.empty()) reason = tail_of(t_.files.err, 4096, 4);
  if (t_.signal) reason = std::string("killed by signal ") + std::to_string(t_.signal) + " (" + ::strsignal(t_.signal) + ")" + (reason.empty() ? "" : "; " + reason);
  t_.reason = reason.substr(0, 2000);
  if (t_.code == 0 && !t_.done) t_.reason = "exited with code 0 before the last step; " + t_.reason;
  log(name_, "trainer exited: code " + std::to_string(t_.code) + (t_.done ? " (done)" : "") +
                   (t_.reason.empty() ? "" : ": " + t_.reason.substr(0, 300)));
  saved_(true);  // persist on failure: the newest memory checkpoint, if storage lacks it
  return true;
}

// True when the trainer reported something the master should hear now rather than at the next
// heartbeat: a phase change, a checkpoint or the last step (the report's accounting is only as
// precise as these times).
bool TrainerProcess::read_progress() {
  if (t_.files.progress.empty()) return false;
  const int fd = ::open(t_.files.progress.c_str(), O_RDONLY | O_CLOEXEC);
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
  // The next restart's interpreter starts once this one trains, not beside its start-up.
  if (warm_.pid < 0 && running() && t_.phase == "training") spawn_warm();
  return urgent;
}

bool TrainerProcess::on_progress(const std::string& line) {
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
    saved_(j.value("persist", false));
  } else if (ev == "done") {
    t_.done = true;
    t_.step = j.value("step", t_.step);
  }
  return ev != "step";
}

void TrainerProcess::leave() {
  drop_warm();
  if (!running()) return;
  ::kill(-t_.pid, SIGTERM);
  for (int i = 0; i < 100 && !reap(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop();
}

void TrainerProcess::kill_group() {
  if (running()) ::kill(-t_.pid, SIGKILL);  // a warm interpreter waits on: kill-node's agent takes it along
}

void TrainerProcess::terminate() {
  if (!running()) return;
  ::kill(-t_.pid, SIGTERM);
  ::kill(-t_.pid, SIGCONT);  // a stopped process acts on it too
}

void TrainerProcess::inject(const std::string& fault) {
  if (!running()) return;
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
    if (vm <= 0 || ::prlimit(t_.pid, RLIMIT_AS, &lim, nullptr) != 0) log(name_, "oom: prlimit failed");
  }
}

nlohmann::json TrainerProcess::report() const {
  // A plain trainer is alive or not: silence is no sign of a hang.
  const int64_t age = t_.plain && running() ? 0 : ms_since(t_.last_progress);
  nlohmann::json t{{"restart", t_.restart}, {"phase", t_.phase}, {"pid", t_.pid}, {"step", t_.step},
                   {"progress_age_ms", age}, {"saves", t_.saves},
                   {"save_blocking_ns", t_.save_blocking_ns}, {"saved_step", t_.saved_step}, {"done", t_.done}};
  if (running()) t["stopped"] = process_stopped(t_.pid);
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
  return t;
}

}  // namespace goodput::agent
