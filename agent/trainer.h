// Trainer supervision on a node: one trainer process (trainer_group.h runs one per local rank), started with the environment the agent built
// (in its own process group, killed with the agent, under a memory limit), watched through its
// progress file (phases, steps, saves, CPU work per step), reaped with its exit status and the
// reason its error file or stderr gives, stopped (its stacks dumped first when it hung), and the
// target of injected faults. It knows nothing of the master: the agent turns report() into the
// heartbeat and the master's answers into start() and stop().
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace goodput::agent {

class TrainerProcess {
 public:
  // saved: called with each checkpoint the trainer commits (persist: it asks for it to be
  // persisted), and with persist when it exits (persist on failure).
  // file_tag: added to its files' names, to tell a node's processes apart ("-l1"; "" for one process).
  TrainerProcess(std::string node_name, std::string work_dir, std::string file_tag, std::function<void(bool persist)> saved);
  ~TrainerProcess() { drop_warm(); }
  TrainerProcess(const TrainerProcess&) = delete;
  TrainerProcess& operator=(const TrainerProcess&) = delete;

  struct Files {
    std::string progress, log, err, error;  // progress reports, stdout, stderr, torchelastic error file
  };
  // The files of a restart's trainer, the old progress and error files removed.
  Files prepare(int32_t restart) const;
  // Starts argv with env (the previous trainer must be stopped). False: it could not be (logged).
  // plain: a trainer that reports nothing (an unmodified torchrun script): it counts as training
  // while it runs (never hung by silence) and as done when it exits with code 0, as torchrun judges it.
  bool start(int32_t restart, int32_t rank, int32_t world, const Files& files, std::vector<std::string> argv,
             std::vector<std::string> env, int64_t limit_mb, bool plain = false);
  // Warm starts (the policy's recovery.warm_start): once a trainer trains, an interpreter is
  // started for the next restart (`python3 -m goodput.warm PRELOAD...`, with that trainer's
  // environment and memory limit, idle in its own process group); the next start() hands it the
  // restart's orders instead of forking, when the command is `PYTHON SCRIPT ...` or `PYTHON -m
  // MODULE ...` with the same interpreter, limit and import-time environment (PATH, PYTHON*, LD_*,
  // CUDA_*, OMP_*, MKL_*, TORCH_*); otherwise it starts cold and says why. Empty: no warm starts.
  void set_warm(std::vector<std::string> preload);
  // Stops it for good (SIGKILL to its process group); dump: its stacks first, to diagnose a hang.
  void stop(bool dump = false);
  // The agent is leaving: SIGTERM, up to 2 s to exit, then stop().
  void leave();
  bool reap();           // true when the trainer just exited
  bool read_progress();  // true when it reported something the master should hear now
  void inject(const std::string& fault);  // kill-process, hang, oom or dump-stacks
  void kill_group();     // SIGKILL to its process group at once (kill-node)
  void terminate();      // SIGTERM to its process group (a sibling failed); reap() sees it go

  // The heartbeat's "trainer" object: restart, phase, pid, step, progress age, saves, done, what it
  // loaded, loss, the work window's median and MAD, and how it exited.
  nlohmann::json report() const;
  int32_t restart() const { return t_.restart; }
  bool exited() const { return t_.exited; }
  // Exited, and not because its work was done: a failure of the node.
  bool failed() const { return t_.exited && !(t_.code == 0 && t_.done); }
  bool running() const { return t_.pid > 0 && !t_.exited; }

 private:
  using Steady = std::chrono::steady_clock;
  struct State {
    pid_t pid = -1;
    int32_t restart = -1;
    Files files;
    off_t progress_offset = 0;
    std::string partial_line;
    std::string phase = "none";
    int64_t step = 0;
    Steady::time_point last_progress = Steady::now();
    int64_t saves = 0, save_blocking_ns = 0, saved_step = -1;
    std::optional<nlohmann::json> loaded;
    std::optional<double> loss;
    std::vector<double> work;  // CPU seconds per step, the last kWorkWindow steps
    bool exited = false, done = false;
    bool plain = false;  // it reports no progress: judged by its process alone
    bool warm = false;   // it runs in a warm interpreter (set_warm)
    int32_t code = 0, signal = 0;
    std::string reason;
    Steady::time_point exited_at;
    int stack_signal = 0;  // the trainer dumps its own stacks on this signal (goodput.live: SIGUSR1)
  };
  struct LastStart {  // what a warm interpreter for the next restart is made like
    std::string interpreter;
    std::vector<std::string> env;
    int64_t limit_mb = 0;
  };
  struct Warm {
    pid_t pid = -1;
    int fd = -1;     // its standard input: the orders go there
    LastStart like;  // the start it was made like
  };
  void spawn_warm();
  void drop_warm();
  std::string warm_unfit(const std::vector<std::string>& argv, const std::vector<std::string>& env, int64_t limit_mb);
  bool hand_over(const std::vector<std::string>& argv, const std::vector<std::string>& env, const Files& files);
  bool on_progress(const std::string& line);
  void dump_stacks(bool wake);
  void dump_native_stacks();

  std::string name_;
  std::string work_dir_;
  std::string file_tag_;
  std::function<void(bool persist)> saved_;
  State t_;
  std::vector<std::string> preload_;  // warm starts: the modules a warm interpreter imports (empty: off)
  Warm warm_;
  bool warm_failed_ = false;  // one exited before its restart: none again
  LastStart last_;
};

}  // namespace goodput::agent
