// The timeline of a job, built from its events alongside the fold, and already reduced to what a
// page can draw: at most `buckets` phase intervals and progress points however long the log is,
// and a bounded number of node lanes (the nodes that something happened to).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/event_store.h"
#include "engine/job_state.h"

namespace goodput {

struct Timeline {
  struct Span {
    Time start, end;
    Phase phase;
  };
  struct Point {
    Time t;
    Duration progress;  // kept progress (full-job ns)
    Duration lost;      // cumulative recompute
    int32_t nodes_held;
  };
  struct Marker {
    Time t;
    std::string kind;   // "failure", "restart", "scale", "checkpoint_memory", "checkpoint_storage", "persist"
    std::string label;  // e.g. "hardware_error: Faulty GPU on n17 -> relaunch_node"
    int64_t count = 1;  // markers folded into one
  };
  struct NodeSpan {
    Time start, end;
    std::string state;  // "held", "down"
  };
  struct Lane {
    int32_t node;
    std::string name;
    int32_t failures = 0;
    std::vector<NodeSpan> spans;
    std::vector<Marker> markers;
  };
  Time start = 0, end = 0;
  std::vector<Span> phases;
  std::vector<Point> progress;
  std::vector<Marker> markers;
  std::vector<Lane> lanes;
  int32_t lanes_omitted = 0;  // nodes with incidents not drawn
};

class TimelineBuilder {
 public:
  explicit TimelineBuilder(int buckets = 1500, int max_lanes = 24) : buckets_(buckets), max_lanes_(max_lanes) {}
  // REQUIRES: `after` is the state with `e` already applied.
  void add(const Event& e, const JobState& after);
  Timeline finish(const JobState& final_state);

 private:
  struct NodeLog {
    std::string name;
    int32_t failures = 0;
    bool initial = false;
    bool released = false;  // an operator's scale took it out of the job
    std::vector<Timeline::NodeSpan> spans;
    std::vector<Timeline::Marker> markers;
    Time held_since = -1;
    std::string pending_failure;  // the failure text awaiting its decision
  };
  int buckets_;
  int max_lanes_;
  std::vector<Timeline::Span> phases_;
  std::vector<Timeline::Point> points_;
  std::vector<Timeline::Marker> markers_;
  std::map<NodeId, NodeLog> nodes_;  // keyed by id: ids in a log may be sparse, huge or negative
  Phase last_phase_ = Phase::NotStarted;
  Time phase_since_ = 0;
  bool any_ = false;
};

// An event sink that folds what it sees and builds the timeline as it goes.
class TimelineSink final : public EventSink {
 public:
  void append(const Event& e) override {
    state.apply(e);
    builder.add(e, state);
  }
  Timeline finish() { return builder.finish(state); }
  JobState state;
  TimelineBuilder builder;
};

}  // namespace goodput
