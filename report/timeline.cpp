#include "report/timeline.h"

#include <algorithm>
#include <map>

#include "engine/event_json.h"

namespace goodput {

void TimelineBuilder::add(const Event& e, const JobState& s) {
  if (!any_) {
    any_ = true;
    phase_since_ = e.time;
  }
  std::visit(
      [&](const auto& p) {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, NodeJoined>) {
          NodeLog& n = nodes_[p.node];
          n.name = p.name;
          if (s.restart_jobs() == 0) n.initial = true;  // part of the first world
          if (n.held_since < 0) n.held_since = e.time;
        } else if constexpr (std::is_same_v<T, FailureObserved>) {
          NodeLog& n = nodes_[p.node];
          ++n.failures;
          n.pending_failure =
              std::string(to_string(p.kind)) + (p.reason.empty() ? "" : ": " + p.reason);
        } else if constexpr (std::is_same_v<T, RecoveryDecided>) {
          NodeLog& n = nodes_[p.node];
          const std::string label = std::string(to_string(p.diagnosis)) + " (" +
                                    n.pending_failure + ") on " +
                                    (n.name.empty() ? "node " + std::to_string(p.node) : n.name) + " -> " +
                                    std::string(to_string(p.action));
          markers_.push_back({e.time, "failure", label, 1});
          n.markers.push_back({e.time, "failure", label, 1});
          if (p.action == RecoveryAction::RelaunchNode || p.action == RecoveryAction::RelaunchWithMoreMemory) {
            if (n.held_since >= 0) n.spans.push_back({n.held_since, e.time, "held"});
            n.held_since = -1;
          }
        } else if constexpr (std::is_same_v<T, RestartJob>) {
          if (p.restart > 0)
            markers_.push_back({e.time, "restart", "restart " + std::to_string(p.restart) + ": " +
                                                       std::to_string(p.world_size) + " nodes from step " +
                                                       std::to_string(p.restore_step) + " (" +
                                                       std::string(to_string(p.restore_tier)) + ")", 1});
        } else if constexpr (std::is_same_v<T, ScaleDecided>) {
          markers_.push_back({e.time, "scale",
                              (p.group.empty() ? "scale " : "scale (" + p.group + ") ") + std::to_string(p.from) + " -> " +
                                  std::to_string(p.to) + ": " + p.reason,
                              1});
          for (NodeId id : p.released) {  // out of the job: its lane ends here
            NodeLog& n = nodes_[id];
            if (n.held_since >= 0) n.spans.push_back({n.held_since, e.time, "held"});
            n.held_since = -1;
            n.released = true;
            n.markers.push_back({e.time, "scale", "released: the " + p.group + " group shrank", 1});
          }
        } else if constexpr (std::is_same_v<T, CheckpointSaved>) {
          markers_.push_back({e.time, p.tier == Tier::Memory ? "checkpoint_memory" : "checkpoint_storage",
                              std::to_string(p.count) + " checkpoint(s) to " + std::string(to_string(p.tier)) +
                                  ", newest step " + std::to_string(p.step),
                              p.count});
        } else if constexpr (std::is_same_v<T, CheckpointPersisted>) {
          markers_.push_back({e.time, "persist", std::to_string(p.count) + " persisted, newest step " + std::to_string(p.step),
                              p.count});
        }
      },
      e.payload);
  const Phase ph = s.phase();
  if (ph != last_phase_) {
    if (e.time > phase_since_ && last_phase_ != Phase::NotStarted) phases_.push_back({phase_since_, e.time, last_phase_});
    last_phase_ = ph;
    phase_since_ = e.time;
  }
  if (points_.empty() || points_.back().progress != s.productive() || points_.back().nodes_held != s.nodes_held() ||
      points_.back().lost != s.loss(Loss::Recompute))
    points_.push_back({e.time, s.productive(), s.loss(Loss::Recompute), s.nodes_held()});
}

