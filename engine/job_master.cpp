#include "engine/job_master.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>

namespace goodput {

JobMaster::JobMaster(PolicySet policies, const Clock& clock, Backend& backend, std::vector<EventSink*> sinks,
                     Options options)
    : policies_(std::move(policies)), clock_(clock), backend_(backend), sinks_(std::move(sinks)), options_(options) {}

void JobMaster::resume_from(const EventStore& store) {
  store.for_each([&](const Event& e) { state_.apply(e); });
}

Event JobMaster::record(EventPayload payload) {
  // A log's time never goes backwards.
  Event e{state_.last_seq() + 1, std::max(clock_.now(), state_.now()), std::move(payload)};
  state_.apply(e);
  for (EventSink* s : sinks_) s->append(e);
  return e;
}

Event JobMaster::log(EventPayload payload) {
  if (state_.finished()) throw std::logic_error("event after the job finished");
  Event e = record(std::move(payload));
  if (options_.flush_before_acting)
    for (EventSink* s : sinks_) s->flush();
  return e;
}

JobFinished JobMaster::with_restore(JobFinished f) const {
  if (!state_.in_recovery() || f.in_recovery) return f;
  const auto restore = state_.restore_under_way().value_or(
      state_.checkpoints().best_restore(policies_.recovery->restore_from_memory()));
  f.in_recovery = true;
  f.restore_step = restore.step;
  f.restore_tier = restore.tier;
  return f;
}

void JobMaster::observe(EventPayload observation) {
  if (state_.finished()) throw std::logic_error("observation after the job finished");
  if (auto* f = std::get_if<JobFinished>(&observation)) *f = with_restore(std::move(*f));
  // Every policy sees this observation, whatever was decided before it was asked.
  const Event observed = record(std::move(observation));
  const EventPayload& obs = observed.payload;
  auto decide = [&](EventPayload d) { decisions_.push_back(record(std::move(d))); };

  if (const auto* f = std::get_if<FailureObserved>(&obs)) decide(policies_.recovery->on_failure(state_, *f));
  if (const auto* s = std::get_if<SlowdownObserved>(&obs))
    if (auto d = policies_.recovery->on_slowdown(state_, *s)) decide(std::move(*d));
  if (!state_.gave_up()) {
    // An operator's change of a replica group is carried out as asked (the master checked it).
    if (const auto* r = std::get_if<ScaleRequested>(&obs)) {
      const int32_t world = state_.world_size();
      const int64_t to = int64_t{world} + r->to - r->from;
      decide(ScaleDecided{world, static_cast<int32_t>(std::clamp<int64_t>(to, 0, INT32_MAX)), r->reason, r->group, r->release});
    }
    if (auto s = policies_.scaling->decide(state_, obs)) decide(std::move(*s));
    if (auto p = policies_.checkpoint->plan(state_, obs)) decide(std::move(*p));
    // Mechanics, not policy: once every slot of the world has a node, (re)start the trainers.
    if (state_.needs_restart() && state_.vacant_slots() == 0 && state_.world_size() > 0) {
      const auto restore = state_.checkpoints().best_restore(policies_.recovery->restore_from_memory());
      // The first start is cold; a restart is warm where the policy keeps interpreters ready.
      const bool warm = state_.restart_jobs() > 0 && policies_.recovery->warm_start();
      decide(RestartJob{state_.world_size(), state_.restart_jobs(), state_.last_backoff(), restore.step, restore.tier, warm});
    }
  } else if (!state_.finished() && options_.finish_on_give_up) {
    decide(with_restore(JobFinished{"gave-up", state_.steps_done()}));
  }
  if (bursts_ == 0) act();
}

void JobMaster::act() {
  if (options_.flush_before_acting)
    for (EventSink* s : sinks_) s->flush();
  // Carrying one out may observe again (a backend that reports at once): take them first.
  for (const Event& d : std::exchange(decisions_, {})) backend_.execute(d);
}

}  // namespace goodput
