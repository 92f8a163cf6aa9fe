// One report model, three renderings (text for people, JSON for scripts, HTML later): every number
// comes from the same Report, which comes from JobState alone, so a replay's report and the report
// recomputed from its stored log are the same by construction.
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/job_state.h"

namespace goodput {

struct Report {
  std::string job;
  std::string policy;
  std::string end_reason;
  // The job gave up (a policy's give_up, or max_failures) this far into its wall time; the rest
  // of the horizon is charged to the gave_up loss.
  bool gave_up = false;
  Duration gave_up_after = 0;
  std::string gave_up_reason;  // the give-up decision's rule
  int32_t nodes = 0;
  int32_t accelerators = 0;
  Duration wall = 0;
  Duration productive = 0;
  std::array<Duration, kLossCount> loss{};
  double goodput = 0;              // productive / wall
  double accelerator_goodput = 0;  // productive accelerator-time / accelerator-time held
  int64_t steps = 0;
  int32_t failures = 0;
  std::array<int32_t, kDiagnosisCount> by_diagnosis{};
  std::array<int32_t, kRecoveryActionCount> by_action{};
  int32_t restarts = 0;
  int32_t scale_changes = 0;
  int64_t checkpoints_memory = 0;
  int64_t checkpoints_storage = 0;
  int64_t checkpoints_persisted = 0;
  int64_t checkpoints_replicated = 0;  // memory saves whose copies reached their peers
  std::array<int64_t, kTierCount> restores{};  // by the tier restored from (none: from scratch)
  uint64_t events = 0;
};

Report make_report(const JobState& state);
nlohmann::ordered_json report_json(const Report& r);
std::string report_text(const Report& r);

// Many runs of one configuration (Monte Carlo), summarised.
struct Summary {
  std::string label;
  int runs = 0;
  double goodput_mean = 0, goodput_p5 = 0, goodput_p50 = 0, goodput_p95 = 0;
  double accelerator_goodput_mean = 0;
  double failures_mean = 0;
  double gave_up_share = 0;  // runs that gave up: a mean over them hides a policy that stops early
  std::array<double, kLossCount> loss_share_mean{};  // share of wall time
};
Summary summarize(const std::string& label, const std::vector<Report>& runs);
nlohmann::ordered_json summary_json(const Summary& s);
// A side-by-side table of summaries (compare, sweep).
std::string summaries_text(const std::vector<Summary>& rows, const std::string& first_column);

}  // namespace goodput