Timeline TimelineBuilder::finish(const JobState& s) {
  Timeline t;
  t.start = s.start_time();
  t.end = std::max(s.now(), t.start + 1);
  if (s.now() > phase_since_ && last_phase_ != Phase::NotStarted && last_phase_ != Phase::Finished)
    phases_.push_back({phase_since_, s.now(), last_phase_});
  const Duration bucket = std::max<Duration>(1, (t.end - t.start) / std::max(buckets_, 1));
  auto bucket_of = [&](Time x) { return (x - t.start) / bucket; };

  // Phases: spans shorter than a bucket are merged; each bucket shows its longest phase.
  for (const auto& sp : phases_) {
    if (!t.phases.empty() && bucket_of(sp.start) == bucket_of(t.phases.back().end - 1) && sp.end - sp.start < bucket) {
      // Too short to see: extend the previous span unless this phase dominates the bucket.
      if (t.phases.back().phase == sp.phase || t.phases.back().end - t.phases.back().start >= sp.end - sp.start) {
        t.phases.back().end = sp.end;
        continue;
      }
    }
    if (!t.phases.empty() && t.phases.back().phase == sp.phase && t.phases.back().end == sp.start) {
      t.phases.back().end = sp.end;
      continue;
    }
    t.phases.push_back(sp);
  }
  // Progress: per bucket, the lowest and the last point (a rollback shows as a drop).
  for (size_t i = 0; i < points_.size(); ++i) {
    const auto& p = points_[i];
    if (!t.progress.empty() && bucket_of(t.progress.back().t) == bucket_of(p.t) && i + 1 < points_.size() &&
        bucket_of(points_[i + 1].t) == bucket_of(p.t) && p.progress >= t.progress.back().progress)
      continue;
    t.progress.push_back(p);
  }
  t.progress.push_back({s.now(), s.productive(), s.loss(Loss::Recompute), s.nodes_held()});
  // Markers: checkpoint ticks folded per bucket and kind; failures, restarts, scale changes kept.
  std::map<std::pair<int64_t, std::string>, size_t> folded;
  for (const auto& m : markers_) {
    if (m.kind == "failure" || m.kind == "restart" || m.kind == "scale") {
      t.markers.push_back(m);
      continue;
    }
    const auto key = std::make_pair(bucket_of(m.t), m.kind);
    auto it = folded.find(key);
    if (it == folded.end()) {
      folded[key] = t.markers.size();
      t.markers.push_back(m);
    } else {
      Timeline::Marker& f = t.markers[it->second];
      f.count += m.count;
      f.t = m.t;
      f.label = std::to_string(f.count) + (m.kind == "persist" ? " persisted" : " checkpoints") + " in this stretch";
    }
  }
  // Lanes: nodes something happened to (a failure, a join after the start, a release), most failures first.
  std::vector<NodeId> order;
  for (const auto& [id, n] : nodes_)
    if (n.failures > 0 || n.released || (!n.initial && !n.name.empty())) order.push_back(id);
  std::stable_sort(order.begin(), order.end(), [&](NodeId a, NodeId b) { return nodes_.at(a).failures > nodes_.at(b).failures; });
  for (size_t k = 0; k < order.size(); ++k) {
    if (static_cast<int>(k) >= max_lanes_) {
      t.lanes_omitted = static_cast<int32_t>(order.size() - k);
      break;
    }
    NodeLog& n = nodes_[order[k]];
    Timeline::Lane lane;
    lane.node = order[k];
    lane.name = n.name.empty() ? "node " + std::to_string(order[k]) : n.name;
    lane.failures = n.failures;
    lane.spans = n.spans;
    if (n.held_since >= 0) lane.spans.push_back({n.held_since, s.now(), "held"});
    lane.markers = n.markers;
    t.lanes.push_back(std::move(lane));
  }
  std::sort(t.lanes.begin(), t.lanes.end(), [](const Timeline::Lane& a, const Timeline::Lane& b) {
    return a.node < b.node;
  });
  return t;
}

}  // namespace goodput
