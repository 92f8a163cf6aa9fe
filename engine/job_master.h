// The JobMaster is where observations become decisions. Each observation is appended to the log
// and folded into JobState; the policies look at the state and the event; their decisions are
// appended too, made durable (live mode), and only then handed to the backend to carry out.
#pragma once

#include <exception>
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

  // A burst: observations made while one is held (a zone's thousand lost nodes found in one tick)
  // are recorded and decided as they come, but what was decided is carried out only when the last
  // Burst ends, after one commit of everything they logged, instead of a commit per observation.
  // Decisions stay durable before any action; the order of actions is the order of decisions.
  class Burst {
   public:
    explicit Burst(JobMaster& m) : m_(m) { ++m_.bursts_; }
    ~Burst() noexcept(false) {
      if (--m_.bursts_ == 0 && std::uncaught_exceptions() == 0) m_.act();
    }
    Burst(const Burst&) = delete;
    Burst& operator=(const Burst&) = delete;

   private:
    JobMaster& m_;
  };

  const JobState& state() const { return state_; }
  const PolicySet& policies() const { return policies_; }

 private:
  Event record(EventPayload payload);
  // A job that ends mid-recovery names the restore it was going back to (see JobFinished).
  JobFinished with_restore(JobFinished f) const;
  void act();  // commit what was logged, then carry out the decisions not yet carried out

  PolicySet policies_;
  const Clock& clock_;
  Backend& backend_;
  std::vector<EventSink*> sinks_;
  Options options_;
  JobState state_;
  std::vector<Event> decisions_;  // decided and not yet carried out
  int bursts_ = 0;
};

}  // namespace goodput
