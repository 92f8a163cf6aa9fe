// A recorded event log is a trace: the failures it observed, when progress stopped for each, the
// nodes that came back, and a cost model measured from the log itself (medians of how long
// restarts, rendezvous, loads, placements and detection took). Replaying it under another policy
// answers "what would that policy have done with this run".
#include <algorithm>
#include <map>
#include <optional>

#include "sim/from_log.h"

namespace goodput {
namespace {

Duration median(std::vector<Duration> v, Duration fallback) {
  if (v.empty()) return fallback;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : v[n / 2 - 1] + (v[n / 2] - v[n / 2 - 1]) / 2;  // two samples: their mean
}

}  // namespace

Trace trace_from_log(const EventStore& log, const std::string& name, int64_t* checks_left_out) {
  Trace t;
  t.name = "replay of " + name;
  t.source = "recorded by goodput in " + name;
  t.path = name;
  bool started = false, first_world_done = false;
  Time start = 0, end = 0;
  std::map<NodeId, int32_t> machine;  // log node id -> trace machine index
  std::vector<NodeId> later;          // nodes first seen after the first world, in order
  std::map<NodeId, int32_t> initial_slot;
  std::vector<Duration> restart, rendezvous, scheduling, exit_detect, heartbeat, hang, repair, step_time;
  // The job's real speed: time per step between two checkpoints of one training segment.
  std::optional<std::pair<Time, int64_t>> segment_save;  // (time, step) of the last save, if training since
  // Over segments without a stall or a slowdown in them (the trace replays those apart): the
  // time and steps in all, so that the replay makes the same progress in the same time (a median
  // of segments would leave out the slower first one, the trainers' warm-up).
  Duration clean_time = 0;
  int64_t clean_steps = 0;
  bool tainted = false;
  std::map<NodeId, Time> relaunched_at, failed_at;
  Time restart_at = -1, processes_at = -1;
  Duration restart_delay = 0;
  int32_t restart_number = 0;
  auto at = [](std::vector<Duration>& v, int32_t k) -> Duration& {
    if (static_cast<size_t>(k) >= v.size()) v.resize(static_cast<size_t>(k) + 1, -1);
    return v[k];
  };
  std::vector<std::pair<NodeId, TraceEvent>> raw;  // events with log node ids, mapped at the end
  std::map<NodeId, size_t> open_slowdown;           // node -> index in raw of its running slowdown

  log.for_each([&](const Event& e) {
    end = std::max(end, e.time);
    std::visit(
        [&](const auto& p) {
          using T = std::decay_t<decltype(p)>;
          if constexpr (std::is_same_v<T, JobStarted>) {
            started = true;
            start = e.time;
            t.cluster.nodes = p.nodes;
            t.cluster.accelerators_per_node = p.accelerators_per_node;
            t.job.name = p.job;
            t.job.step_time = p.step_time;
            t.job.total_steps = p.total_steps;
            t.job.checkpoint_bytes_per_node = p.checkpoint_bytes_per_node;
            t.job.memory_bandwidth_bytes_per_s = std::max<int64_t>(1, p.memory_bandwidth_bytes_per_s);
            t.job.storage_bandwidth_bytes_per_s = std::max<int64_t>(1, p.storage_bandwidth_bytes_per_s);
            if (p.network_bandwidth_bytes_per_s > 0) t.job.network_bandwidth_bytes_per_s = p.network_bandwidth_bytes_per_s;
          } else if constexpr (std::is_same_v<T, NodeJoined>) {
            if (!first_world_done && p.slot >= 0) {
              initial_slot[p.node] = p.slot;
              scheduling.push_back(e.time - start);
            } else if (!initial_slot.count(p.node) && std::find(later.begin(), later.end(), p.node) == later.end()) {
              later.push_back(p.node);
            }
            if (auto it = relaunched_at.find(p.node); it != relaunched_at.end()) relaunched_at.erase(it);
          } else if constexpr (std::is_same_v<T, RecoveryDecided>) {
            if (p.action == RecoveryAction::RelaunchNode || p.action == RecoveryAction::RelaunchWithMoreMemory)
              relaunched_at[p.node] = e.time;
          } else if constexpr (std::is_same_v<T, CheckpointSaved>) {
            if (segment_save && p.step > segment_save->second && p.count == 1) {
              const Duration d = e.time - segment_save->first - p.blocking;
              step_time.push_back(d / (p.step - segment_save->second));
              if (!tainted && open_slowdown.empty() && d > 0) {
                clean_time += d;
                clean_steps += p.step - segment_save->second;
              }
            }
            segment_save = {e.time, p.step};
            tainted = false;
          } else if constexpr (std::is_same_v<T, CheckpointLoaded>) {
            segment_save = {e.time, p.step};
            tainted = false;
          } else if constexpr (std::is_same_v<T, RestartJob>) {
            segment_save.reset();
            first_world_done = true;
            restart_at = e.time;
            restart_delay = p.delay;
            restart_number = p.restart;
          } else if constexpr (std::is_same_v<T, ProcessesStarted>) {
            if (restart_at >= 0) {
              restart.push_back(e.time - restart_at - restart_delay);
              if (restart_number >= 0 && restart_number < 1'000'000)
                at(t.job.measured_process_restart, restart_number) = restart.back();
            }
            processes_at = e.time;
          } else if constexpr (std::is_same_v<T, RendezvousComplete>) {
            if (processes_at >= 0) {
              rendezvous.push_back(e.time - processes_at);
              if (restart_number >= 0 && restart_number < 1'000'000)
                at(t.job.measured_rendezvous, restart_number) = rendezvous.back();
            }
          } else if constexpr (std::is_same_v<T, FailureObserved>) {
            segment_save.reset();
            if (p.reason == "node unreachable during restart") return;  // a consequence, not a cause
            TraceEvent te;
            te.t = std::max<Time>(0, std::min(p.stalled_since, e.time) - start);
            te.reason = p.reason;
            const Duration latency = e.time - std::min(p.stalled_since, e.time);
            switch (p.kind) {
              case FailureKind::ProcessExit:
                te.type = TraceEventType::ProcessCrash;
                te.exit_code = p.exit_code;
                te.signal = std::clamp(p.signal, 0, 128);
                exit_detect.push_back(latency);
                break;
              case FailureKind::NodeLost:
                te.type = TraceEventType::NodeFailure;
                heartbeat.push_back(latency);
                failed_at[p.node] = e.time - latency;
                break;
              case FailureKind::Hang:
                te.type = TraceEventType::Hang;
                hang.push_back(latency);
                break;
              case FailureKind::Maintenance:
                te.type = TraceEventType::Maintenance;
                failed_at[p.node] = e.time - latency;
                break;
            }
            raw.emplace_back(p.node, te);
          } else if constexpr (std::is_same_v<T, SlowdownObserved>) {
            tainted = true;
            if (p.slowdown_permille > 1000) {
              TraceEvent te;
              te.t = e.time - start;
              te.type = TraceEventType::Slowdown;
              te.slowdown_permille = p.slowdown_permille;
              open_slowdown[p.node] = raw.size();
              raw.emplace_back(p.node, te);
            } else if (auto it = open_slowdown.find(p.node); it != open_slowdown.end()) {
              raw[it->second].second.duration = e.time - start - raw[it->second].second.t;
              open_slowdown.erase(it);
            }
          } else if constexpr (std::is_same_v<T, StallObserved>) {
            tainted = true;
            if (p.resumed) {  // a stall that ended by itself replays as a pause of its length
              TraceEvent te;
              te.t = std::max<Time>(0, std::min(p.stalled_since, e.time) - start);
              te.type = TraceEventType::Pause;
              te.duration = std::max<Duration>(e.time - std::min(p.stalled_since, e.time), kMicrosecond);
              te.reason = p.reason;
              raw.emplace_back(p.node, te);
            }
          } else if constexpr (std::is_same_v<T, CheckRequested>) {
            if (checks_left_out && !p.waiting) ++*checks_left_out;
          } else if constexpr (std::is_same_v<T, ScaleRequested>) {
            TraceEvent te;  // the job's, not a node's: no machine to map
            te.t = std::max<Time>(0, e.time - start);
            te.type = TraceEventType::Scale;
            te.group = p.group;
            te.from = std::max(0, p.from);
            te.to = std::max(1, p.to);
            te.reason = p.reason;
            t.events.push_back(te);
          } else if constexpr (std::is_same_v<T, NodeReturned>) {
            if (auto it = failed_at.find(p.node); it != failed_at.end()) {
              repair.push_back(e.time - it->second);
              failed_at.erase(it);
            }
          }
        },
        e.payload);
  });
  if (!started) throw TraceError(name + ": the log has no job_started event");
  // Machines: the first world's nodes by slot, then every node that joined later or as a spare
  // (slot -1: the job spec's spares), as spares.
  for (const auto& [node, slot] : initial_slot) machine[node] = slot;
  t.cluster.spare_nodes = static_cast<int32_t>(later.size());
  for (size_t i = 0; i < later.size(); ++i) machine[later[i]] = t.cluster.nodes + static_cast<int32_t>(i);
  for (auto& [node, te] : raw) {
    auto it = machine.find(node);
    if (it == machine.end()) continue;  // a node the log never saw join
    te.node = it->second;
    t.events.push_back(te);
  }
  std::stable_sort(t.events.begin(), t.events.end(), [](const TraceEvent& a, const TraceEvent& b) { return a.t < b.t; });
  // Trace times are read to the microsecond.
  for (auto& e : t.events) e.t = e.t / kMicrosecond * kMicrosecond;
  const JobSpec d;
  t.job.duration = std::max<Duration>(end - start, kMicrosecond);
  t.job.node_scheduling = median(scheduling, d.node_scheduling);
  t.job.process_restart = median(restart, d.process_restart);
  // A live log measured its steps; a simulated one has them exactly (the same value comes back).
  if (step_time.size() >= 2)
    t.job.step_time = std::max<Duration>(clean_steps > 0 ? clean_time / clean_steps : median(step_time, t.job.step_time), 1);
  t.job.rendezvous = median(rendezvous, d.rendezvous);
  t.job.exit_detection = median(exit_detect, d.exit_detection);
  t.job.heartbeat_timeout = median(heartbeat, d.heartbeat_timeout);
  t.job.hang_timeout = median(hang, d.hang_timeout);
  t.cluster.repair_time = median(repair, t.cluster.repair_time);
  return t;
}

}  // namespace goodput
