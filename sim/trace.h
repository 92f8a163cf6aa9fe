// Traces: what a cluster did to a job, as JSON Lines. Line 1 is the header (cluster, job cost model,
// optional per-cause failure rates); every other line is one timed event. The schema is documented
// in traces/SCHEMA.md. The loader is strict: every error names the file, the line and the field.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/event.h"
#include "engine/time.h"

namespace goodput {

constexpr int kTraceVersion = 1;

struct TraceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct ClusterSpec {
  int32_t nodes = 0;  // the job's target world, n0 .. n{nodes-1}
  int32_t accelerators_per_node = 8;
  int32_t spare_nodes = 0;  // s0 .. s{spare_nodes-1}, free at the start
  Duration repair_time = 4 * kHour;  // a failed machine is back in the pool after this
  // A machine given back for repeated software errors (no hardware fault behind them) passes a
  // node check and is back in the pool after this, not after a repair.
  Duration check_time = 10 * kMinute;
  // Node-hours of running trainers the events were observed over, when that is not nodes x
  // duration (an imported history of many jobs, idle machines not counted); 0: nodes x duration.
  double node_hours = 0;
  // The size of the jobs an imported history's failures and exposure come from, when it is split
  // by job size (`trace import --split-by-size`); 0: `nodes`. `trace fit` gives MTBF by this size.
  int32_t job_nodes = 0;
};

struct JobSpec {
  std::string name = "job";
  Duration step_time = kSecond;
  int64_t total_steps = 0;  // 0: run until the horizon
  Duration duration = 0;    // the horizon: the replay stops here (wall time)
  int64_t checkpoint_bytes_per_node = 0;
  int64_t memory_bandwidth_bytes_per_s = 10'000'000'000;
  int64_t storage_bandwidth_bytes_per_s = 1'000'000'000;
  // One node's link to another node's host memory (checkpoint.replicas): 100 Gb/s by default, an
  // assumption (one 100G NIC per node, or a share of a faster one left to checkpoints).
  int64_t network_bandwidth_bytes_per_s = 12'500'000'000;
  Duration process_restart = 30 * kSecond;  // trainer processes up again
  // Trainer processes up again from warm interpreters (recovery.warm_start): what is left once the
  // interpreter start and the imports were done beforehand (the device context and the model are not).
  Duration warm_restart = 10 * kSecond;
  Duration node_scheduling = 2 * kMinute;   // a spare node placed and its agent up
  // A warm spare (scaling.warm_spares: placed, checked, image pulled, agent up) takes a slot.
  Duration spare_activation = 20 * kSecond;
  Duration rendezvous = 10 * kSecond;
  Duration exit_detection = 1 * kSecond;     // a process exit reaches the master
  Duration heartbeat_timeout = 30 * kSecond;  // a dead node is noticed
  Duration hang_timeout = 5 * kMinute;        // a hung job is noticed (tuned on traces/stalls-54d.jsonl)
  // Only in a trace made from a recorded log (`trace_from_log`), not in the file format: what
  // restart k of that run took to start its processes and to form its group (-1: not measured).
  // The simulator uses them for restart k, and the medians above otherwise, so a log replayed
  // with its own policy follows the recorded timeline.
  std::vector<Duration> measured_process_restart;
  std::vector<Duration> measured_rendezvous;
  // A warm restart (recovery.warm_start) costs warm_restart, unless the recorded run measured it.
  Duration process_start_of(int32_t restart, bool warm) const {
    return measured(measured_process_restart, restart, warm ? warm_restart : process_restart);
  }
  Duration rendezvous_of(int32_t restart) const { return measured(measured_rendezvous, restart, rendezvous); }

 private:
  static Duration measured(const std::vector<Duration>& v, int32_t k, Duration fallback) {
    return k >= 0 && static_cast<size_t>(k) < v.size() && v[k] >= 0 ? v[k] : fallback;
  }
};

// Pause: the job stops advancing for `duration` and then goes on by itself (a slow collective
// after a network flap, a storage stall); one longer than the hang timeout is taken for a hang.
// Scale: not a failure but an operator's request (`goodput scale`): replica group `group` goes
// from `from` to `to` nodes; the simulator releases the world's highest slots when it shrinks.
enum class TraceEventType : uint8_t { NodeFailure, ProcessCrash, Hang, Slowdown, Maintenance, NodeReturn, Pause, Scale };
std::string_view to_string(TraceEventType t);

struct TraceEvent {
  Time t = 0;
  TraceEventType type = TraceEventType::NodeFailure;
  int32_t node = -1;  // a machine (index into Trace::machine_names), or
  int32_t rank = -1;  // whichever machine holds this rank slot at time t
  std::string reason;
  int32_t exit_code = 1;
  int32_t signal = 0;
  int32_t slowdown_permille = 1000;
  Duration duration = 0;  // slowdown: how long (0: until the node leaves); pause: how long; failures: repair override
  // process_crash from running out of memory: the rank's process needs this much of its current
  // memory limit (1000 = as much); until its slot gets that much, it crashes again after every
  // restart, `duration` into training (default 10 min).
  int32_t memory_needed_permille = 0;
  std::string group;      // scale: the replica group, and its node count before and after
  int32_t from = 0;
  int32_t to = 0;
  int line = 0;           // in the file, for messages
};

// Failures per node-hour of one cause; `goodput sweep` and generative replays draw from these.
struct FailureRate {
  TraceEventType type = TraceEventType::NodeFailure;
  std::string reason;
  double per_node_hour = 0;
  int32_t exit_code = 1;
  Duration duration = 0;  // pause: how long each lasts
  // Fitted rates (`goodput trace fit`) say what they rest on: the events counted and the 95%
  // interval of the rate (-1: not given). For people; drawing uses per_node_hour alone.
  int64_t count = -1;
  double ci_lo = -1, ci_hi = -1;
};

struct Trace {
  int version = kTraceVersion;
  std::string name;
  std::string source;
  std::string path;  // where it was loaded from, for messages
  ClusterSpec cluster;
  JobSpec job;
  std::vector<FailureRate> rates;
  std::vector<TraceEvent> events;

  int32_t machines() const { return cluster.nodes + cluster.spare_nodes; }
  std::string machine_name(int32_t m) const;
  std::optional<int32_t> machine_index(std::string_view name) const;
  JobStarted job_started(const std::string& policy) const;
};

// Throws TraceError("FILE:LINE: field 'x': ...").
Trace load_trace(const std::string& path);
Trace parse_trace(const std::string& text, const std::string& name_for_errors);
// Canonical JSON Lines; parse_trace(write_trace(t)) == t.
std::string write_trace(const Trace& t);

// Draws failures from the trace's rates over its horizon: each cause is a Poisson process over the
// job's rank slots. Deterministic for a seed.
std::vector<TraceEvent> generate_failures(const Trace& t, uint64_t seed);

}  // namespace goodput
