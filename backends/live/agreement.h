// What the ranks of one restart agree on: functions of their trainers' latest reports, each
// returning the observation that agreement makes (or nothing). LiveMaster::advance() asks them in
// order after each report that changed something, and logs what they find; they read no clock.
//
// Asked after every report, a scan of the whole world would make each heartbeat cost O(world). So
// "does every rank agree" is asked through a Sweep, which remembers how far its last scan got: a
// world reaching a phase one report at a time costs O(world) in all, not per report. Only the
// answer that completes the agreement scans the world again (and is then exact).
//
// `gen` is the restart the world runs (RestartJob::restart): a report of an older restart agrees
// with nothing.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "backends/live/world.h"
#include "engine/checkpoint_manager.h"
#include "engine/event.h"
#include "engine/job_state.h"

namespace goodput::live {

using Ranks = std::vector<Node*>;

// Whether every rank satisfies a condition that, once met by a rank, usually stays met (a phase
// reached, a save made): the scan resumes at the rank that failed it last time, and a yes is
// confirmed by a scan of the whole world (a rank may have fallen back: its process exited). The
// context names the question (the world's epoch, the restart, the phase, the counts it depends
// on): another context starts from the first rank.
class Sweep {
 public:
  using Context = std::array<int64_t, 4>;
  template <class Pred> bool all(const Ranks& w, const Context& context, Pred pred) {
    return all_nodes(w, context, [&](const Node& n) { return pred(n.trainer); });
  }
  // The same, of a condition on the whole node (not only its trainer's report).
  template <class Pred> bool all_nodes(const Ranks& w, const Context& context, Pred pred) {
    if (context != context_) {
      context_ = context;
      next_ = 0;
    }
    while (next_ < w.size() && pred(*w[next_])) ++next_;
    if (next_ < w.size()) return false;
    for (size_t i = 0; i < w.size(); ++i)
      if (!pred(*w[i])) {
        next_ = i;
        return false;
      }
    return true;
  }

 private:
  Context context_{-1, -1, -1, -1};
  size_t next_ = 0;
};

// One sweep per question; `epoch` is World::epoch() of the ranks asked about.
struct Sweeps {
  int64_t epoch = 0;
  Sweep completed, persisted, phase, saved, replicated;
};

// Every rank reported its last step (done), whether or not its process is gone yet.
std::optional<JobFinished> completed(const Ranks& w, int32_t gen, Sweeps& sweeps);
// The newest step every rank has in storage, above `persisted` and no newer than the newest save
// the log knows (`saved`).
std::optional<CheckpointPersisted> persisted(const Ranks& w, int64_t persisted, int64_t saved, Sweeps& sweeps);
// The newest save the log knows (`saved`, newer than `replicated`), once every rank's copies of it
// are in the memory of every holder `placement` names for its node (as the holders' agents report
// them). `groups`: the layout, for the ranks each node's processes have.
std::optional<ReplicaStored> replicated(const Ranks& w, const std::vector<ReplicaGroup>& groups,
                                        const ReplicaPlacement& placement, int64_t replicated, int64_t saved, Sweeps& sweeps);
// Of the ranks whose trainer exited without finishing, the one that looks like the cause (a signal
// over an exit code, an out-of-memory reason, then the earliest); null: none exited. `w` may be
// only the ranks whose trainers reported an exit (by rank), which is what LiveMaster passes.
Node* exit_culprit(const Ranks& w, int32_t gen);
// Hung: some rank alive but without progress for hang_timeout. One hung rank stalls them all
// (collectives wait for it), so the culprit is a stopped process if there is one, else the one
// silent longest; null: not hung.
Node* hang_culprit(const Ranks& w, int32_t gen, Time now, Duration hang_timeout);
// The world reached the next phase of its restart: processes started (all at least starting, once
// the backoff ran out), rendezvous complete, or the checkpoint loaded (the oldest step any rank
// loaded, the slowest tier and load time).
std::optional<EventPayload> phase_reached(Phase phase, const Ranks& w, int32_t gen, Time now, Time run_at,
                                          int32_t world_size, Sweeps& sweeps);
// Saves every rank made since the log's last count (`logged_saves`, with `logged_blocking` ns of
// blocking behind them), as one CheckpointSaved of the newest step all hold, under the plan.
std::optional<CheckpointSaved> saved(const Ranks& w, int32_t gen, int64_t logged_saves, int64_t logged_blocking,
                                     const CheckpointPlanSet& plan, Sweeps& sweeps);

}  // namespace goodput::live
