// What the engine asks of a policy: the three interfaces JobMaster calls, and the set of them a job
// runs with. The engine defines them and policies/ implements them, so the engine never includes a
// policy: the deterministic core sits at the bottom, policies one floor up.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/event.h"
#include "engine/job_state.h"

namespace goodput {

// ---- the three kinds of policy -------------------------------------------------------------------------
class RecoveryPolicy {
 public:
  virtual ~RecoveryPolicy() = default;
  // REQUIRES: `state` has already applied `failure`.
  virtual RecoveryDecided on_failure(const JobState& state, const FailureObserved& failure) const = 0;
  // Whether a restart may load the host-memory checkpoint (flash) or must go to storage.
  virtual bool restore_from_memory() const = 0;
  // Whether restarts start the trainers warm (pre-started interpreters with the job's imports).
  virtual bool warm_start() const { return false; }
  // A node became slower (or recovered); a decision to replace it, or nothing.
  virtual std::optional<RecoveryDecided> on_slowdown(const JobState&, const SlowdownObserved&) const {
    return std::nullopt;
  }
};

class CheckpointPolicy {
 public:
  virtual ~CheckpointPolicy() = default;
  // Called after every event the master sees; a new plan when the plan should change.
  virtual std::optional<CheckpointPlanSet> plan(const JobState& state, const EventPayload& event) const = 0;
  // Copies of each memory checkpoint kept in other nodes' host memory (checkpoint.replicas).
  virtual int32_t replicas() const { return 0; }
};

class ScalingPolicy {
 public:
  virtual ~ScalingPolicy() = default;
  virtual std::optional<ScaleDecided> decide(const JobState& state, const EventPayload& event) const = 0;
  // Machines to keep ready beside the world (placed, checked, idle) so that a lost node's slot is
  // taken at once instead of waiting for a placement.
  virtual int32_t warm_spares() const { return 0; }
};

struct PolicySet {
  std::string name;
  nlohmann::json config;  // as given, with defaults filled in
  std::shared_ptr<const RecoveryPolicy> recovery;
  std::shared_ptr<const CheckpointPolicy> checkpoint;
  std::shared_ptr<const ScalingPolicy> scaling;
};

}  // namespace goodput
