// The diagnosis table: exit codes, signals, failure kinds and reason texts -> what went wrong.
// It is data: a policy file may replace it, and `goodput policy show` prints the one in force.
#include <algorithm>
#include <cctype>

#include "engine/event_json.h"
#include "engine/json_reader.h"
#include "policies/policy.h"

namespace goodput {
namespace {

// ASCII lower case: reasons are log lines and codes, and the locale must not change a diagnosis.
std::string lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

template <class T> bool any_of_or_empty(const std::vector<T>& v, const T& x) {
  return v.empty() || std::find(v.begin(), v.end(), x) != v.end();
}

// Shipped rules, written as the same JSON a user would write. Order matters: first match wins.
constexpr const char* kDefaultRules = R"([
  {"name": "oom-reason", "reason_contains": ["OOMKilled", "out of memory", "OutOfMemoryError", "oom-kill", "oom_kill",
                                             "Cannot allocate memory", "can't allocate memory", "MemoryError"],
   "diagnosis": "out_of_memory"},
  {"name": "maintenance", "kinds": ["maintenance"], "diagnosis": "preemption"},
  {"name": "preempted", "reason_contains": ["preempt", "Evicted", "spot interruption", "DisruptionTarget",
                                           "stopped by an operator"],
   "diagnosis": "preemption"},
  {"name": "node-check", "reason_contains": ["node check failed"], "diagnosis": "hardware_error"},
  {"name": "node-lost", "kinds": ["node_lost"], "diagnosis": "hardware_error"},
  {"name": "gpu-fault", "reason_contains": ["Xid", "ECC", "NVLink", "uncorrectable", "fallen off the bus", "HBM",
                                            "GPU hardware", "Faulty GPU", "infiniband", "link down"],
   "diagnosis": "hardware_error"},
  {"name": "hang", "kinds": ["hang"], "diagnosis": "unknown"},
  {"name": "nccl-timeout", "reason_contains": ["NCCL watchdog", "Watchdog caught collective operation timeout"],
   "diagnosis": "unknown"},
  {"name": "cannot-exec", "kinds": ["process_exit"], "exit_codes": [126, 127], "diagnosis": "configuration_error"},
  {"name": "cannot-run", "reason_contains": ["cannot run ", "exec format error"], "diagnosis": "configuration_error"},
  {"name": "python-startup", "kinds": ["process_exit"], "before_training": true,
   "reason_contains": ["ModuleNotFoundError", "ImportError", "SyntaxError", "IndentationError", "can't open file"],
   "diagnosis": "configuration_error"},
  {"name": "process-exit", "kinds": ["process_exit"], "diagnosis": "software_error"},
  {"name": "fallback", "diagnosis": "unknown"}
])";

}  // namespace

DiagnosisTable DiagnosisTable::defaults() { return from_json(nlohmann::json::parse(kDefaultRules), "recovery.diagnosis"); }

DiagnosisTable DiagnosisTable::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_array()) throw ConfigError("field '" + where + "' must be a list of rules");
  DiagnosisTable t;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    ConfigReader r(j[i], at);
    DiagnosisRule rule;
    rule.name = r.text("name", "rule-" + std::to_string(i));
    const std::string d = r.text("diagnosis", "");
    auto diag = diagnosis_from(d);
    if (!diag)
      r.fail("diagnosis",
             "must be one of software_error, hardware_error, out_of_memory, preemption, unknown, straggler, "
             "configuration_error");
    rule.before_training = r.boolean("before_training", false);
    rule.diagnosis = *diag;
    auto list = [&](const char* key, auto&& each) {
      const nlohmann::json* v = r.child(key);
      if (!v) return;
      if (!v->is_array()) r.fail(key, "must be a list");
      for (const auto& x : *v) each(key, x);
    };
    list("kinds", [&](const char* key, const nlohmann::json& x) {
      auto k = x.is_string() ? failure_kind_from(x.get<std::string>()) : std::nullopt;
      if (!k) r.fail(key, "entries must be one of process_exit, node_lost, hang, maintenance");
      rule.kinds.push_back(*k);
    });
    list("exit_codes", [&](const char* key, const nlohmann::json& x) {
      if (!x.is_number_integer()) r.fail(key, "entries must be integers");
      rule.exit_codes.push_back(x.get<int32_t>());
    });
    list("signals", [&](const char* key, const nlohmann::json& x) {
      if (!x.is_number_integer()) r.fail(key, "entries must be integers");
      rule.signals.push_back(x.get<int32_t>());
    });
    list("reason_contains", [&](const char* key, const nlohmann::json& x) {
      if (!x.is_string()) r.fail(key, "entries must be strings");
      rule.reason_contains.push_back(lower(x.get<std::string>()));  // matched case-insensitively
    });
    r.finish();
    t.rules_.push_back(std::move(rule));
  }
  return t;
}

DiagnosisTable::Result DiagnosisTable::diagnose(const FailureObserved& f, bool trained) const {
  const std::string reason = lower(f.reason);
  for (const DiagnosisRule& r : rules_) {
    if (r.before_training && trained) continue;
    if (!any_of_or_empty(r.kinds, f.kind) || !any_of_or_empty(r.exit_codes, f.exit_code) ||
        !any_of_or_empty(r.signals, f.signal))
      continue;
    if (!r.reason_contains.empty() &&
        std::none_of(r.reason_contains.begin(), r.reason_contains.end(),
                     [&](const std::string& s) { return reason.find(s) != std::string::npos; }))
      continue;
    return {r.diagnosis, &r.name};
  }
  static const std::string kNone = "no-rule";
  return {Diagnosis::Unknown, &kNone};
}

}  // namespace goodput
