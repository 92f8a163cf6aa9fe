#include "backends/live/failure_watch.h"

#include <algorithm>

namespace goodput::live {

void FailureWatch::fold(const StallObserved& s) {
  if (s.resumed) stall_.reset();
  else stall_ = s;
  pause_.reset();
}

void FailureWatch::restarted() {
  settle_from_.reset();
  stall_.reset();
  pause_.reset();
}

bool FailureWatch::settled(const Ranks& w, Time now) const {
  // A rank whose agent has not been heard from since the first exit may be the cause itself (its
  // machine died and took the agent with it; the backend or the heartbeat timeout will say so):
  // wait for it, so the ranks its death broke are not blamed first. A rank still alive reports
  // within a heartbeat interval.
  if (now < *settle_from_ + spec_.failure_settle) return false;
  return std::none_of(w.begin(), w.end(), [&](const Node* n) {
    return !n->trainer.exited && n->last_heartbeat < *settle_from_ && now - n->last_heartbeat <= spec_.heartbeat_timeout;
  });
}

FailureWatch::Notice FailureWatch::notice(const Ranks& w, const Ranks& exits, int32_t gen, Phase phase, Time now,
                                          bool timers) {
  using Kind = Notice::Kind;
  if (settle_from_ && !timers) return {Kind::Wait, std::nullopt};  // settling: the tick says when it is done
  if (const Node* culprit = exit_culprit(exits, gen)) {
    if (!settle_from_) settle_from_ = now;
    if (!settled(w, now)) return {Kind::Wait, std::nullopt};
    settle_from_.reset();
    const Trainer& t = culprit->trainer;
    return {Kind::Observe, FailureObserved{culprit->id, FailureKind::ProcessExit, t.exit_code, t.exit_signal, t.exit_reason,
                                           std::min(t.exited_at, now)}};
  }
  settle_from_.reset();
  if (phase == Phase::Restart || !timers) return {};
  const Node* hung = hang_culprit(w, gen, now, spec_.hang_timeout);
  auto silence = [&](const Trainer& t) {
    const std::string which = t.quietest_process();  // on a node of several processes
    return "no progress for " + format_duration(now - t.last_progress) + " at step " + std::to_string(t.step) +
           (t.stopped ? " (process stopped" + (which.empty() ? "" : ": " + which) + ")"
                      : (which.empty() ? "" : " (quietest: " + which + ")"));
  };
  if (spec_.hang_action == JobSpec::HangAction::Report) {
    // Left alone: say so once, with every trainer's stacks, and say when it moves again.
    if (hung && !stall_)
      return {Kind::Observe,
              StallObserved{hung->id, hung->trainer.last_progress, false, silence(hung->trainer) + "; left alone (hang_action report)"},
              true};
    if (!hung && stall_) return {Kind::Observe, StallObserved{stall_->node, stall_->stalled_since, true, "progress resumed"}};
    hung = nullptr;
  }
  if (hung)
    return {Kind::Observe,
            FailureObserved{hung->id, FailureKind::Hang, 0, 0, silence(hung->trainer), hung->trainer.last_progress}};
  if (stall_ || phase != Phase::Training) return {};
  // A pause: no rank advanced for stall_after (the ranks wait on each other, so the job is silent
  // as one). Logged when it moves again, as a stall from its start, with the rank that fell silent
  // first; one that lasts to hang_timeout is a hang instead. Moving again means a new step (report
  // times jitter by a millisecond from one heartbeat to the next).
  Time newest = 0;
  int64_t step = 0;
  const Node* first = nullptr;
  for (const Node* n : w) {
    newest = std::max(newest, n->trainer.last_progress);
    step = std::max(step, n->trainer.step);
    if (!first || n->trainer.last_progress < first->trainer.last_progress) first = n;
  }
  if (!pause_ && now - newest >= spec_.stall_after_or_default()) {
    pause_ = StallObserved{first->id, newest, true, ""};
    pause_step_ = step;
  } else if (pause_ && step > pause_step_) {
    StallObserved p = *pause_;
    pause_.reset();
    p.reason = "no progress for " + format_duration(now - p.stalled_since) + " at step " + std::to_string(pause_step_) +
               ", then moving again";
    return {Kind::Observe, std::move(p)};
  }
  return {};
}

}  // namespace goodput::live
