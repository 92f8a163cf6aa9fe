// How the live master notices that training went wrong: a trainer that exited, one that hangs, a
// hang left alone (hang_action "report") and a job-wide pause that ended by itself.
//
// One failure makes the other ranks fail too (their collectives break), so an exit is blamed only
// once the reports it causes are in (failure_settle, and every rank heard from since the first
// exit or silent past the heartbeat timeout): then the one that looks like the cause is blamed.
// What is noticed becomes one observation for LiveMaster to log. A hang left alone and a pause
// under way are kept here until they end; a restart ends both.
#pragma once

#include <optional>

#include "backends/live/agreement.h"
#include "backends/live/job_spec.h"

namespace goodput::live {

class FailureWatch {
 public:
  explicit FailureWatch(const JobSpec& spec) : spec_(spec) {}

  void fold(const StallObserved& s);  // a hang left alone begins or ends
  void restarted();                   // a new restart: nothing of the old one is under way

  struct Notice {
    enum class Kind : uint8_t { Nothing, Observe, Wait } kind = Kind::Nothing;  // Wait: an exit is settling
    std::optional<EventPayload> event;  // with Observe
    bool dump_stacks = false;           // every rank's trainer should dump its stacks (a hang left alone)
  };
  // What the ranks' latest reports show, `gen` being the restart they run. `exits`: the ranks whose
  // trainers reported an exit in it (by rank), so that finding the culprit costs what failed, not
  // the world. `timers`: also what time alone changes (a failure settled, a hang, a pause), which
  // takes a scan of the world: on the master's tick, not after each report.
  Notice notice(const Ranks& w, const Ranks& exits, int32_t gen, Phase phase, Time now, bool timers);

 private:
  bool settled(const Ranks& w, Time now) const;  // a failure's reports are all in

  const JobSpec& spec_;
  std::optional<Time> settle_from_;     // a trainer's exit was first seen then
  std::optional<StallObserved> stall_;  // a hang reported and left alone, until it moves
  std::optional<StallObserved> pause_;  // a job-wide silence under way (not logged unless it ends by itself)
  int64_t pause_step_ = 0;              // the newest step any rank had reported when it began
};

}  // namespace goodput::live
