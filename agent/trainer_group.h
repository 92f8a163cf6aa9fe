// The trainer processes of a node: one per local rank (torchrun's --nproc-per-node), each with its
// own files, its own flash checkpoint host (shared memory named by its global rank) and torchrun's
// environment. They live and die together, as under torchrun's agent: when one fails, its siblings
// are sent SIGTERM and, after a grace period, SIGKILL; the node's exit is the first failure (the
// root cause, named by local and global rank), the siblings' exits are collateral.
//
// report() is the node's heartbeat "trainer" object. For one process it is exactly that process's
// report; for several it is their aggregate (the least advanced phase and step, the slowest work,
// the steps every process can restore), with each process's own report under "ranks".
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/checkpoint_host.h"
#include "agent/trainer.h"

namespace goodput::agent {

class TrainerGroup {
 public:
  TrainerGroup(std::string node_name, std::string work_dir);

  // One restart's processes, as the master's "run" order gives them.
  struct Launch {
    int32_t restart = 0;
    int32_t node_rank = 0, nodes = 1;              // GROUP_RANK, GROUP_WORLD_SIZE
    int32_t nproc = 1, rank_base = 0, world = 1;   // LOCAL_WORLD_SIZE, local rank 0's RANK, WORLD_SIZE
    std::string role = "default";                  // ROLE_NAME
    int32_t role_rank_base = 0, role_world = 1;    // local rank 0's ROLE_RANK, ROLE_WORLD_SIZE
    std::vector<std::string> argv;
    std::vector<std::string> env;  // what every process gets; the per-process variables are added
    int64_t limit_mb = 0;          // each process's address-space limit
    bool plain = false;            // the trainers report no progress (TrainerProcess::start)
    std::vector<std::string> warm_preload;  // warm starts: what a warm interpreter imports (empty: off)
    ckpt::Options checkpoint;      // the job's; rank and world are set per process
    uint64_t checkpoint_bytes = 0;  // the node's, split evenly among its processes
  };
  // Starts the restart's processes (any still running are killed first). False: none could be started.
  bool start(const Launch& l);
  // Stops them for good (dump: their stacks first). Siblings of a failed process keep their grace.
  void stop(bool dump = false);
  void leave();  // the agent is leaving: SIGTERM to all, up to 2 s, then SIGKILL
  bool reap();   // true when the node's trainers just exited (the first failure, or all done), or a sibling did
  bool read_progress();
  // kill-process, hang, oom or dump-stacks; "FAULT@L" aims at local rank L (default 0; dump-stacks: all).
  void inject(const std::string& fault);
  void kill_group();  // SIGKILL to every process group at once (kill-node)

  nlohmann::json report() const;
  int32_t restart() const { return restart_; }
  bool exited() const { return exited_; }
  std::string persist_error() const;
  // Copies of each process's memory checkpoints in peers' memory: where they go (each process's
  // under its own rank), and why the newest copy failed (empty: none did).
  void replicate_to(const CheckpointHost::Replication& r);
  std::string replica_error() const;
  void drain_and_free();  // lets running persists finish, then frees the node's shared memory

 private:
  struct Process {
    std::unique_ptr<CheckpointHost> checkpoints;
    std::unique_ptr<TrainerProcess> trainer;
    int32_t rank = 0;
  };
  using Steady = std::chrono::steady_clock;
  Process& process(size_t local);  // made on first use: hosts outlive restarts
  nlohmann::json aggregate() const;

  std::string name_, work_dir_;
  std::vector<Process> procs_;
  size_t nproc_ = 1;  // the running restart's
  int32_t restart_ = -1;
  std::optional<size_t> root_;  // the local rank that failed first in this restart
  Steady::time_point kill_at_;  // its siblings' grace ends
  bool exited_ = false;
};

}  // namespace goodput::agent
