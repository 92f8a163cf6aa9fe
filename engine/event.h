// Events are the truth: every observation of the job and every decision about it is one of these
// plain structs, stamped with a sequence number and a time. JobState is a fold over them, the event
// log stores them, and a recorded log replays in the simulator.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/time.h"

namespace goodput {

using NodeId = int32_t;  // index of a machine, stable for the whole job (names live in NodeJoined)

// What the backend saw, before any diagnosis.
enum class FailureKind : uint8_t { ProcessExit, NodeLost, Hang, Maintenance };
// What the recovery policy concluded.
// Straggler: the node works but slows the whole synchronous job down. ConfigurationError: the job
// as given cannot run (its command does not exist or cannot execute, its script does not import):
// no restart or relaunch can fix that.
enum class Diagnosis : uint8_t {
  SoftwareError, HardwareError, OutOfMemory, Preemption, Unknown, Straggler, ConfigurationError
};
enum class RecoveryAction : uint8_t { RestartProcess, RelaunchNode, RelaunchWithMoreMemory, GiveUp };
// Where a checkpoint lives. None: a fresh start, nothing to load. Peer: a copy of a node's memory
// checkpoint in other nodes' host memory (checkpoint.replicas), what a relaunched node restores from.
enum class Tier : uint8_t { None, Memory, Storage, Peer };
constexpr int kTierCount = 4;

constexpr int kDiagnosisCount = 7;
constexpr int kRecoveryActionCount = 4;

// ---- observations -------------------------------------------------------------------------------

// First event of every log: the job and the cost model it runs under (sizes, bandwidths).
struct JobStarted {
  std::string job;
  int32_t nodes = 0;                  // target world size, in nodes
  int32_t accelerators_per_node = 0;
  Duration step_time = 0;             // one training step at full size, no slowdown
  int64_t total_steps = 0;            // 0: no step target (runs until the horizon or until stopped)
  int64_t checkpoint_bytes_per_node = 0;
  int64_t memory_bandwidth_bytes_per_s = 0;   // host-memory copy, per node
  int64_t storage_bandwidth_bytes_per_s = 0;  // persistent storage, per node
  std::string policy;                 // name of the policy set, for people
  int64_t network_bandwidth_bytes_per_s = 0;  // to another node's host memory, per node (0: not given)
};

// A machine is up and holds rank slot `slot` of the job (-1: it joined as a spare). A job with
// replica groups names the type it was launched as: it only ever takes slots of that type.
struct NodeJoined {
  NodeId node = 0;
  int32_t slot = 0;
  std::string name;
  std::string replica_type;  // empty: any slot
};

// Something went wrong on a node. `stalled_since` is when the job stopped making progress because
// of it (<= the event's time; detection latency is the difference).
struct FailureObserved {
  NodeId node = 0;
  FailureKind kind = FailureKind::ProcessExit;
  int32_t exit_code = 0;
  int32_t signal = 0;
  std::string reason;
  Time stalled_since = 0;
};

// No machine is free to take a relaunched node's slot: the slot waits.
struct NoSpareNode {
  int32_t slot = 0;
  // The slot is one the world cannot train without (a chief's or a parameter server's): giving
  // up a slot cannot stand in for it, only its replacement can.
  bool fixed = false;
};

// A repaired machine is back in the pool of spares.
struct NodeReturned {
  NodeId node = 0;
};

// A node runs slower than it should (1000 = normal speed, 2000 = half speed).
struct SlowdownObserved {
  NodeId node = 0;
  int32_t slowdown_permille = 1000;
};

// Trainer processes of the whole world are up (end of process restart).
struct ProcessesStarted {
  int32_t world_size = 0;
  int32_t restart = 0;
};

struct RendezvousComplete {
  int32_t world_size = 0;
  int32_t restart = 0;
};

// Training resumes from `step` (0 and Tier::None: from scratch).
struct CheckpointLoaded {
  int64_t step = 0;
  Tier tier = Tier::None;
  Duration load_time = 0;
};

// The trainer saved `count` checkpoints since the previous event, the newest at `step` (periodic
// saves are reported together, so a 54-day run is not 40,000 events). Each blocked training for
// `blocking` ns.
struct CheckpointSaved {
  int64_t step = 0;
  Tier tier = Tier::Memory;
  Duration blocking = 0;
  bool persist = false;  // the newest one is also being written to storage, asynchronously
  int64_t count = 1;
  bool replicate = false;  // the newest one is also being copied to peers (checkpoint.replicas), asynchronously
};

// Memory checkpoints reached storage: `count` of them since the previous event, the newest at `step`.
struct CheckpointPersisted {
  int64_t step = 0;
  int64_t count = 1;
};

// Memory checkpoints reached their peers (checkpoint.replicas): every rank's copy of `step` is in
// the host memory of the nodes the plan's placement names; `count` of them since the previous event.
struct ReplicaStored {
  int64_t step = 0;
  int64_t count = 1;
};

// Data shards (numbered 0..N-1, the master's dynamic sharding service). The trainer on `node`
// finished these shards and they are inside its checkpoint of `step`: a restore to an older step
// puts them back in the queue.
struct ShardsCompleted {
  NodeId node = 0;
  int64_t step = 0;
  std::vector<int64_t> shards;
};
// One round of a node's pre-flight check, with its evidence: the compute probe (a matrix product of
// known result, repeated for a fixed time) and the link probe to `peer` (bytes sent over TCP and
// acknowledged). verdict: "passed"; "suspect" (its link failed this round: it is paired again with a
// node that passed); "faulty" (a wrong product, or its link failed in both rounds); "straggler"
// (compute or link below the median of the checked nodes by the configured factor).
struct NodeChecked {
  NodeId node = 0;
  int32_t round = 1;
  NodeId peer = -1;  // the node its link was measured to; -1: none (a one-node job)
  int64_t compute_mflops = 0;
  bool compute_ok = true;
  int64_t link_mb_per_s = 0;
  bool link_ok = true;
  std::string verdict;
  std::string detail;  // the comparison that led to the verdict, in words and numbers
};

// The node provider saw a cluster object it runs the job on change status: a pod (phase, where it
// was scheduled, its containers' states), a Kubernetes node hosting one (ready or not, and why), a
// Ray job (PENDING, RUNNING, ...). For people and audits: nothing in the job's state follows from it;
// a failure it implies also comes as failure_observed.
struct StatusObserved {
  std::string object;  // "pod", "node", "ray_job"
  std::string name;
  std::string status;
};

// The job made no progress from `stalled_since` (the rank on `node` stopped advancing) and nothing was
// done about it: a pause that ended by itself (resumed: progress resumed at this event's time), or a
// hang that the job's spec says to leave alone (not resumed: it still is; a later stall_observed with
// resumed, or a failure, ends it). The time goes to the "stall" loss.
struct StallObserved {
  NodeId node = 0;
  Time stalled_since = 0;
  bool resumed = false;
  std::string reason;
};

// Requests to the agent API refused for a missing or wrong bearer token: `count` of them since the
// previous such event, the newest from `peer`. At most one a minute (and one before the job ends),
// so a flood of bad requests cannot grow the log; the token presented is never logged.
struct ApiRefused {
  std::string peer;
  int64_t count = 0;
  std::string reason;
};

// Someone asked to check these nodes again (an operator's `goodput check`, with the fault drill to
// play in each check, if any): training stops, each runs the pre-flight check, and the job restarts
// from its newest checkpoint once the whole world has a verdict. The time goes to restart.
struct CheckRequested {
  std::vector<NodeId> nodes;
  std::string fault;
  std::string reason;
  // Asked for while training with periodic checkpoints: it starts (a second check_requested, not
  // waiting) right after the first checkpoint newer than `after_step`, so nothing is recomputed.
  // Logged when asked, so a master that restarts meanwhile still carries it out.
  bool waiting = false;
  int64_t after_step = 0;
};

// An operator asked for `group` ("ps" or "worker") to go from `from` to `to` nodes. Growing adds
// slots at the group's end; shrinking releases the nodes named in `release` (the group's highest
// slots). Slots after the group move along with it, so ranks change: the job restarts and restores
// from storage, the one tier every new rank can read the old ranks' state from.
struct ScaleRequested {
  std::string group;
  int32_t from = 0;
  int32_t to = 0;
  std::vector<NodeId> release;
  std::string reason;
};

// The job's pool of warm spares (scaling.warm_spares) now holds `held` ready machines: placed,
// checked and idle, each able to take a lost node's slot at the cost of spare_activation. They count
// as accelerators the job holds.
struct SparesHeld {
  int32_t held = 0;
};

struct JobFinished {
  std::string reason;  // "completed", "horizon", "gave-up", "stopped"
  int64_t step = 0;
  // The job ended in the middle of a recovery (or while a fault was not yet noticed): the progress
  // since the checkpoint at (restore_step, restore_tier) was thrown away at the failure, whether
  // or not its load finished (a fresh start: step 0, Tier::None). The master fills these in from
  // the restore the recovery chose, or would choose. False: it ended training, nothing taken back.
  bool in_recovery = false;
  int64_t restore_step = 0;
  Tier restore_tier = Tier::None;
};

// ---- decisions -------------------------------------------------------------------------------------

struct RecoveryDecided {
  NodeId node = 0;
  Diagnosis diagnosis = Diagnosis::Unknown;
  RecoveryAction action = RecoveryAction::RestartProcess;
  int32_t attempt = 0;           // failures of this node so far, this one included
  Duration backoff = 0;          // wait before restarting
  int32_t memory_permille = 1000;  // memory limit of the relaunched node relative to the old one
  std::string rule;              // the diagnosis rule or escalation that led here
};

// The checkpoint plan: save every `every_steps` steps to `tier`; with Tier::Memory, every
// `persist_every`-th save is also written to storage in the background (0: never), and each save
// is copied to `replicas` other nodes' host memory in the background, a save finding the previous
// copy still under way skipping it. Placement "ring": slot s's copies go to slots s+1 .. s+replicas;
// "groups": slots form groups of replicas + 1 (the last takes the remainder) that hold each
// other's copies, as in Gemini (SOSP '23).
struct CheckpointPlanSet {
  int64_t every_steps = 0;
  Tier tier = Tier::Storage;
  int32_t persist_every = 0;
  std::string reason;
  int32_t replicas = 0;
  std::string placement;  // "ring" or "groups"; empty without replicas
};

// The training world goes from `from` to `to` nodes. Without a group it gives up or takes back
// vacant slots of the target (the elastic policy); with one, the job's target itself changes by
// to - from nodes of that replica group, and the nodes in `released` leave the job.
struct ScaleDecided {
  int32_t from = 0;
  int32_t to = 0;
  std::string reason;
  std::string group;
  std::vector<NodeId> released;
};

// The master handed these shards to the trainer on `node`, answering its request number
// `request` (counted per restart). Logged before the trainer hears of them, so a restarted master
// never hands a shard to two trainers, and a retried request gets the same shards back.
struct ShardsAssigned {
  NodeId node = 0;
  int64_t request = 0;
  std::vector<int64_t> shards;
  int32_t local_rank = 0;  // which of the node's trainer processes asked (each numbers its requests)
};
// Restart every trainer of the world; they restore `restore_step` from `restore_tier`.
struct RestartJob {
  int32_t world_size = 0;
  int32_t restart = 0;  // restart count, 0 for the first start
  Duration delay = 0;   // backoff before the processes start
  int64_t restore_step = 0;
  Tier restore_tier = Tier::None;
  // The trainers start warm (recovery.warm_start): interpreters started beforehand with the job's
  // imports done take the restart, so it costs the cost model's warm_restart, not process_restart.
  bool warm = false;
};

using EventPayload = std::variant<JobStarted, NodeJoined, FailureObserved, NoSpareNode, NodeReturned, SlowdownObserved,
                                  ProcessesStarted, RendezvousComplete, CheckpointLoaded, CheckpointSaved,
                                  CheckpointPersisted, JobFinished, RecoveryDecided, CheckpointPlanSet, ScaleDecided,
                                  RestartJob, ShardsCompleted, ShardsAssigned, NodeChecked, StatusObserved,
                                  CheckRequested, StallObserved, ApiRefused, ScaleRequested, SparesHeld,
                                  ReplicaStored>;

struct Event {
  uint64_t seq = 0;  // position in the log, from 1
  Time time = 0;
  EventPayload payload;
};

// Stable names, used in the log and in JSON.
std::string_view event_type_name(const EventPayload& payload);
std::string_view to_string(FailureKind v);
std::string_view to_string(Diagnosis v);
std::string_view to_string(RecoveryAction v);
std::string_view to_string(Tier v);

bool is_decision(const EventPayload& payload);

}  // namespace goodput
