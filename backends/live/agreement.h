// What the ranks of one restart agree on: pure functions of their trainers' latest reports, each
// returning the observation that agreement makes (or nothing). LiveMaster::advance() asks them in
// order and logs what they find; they read no clock and keep no state of their own.
//
// `gen` is the restart the world runs (RestartJob::restart): a report of an older restart agrees
// with nothing.
#pragma once

#include <optional>
#include <vector>

#include "backends/live/world.h"
#include "engine/event.h"
#include "engine/job_state.h"

namespace goodput::live {

using Ranks = std::vector<Node*>;

// Every rank reported its last step (done), whether or not its process is gone yet.
std::optional<JobFinished> completed(const Ranks& w, int32_t gen);
// The newest step every rank has in storage, above `persisted` and no newer than the newest save
// the log knows (`saved`).
std::optional<CheckpointPersisted> persisted(const Ranks& w, int64_t persisted, int64_t saved);
// Of the ranks whose trainer exited without finishing, the one that looks like the cause (a signal
// over an exit code, an out-of-memory reason, then the earliest); null: none exited.
Node* exit_culprit(const Ranks& w, int32_t gen);
// Hung: some rank alive but without progress for hang_timeout. One hung rank stalls them all
// (collectives wait for it), so the culprit is a stopped process if there is one, else the one
// silent longest; null: not hung.
Node* hang_culprit(const Ranks& w, int32_t gen, Time now, Duration hang_timeout);
// The world reached the next phase of its restart: processes started (all at least starting, once
// the backoff ran out), rendezvous complete, or the checkpoint loaded (the oldest step any rank
// loaded, the slowest tier and load time).
std::optional<EventPayload> phase_reached(Phase phase, const Ranks& w, int32_t gen, Time now, Time run_at,
                                          int32_t world_size);
// Saves every rank made since the log's last count (`logged_saves`, with `logged_blocking` ns of
// blocking behind them), as one CheckpointSaved of the newest step all hold, under the plan.
std::optional<CheckpointSaved> saved(const Ranks& w, int32_t gen, int64_t logged_saves, int64_t logged_blocking,
                                     const CheckpointPlanSet& plan);

}  // namespace goodput::live
