// Policies decide; they never act. Each is a pure function of (JobState, event): no clock, no I/O,
// no randomness of its own. They are registered by name and configured from JSON, so one policy
// file drives the simulator and the live master alike.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/event.h"
#include "engine/job_state.h"
#include "engine/policy_interfaces.h"

namespace goodput {

// Bad policy configuration; the message names the JSON field ("recovery.max_restarts_per_node").
struct PolicyError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- diagnosis: a table of rules, first match wins --------------------------------------------------
struct DiagnosisRule {
  std::string name;
  std::vector<FailureKind> kinds;          // empty: any
  std::vector<int32_t> exit_codes;         // empty: any
  std::vector<int32_t> signals;            // empty: any
  std::vector<std::string> reason_contains;  // empty: any; substrings (stored lower-case, matched ignoring ASCII case)
  // Only for a failure before the job trained at all since its last (re)start: a Python import
  // error then is the job's configuration; the same text from a running trainer is a bug.
  bool before_training = false;
  Diagnosis diagnosis = Diagnosis::Unknown;
};

class DiagnosisTable {
 public:
  static DiagnosisTable defaults();
  static DiagnosisTable from_json(const nlohmann::json& j, const std::string& where);  // throws PolicyError
  struct Result {
    Diagnosis diagnosis;
    const std::string* rule;
  };
  // trained: the job trained since its last (re)start (rules with before_training do not apply).
  Result diagnose(const FailureObserved& f, bool trained = true) const;
  const std::vector<DiagnosisRule>& rules() const { return rules_; }

 private:
  std::vector<DiagnosisRule> rules_;
};

// {"name": "...", "recovery": {"policy": "diagnose", ...}, "checkpoint": {"policy": "flash", ...},
//  "scaling": {"policy": "wait"}}. Missing sections take defaults. Throws PolicyError.
PolicySet load_policy(const nlohmann::json& config);
// The policy used when none is given: diagnosis-driven recovery, flash checkpoints, wait for spares.
PolicySet default_policy();

std::vector<std::string> recovery_policy_names();
std::vector<std::string> checkpoint_policy_names();
std::vector<std::string> scaling_policy_names();

// The optimum work between two checkpoints for a save cost delta and a mean time between failures M.
// Young's first-order estimate, sqrt(2 delta M), is good while delta is small against M. Daly's
// higher-order one (J. T. Daly, "A higher order estimate of the optimum checkpoint interval for
// restart dumps", FGCS 22(3), 2006): sqrt(2 delta M) (1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9) - delta
// for delta < 2M, else M. At delta = 10 min, M = 2 h: Young 49 min, Daly 42.5 min.
Duration young_interval(Duration save_cost, Duration mtbf);
Duration daly_interval(Duration save_cost, Duration mtbf);

// Sets "a.b.c" in a JSON config from a text value ("10m", "3", "true", "flash"); used by sweep --set.
void set_config_path(nlohmann::json& config, const std::string& dotted_path, const std::string& value);

}  // namespace goodput
