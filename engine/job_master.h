// The JobMaster is where observations become decisions. Each observation is appended to the log
// and folded into JobState; the policies look at the state and the event; their decisions are
// appended too, made durable (live mode), and only then handed to the backend to carry out.
#pragma once

#include <vector>

#include "engine/clock.h"
#include "engine/event.h"
#include "engine/event_store.h"
#include "engine/job_state.h"
#include "engine/policy_interfaces.h"

namespace goodput {

// The world the master acts on: the simulator, local processes, Kubernetes or Ray.
class Backend {
 public:
  virtual ~Backend() = default;
  // Carry out a decision (RecoveryDecided, RestartJob, ScaleDecided, CheckpointPlanSet) or the end
  // of the job (JobFinished). Must not call back into the master: report results as observations.
  virtual void execute(const Event& decision) = 0;
};

class JobMaster {
 public:
  struct Options {
    bool flush_before_acting = false;  // live: every decision is durable before the backend acts
    // A job that gives up ends at once (live). The simulator keeps its clock to the horizon
    // instead, so the time a given-up job was meant to run is charged (loss gave_up), and giving
    // up early never looks better than recovering.
    bool finish_on_give_up = true;
  };
  JobMaster(PolicySet policies, const Clock& clock, Backend& backend, std::vector<EventSink*> sinks, Options options);
  JobMaster(PolicySet policies, const Clock& clock, Backend& backend, std::vector<EventSink*> sinks)
      : JobMaster(std::move(policies), clock, backend, std::move(sinks), Options{}) {}

  // Rebuild state from a stored log (a restarted master); nothing is decided or executed.
  void resume_from(const EventStore& store);
  // Record an observation, decide, and act.
  void observe(EventPayload observation);
  // Record bookkeeping no policy decides on (data-shard assignments and completions); in live
  // mode it is durable when this returns.
  Event log(EventPayload payload);

  const JobState& state() const { return state_; }
  const PolicySet& policies() const { return policies_; }

 private:
  Event record(EventPayload payload);
  // A job that ends mid-recovery names the restore it was going back to (see JobFinished).
  JobFinished with_restore(JobFinished f) const;

  PolicySet policies_;
  const Clock& clock_;
  Backend& backend_;
  std::vector<EventSink*> sinks_;
  Options options_;
  JobState state_;
  std::vector<Event> decisions_;
};

}  // namespace goodput
