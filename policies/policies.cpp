// The shipped policies and their registry.
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>

#include "engine/event_json.h"
#include "engine/json_reader.h"
#include "policies/policy.h"

namespace goodput {
namespace {

// ---- recovery ------------------------------------------------------------------------------------

struct RecoveryLimits {
  // Software restarts of one node within restart_window (0: the whole job) before it is relaunched
  // instead. A window, as Kubernetes' crash-loop backoff and torchelastic users expect: three
  // crashes in a month are bad luck, three in an hour are a bad node.
  int32_t max_restarts_per_node = 3;
  Duration restart_window = kHour;
  // Failures of the whole job before giving up (0: never). A job that gives up is flagged in every
  // report and, in the simulator, charged until its horizon.
  int32_t max_failures = 10000;
  Duration backoff_base = 0;          // wait before restart, doubled per failure without a checkpoint since
  Duration backoff_max = 5 * kMinute;
  // A job that fails the same way again and again before it trains at all cannot start: it backs
  // off (startup_backoff, doubled each time) and gives up at the max_startup_failures-th failure.
  int32_t max_startup_failures = 5;
  Duration startup_backoff = kSecond;
  // Restarts start the trainers warm: interpreters started beforehand, the job's imports done, take
  // over (the cost model's warm_restart instead of process_restart).
  bool warm_start = false;

  void read(ConfigReader& r) {
    max_restarts_per_node = static_cast<int32_t>(r.integer(
        "max_restarts_per_node", max_restarts_per_node, 0, static_cast<int64_t>(JobState::kRecentFailures) - 1));
    restart_window = r.duration("restart_window", restart_window);
    if (restart_window < 0) r.fail("restart_window", "must not be negative");
    max_failures = static_cast<int32_t>(r.integer("max_failures", max_failures, 0, 100'000'000));
    backoff_base = r.duration("backoff_base", backoff_base);
    backoff_max = r.duration("backoff_max", backoff_max);
    max_startup_failures = static_cast<int32_t>(r.integer("max_startup_failures", max_startup_failures, 0, 1'000'000));
    startup_backoff = r.duration("startup_backoff", startup_backoff);
    warm_start = r.boolean("warm_start", warm_start);
  }
  // A failure before the job trained since its restart, repeating the one before it.
  bool repeats_at_startup(const JobState& s, const FailureObserved& f) const {
    return f.kind == FailureKind::ProcessExit && !s.trained_since_restart() && s.repeated_startup_failures() > 1;
  }
  // The limits every policy applies after its own decision: the same failure before any training
  // (no node is to blame: back off, then give up), the job's failure budget, the restart backoff.
  void apply(const JobState& s, const FailureObserved& f, RecoveryDecided& d) const {
    d.backoff = backoff(s);
    if (repeats_at_startup(s, f)) {
      const int32_t n = s.repeated_startup_failures();
      if (startup_backoff > 0) d.backoff = std::max(d.backoff, std::min(backoff_max, startup_backoff << std::min(n - 2, 30)));
      if (max_startup_failures > 0 && n >= max_startup_failures && d.action != RecoveryAction::GiveUp) {
        d.action = RecoveryAction::GiveUp;
        d.rule = "give up: the same failure " + std::to_string(n) + " times before the job trained (exit code " +
                 std::to_string(f.exit_code) + (f.signal ? ", signal " + std::to_string(f.signal) : "") +
                 (f.reason.empty() ? "" : ": " + f.reason.substr(0, 300)) + ")";
      }
    }
    if (max_failures > 0 && s.failures() > max_failures && d.action != RecoveryAction::GiveUp) {
      d.action = RecoveryAction::GiveUp;
      d.rule = "give up: " + std::to_string(s.failures()) + " failures";
    }
  }
  // Failures of `node` that count against it now, this one included.
  int32_t recent_failures(const JobState& s, NodeId node) const {
    return restart_window > 0 ? s.failures_of_since(node, s.now() - restart_window) : s.failures_of(node);
  }
  Duration backoff(const JobState& s) const {
    if (backoff_base == 0) return 0;
    const int32_t n = std::max(1, s.failures_since_checkpoint());
    if (n > 40) return backoff_max;
    const __int128 d = static_cast<__int128>(backoff_base) << (n - 1);
    return d > backoff_max ? backoff_max : static_cast<Duration>(d);
  }
};

// Diagnose each failure and fix the smallest thing that fixes it: a software error restarts the
// processes in place (host memory, and the flash checkpoint in it, survive); a hardware error
// relaunches the node elsewhere; an OOM relaunches it with more memory.
class DiagnoseRecovery final : public RecoveryPolicy {
 public:
  explicit DiagnoseRecovery(ConfigReader& r) : table_(DiagnosisTable::defaults()) {
    limits_.read(r);
    memory_factor_ = r.number("oom_memory_factor", 1.5, 1.0, 64.0);
    restore_memory_ = r.text("restore_from", "memory") == "memory";
    if (const auto* rules = r.child("diagnosis")) table_ = DiagnosisTable::from_json(*rules, r.where() + ".diagnosis");
    actions_ = {RecoveryAction::RestartProcess, RecoveryAction::RelaunchNode, RecoveryAction::RelaunchWithMoreMemory,
                RecoveryAction::RelaunchNode, RecoveryAction::RestartProcess, RecoveryAction::RelaunchNode,
                RecoveryAction::GiveUp};
    replace_stragglers_above_ = r.number("replace_stragglers_above", 0.0, 0.0, 1000.0);
    if (replace_stragglers_above_ != 0.0 && replace_stragglers_above_ <= 1.0)
      r.fail("replace_stragglers_above", "must be 0 (never) or a slowdown factor above 1");
    if (const auto* a = r.child("actions")) {
      ConfigReader ar(*a, r.where() + ".actions");
      for (int d = 0; d < kDiagnosisCount; ++d) {
        const std::string key(to_string(static_cast<Diagnosis>(d)));
        const std::string v = ar.text(key.c_str(), std::string(to_string(actions_[d])));
        auto act = recovery_action_from(v);
        if (!act) ar.fail(key.c_str(), "must be restart_process, relaunch_node, relaunch_with_more_memory or give_up");
        actions_[d] = *act;
      }
      ar.finish();
    }
    const std::string rf = r.text("restore_from", "memory");
    if (rf != "memory" && rf != "storage") r.fail("restore_from", "must be \"memory\" or \"storage\"");
  }

  RecoveryDecided on_failure(const JobState& s, const FailureObserved& f) const override {
    const auto diag = table_.diagnose(f, s.trained_since_restart());
    RecoveryDecided d;
    d.node = f.node;
    d.diagnosis = diag.diagnosis;
    d.action = actions_[static_cast<size_t>(diag.diagnosis)];
    d.attempt = s.failures_of(f.node);
    d.rule = *diag.rule;
    if (d.diagnosis == Diagnosis::ConfigurationError)  // the console and the report say why
      d.rule += ": " + (f.reason.empty() ? "exit code " + std::to_string(f.exit_code) : f.reason.substr(0, 300));
    // A node that keeps failing is relaunched elsewhere, unless the failure is the job's own: the
    // same one again before it trained would follow it to any machine.
    if (const int32_t recent = limits_.recent_failures(s, f.node);
        d.action == RecoveryAction::RestartProcess && recent > limits_.max_restarts_per_node &&
        !limits_.repeats_at_startup(s, f)) {
      d.action = RecoveryAction::RelaunchNode;
      d.rule = "escalate: node failed " + std::to_string(recent) + " times" +
               (limits_.restart_window > 0 ? " in " + format_duration(limits_.restart_window) : "");
    }
    if (d.action == RecoveryAction::RelaunchWithMoreMemory)
      d.memory_permille = static_cast<int32_t>(std::lround(memory_factor_ * 1000));
    limits_.apply(s, f, d);
    return d;
  }
  bool restore_from_memory() const override { return restore_memory_; }
  bool warm_start() const override { return limits_.warm_start; }

  // A node running `replace_stragglers_above` times slower than it should is replaced: the whole
  // synchronous job runs at its pace, so a relaunch (and the recompute it costs) can pay for itself.
  std::optional<RecoveryDecided> on_slowdown(const JobState& s, const SlowdownObserved& o) const override {
    if (replace_stragglers_above_ <= 0 || o.slowdown_permille < replace_stragglers_above_ * 1000.0 || !s.holds(o.node))
      return std::nullopt;
    RecoveryDecided d;
    d.node = o.node;
    d.diagnosis = Diagnosis::Straggler;
    d.action = actions_[static_cast<size_t>(Diagnosis::Straggler)];
    d.attempt = s.failures_of(o.node);
    char buf[96];
    std::snprintf(buf, sizeof buf, "straggler: %.2fx slower (replace above %.2fx)", o.slowdown_permille / 1000.0,
                  replace_stragglers_above_);
    d.rule = buf;
    return d;
  }

 private:
  double replace_stragglers_above_ = 0;
  DiagnosisTable table_;
  RecoveryLimits limits_;
  double memory_factor_ = 1.5;
  bool restore_memory_ = true;
  std::array<RecoveryAction, kDiagnosisCount> actions_{};
};

// The torchrun baseline: any failure tears down the whole group and restarts it from the last
// checkpoint in storage. A machine that is gone has to be replaced first, but nothing is diagnosed.
class RestartAllRecovery final : public RecoveryPolicy {
 public:
  explicit RestartAllRecovery(ConfigReader& r) { limits_.read(r); }
  RecoveryDecided on_failure(const JobState& s, const FailureObserved& f) const override {
    RecoveryDecided d;
    d.node = f.node;
    d.diagnosis = Diagnosis::Unknown;
    const bool machine_gone = f.kind == FailureKind::NodeLost || f.kind == FailureKind::Maintenance;
    d.action = machine_gone ? RecoveryAction::RelaunchNode : RecoveryAction::RestartProcess;
    d.attempt = s.failures_of(f.node);
    d.rule = machine_gone ? "machine gone" : "restart all";
    limits_.apply(s, f, d);
    return d;
  }
  bool restore_from_memory() const override { return false; }
  bool warm_start() const override { return limits_.warm_start; }

 private:
  RecoveryLimits limits_;
};

// ---- checkpoint ----------------------------------------------------------------------------------

struct PlanShape {
  Tier tier = Tier::Storage;
  int32_t persist_every = 0;
  int32_t replicas = 0;
  std::string placement;

  void fill(CheckpointPlanSet& p) const {
    p.tier = tier;
    p.persist_every = persist_every;
    p.replicas = replicas;
    p.placement = placement;
  }
};

int64_t steps_for(Duration interval, Duration step_time) {
  if (step_time <= 0) return 1;
  return std::max<int64_t>(1, (interval + step_time / 2) / step_time);
}

PlanShape read_shape(ConfigReader& r, Tier default_tier, int32_t default_persist) {
  PlanShape s;
  const std::string tier = r.text("tier", std::string(to_string(default_tier)));
  auto t = tier_from(tier);
  if (!t || (*t != Tier::Memory && *t != Tier::Storage)) r.fail("tier", "must be \"memory\" or \"storage\"");
  s.tier = *t;
  s.persist_every = static_cast<int32_t>(r.integer("persist_every", s.tier == Tier::Memory ? default_persist : 0, 0, 1'000'000));
  if (s.tier == Tier::Storage && s.persist_every != 0) r.fail("persist_every", "applies only to tier \"memory\"");
  // Copies of each memory checkpoint in other nodes' host memory (the peer tier).
  s.replicas = static_cast<int32_t>(r.integer("replicas", 0, 0, 64));
  if (s.tier == Tier::Storage && s.replicas != 0) r.fail("replicas", "applies only to tier \"memory\"");
  // Read with no replicas too (a sweep over replicas=0,1,2 keeps one placement), but kept only with them.
  s.placement = r.text("placement", "ring");
  if (s.placement != "ring" && s.placement != "groups") r.fail("placement", "must be \"ring\" or \"groups\"");
  if (s.replicas == 0) s.placement.clear();
  return s;
}

// A fixed interval, given as a duration of training ("interval") or in steps ("every_steps").
class FixedCheckpoint final : public CheckpointPolicy {
 public:
  FixedCheckpoint(ConfigReader& r, Tier default_tier, int32_t default_persist, Duration default_interval) {
    shape_ = read_shape(r, default_tier, default_persist);
    interval_ = r.duration("interval", default_interval);
    every_steps_ = r.integer("every_steps", 0, 0, int64_t{1} << 50);
    if (interval_ <= 0 && every_steps_ == 0) r.fail("interval", "must be positive");
  }
  std::optional<CheckpointPlanSet> plan(const JobState& s, const EventPayload& e) const override {
    if (!std::holds_alternative<JobStarted>(e)) return std::nullopt;
    CheckpointPlanSet p;
    p.every_steps = every_steps_ > 0 ? every_steps_ : steps_for(interval_, s.job().step_time);
    shape_.fill(p);
    p.reason = every_steps_ > 0 ? "fixed: every " + std::to_string(every_steps_) + " steps"
                                : "fixed: every " + format_duration(interval_) + " of training";
    return p;
  }
  int32_t replicas() const override { return shape_.replicas; }

 private:
  PlanShape shape_;
  Duration interval_ = 0;
  int64_t every_steps_ = 0;
};

// Young/Daly: the interval that balances the cost of saving against the work lost to a failure, by
// Daly's higher-order formula (daly_interval). MTBF is re-estimated from the failures seen so far,
// starting from a prior.
class YoungDalyCheckpoint final : public CheckpointPolicy {
 public:
  explicit YoungDalyCheckpoint(ConfigReader& r) {
    shape_ = read_shape(r, Tier::Storage, 10);
    mtbf_prior_ = r.duration("mtbf_prior", 4 * kHour);
    min_interval_ = r.duration("min_interval", 10 * kSecond);
    max_interval_ = r.duration("max_interval", 24 * kHour);
    replan_threshold_ = r.number("replan_threshold", 0.1, 0.0, 10.0);
    if (mtbf_prior_ <= 0) r.fail("mtbf_prior", "must be positive");
  }
  std::optional<CheckpointPlanSet> plan(const JobState& s, const EventPayload& e) const override {
    const bool start = std::holds_alternative<JobStarted>(e);
    if (!start && !std::holds_alternative<FailureObserved>(e)) return std::nullopt;
    const Duration cost = CheckpointCosts::from(s.job()).save(shape_.tier);
    // The prior counts as one failure observed after mtbf_prior of running.
    const Duration mtbf = (s.wall() + mtbf_prior_) / (s.failures() + 1);
    const Duration iv = std::clamp(daly_interval(std::max<Duration>(cost, 1), mtbf), min_interval_, max_interval_);
    const int64_t steps = steps_for(iv, s.job().step_time);
    const int64_t current = s.checkpoint_plan().every_steps;
    if (!start && current > 0 &&
        std::abs(static_cast<double>(steps - current)) <= replan_threshold_ * static_cast<double>(current))
      return std::nullopt;
    CheckpointPlanSet p;
    p.every_steps = steps;
    shape_.fill(p);
    p.reason = "young-daly: save " + format_seconds(cost) + "s, mtbf " + format_duration(mtbf) + " -> every " +
               format_duration(iv) + " (Daly's higher-order optimum)";
    return p;
  }
  int32_t replicas() const override { return shape_.replicas; }

 private:
  PlanShape shape_;
  Duration mtbf_prior_, min_interval_, max_interval_;
  double replan_threshold_;
};

// ---- scaling -------------------------------------------------------------------------------------

int32_t read_warm_spares(ConfigReader& r) { return static_cast<int32_t>(r.integer("warm_spares", 0, 0, 100'000)); }

// Never change the world size: a lost node's slot waits for a spare.
class WaitScaling final : public ScalingPolicy {
 public:
  explicit WaitScaling(ConfigReader& r) : warm_spares_(read_warm_spares(r)) {}
  std::optional<ScaleDecided> decide(const JobState&, const EventPayload&) const override { return std::nullopt; }
  int32_t warm_spares() const override { return warm_spares_; }

 private:
  int32_t warm_spares_ = 0;
};

// Keep training with the nodes that are there when no spare is free; grow back when nodes join.
class ElasticScaling final : public ScalingPolicy {
 public:
  explicit ElasticScaling(ConfigReader& r) {
    min_nodes_ = static_cast<int32_t>(r.integer("min_nodes", 1, 1, 1'000'000));
    warm_spares_ = read_warm_spares(r);
  }
  int32_t warm_spares() const override { return warm_spares_; }
  std::optional<ScaleDecided> decide(const JobState& s, const EventPayload& e) const override {
    const int32_t world = s.world_size();
    const int32_t held = s.nodes_held();
    const auto* none = std::get_if<NoSpareNode>(&e);
    if (none && !none->fixed && held < world && held >= min_nodes_)
      return ScaleDecided{world, held, "no spare node: continue with " + std::to_string(held), "", {}};
    if (std::holds_alternative<NodeJoined>(e) && held > world && world < s.target_nodes())
      return ScaleDecided{world, std::min(held, s.target_nodes()), "node joined: grow back", "", {}};
    return std::nullopt;
  }

 private:
  int32_t min_nodes_ = 1;
  int32_t warm_spares_ = 0;
};

// ---- registry ------------------------------------------------------------------------------------

template <class P> using Factory = std::function<std::shared_ptr<const P>(ConfigReader&)>;

const std::map<std::string, Factory<RecoveryPolicy>>& recovery_registry() {
  static const std::map<std::string, Factory<RecoveryPolicy>> m = {
      {"diagnose", [](ConfigReader& r) { return std::make_shared<DiagnoseRecovery>(r); }},
      {"restart-all", [](ConfigReader& r) { return std::make_shared<RestartAllRecovery>(r); }},
  };
  return m;
}
const std::map<std::string, Factory<CheckpointPolicy>>& checkpoint_registry() {
  static const std::map<std::string, Factory<CheckpointPolicy>> m = {
      {"fixed", [](ConfigReader& r) { return std::make_shared<FixedCheckpoint>(r, Tier::Storage, 0, 30 * kMinute); }},
      {"flash", [](ConfigReader& r) { return std::make_shared<FixedCheckpoint>(r, Tier::Memory, 1, 2 * kMinute); }},
      {"young-daly", [](ConfigReader& r) { return std::make_shared<YoungDalyCheckpoint>(r); }},
  };
  return m;
}
const std::map<std::string, Factory<ScalingPolicy>>& scaling_registry() {
  static const std::map<std::string, Factory<ScalingPolicy>> m = {
      {"wait", [](ConfigReader& r) { return std::make_shared<WaitScaling>(r); }},
      {"elastic", [](ConfigReader& r) { return std::make_shared<ElasticScaling>(r); }},
  };
  return m;
}

template <class P>
std::shared_ptr<const P> build(const nlohmann::json& config, const char* section, const std::string& fallback,
                               const std::map<std::string, Factory<P>>& registry) {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  const nlohmann::json& j = config.contains(section) ? config[section] : kEmpty;
  ConfigReader r(j, section);
  const std::string name = r.text("policy", fallback);
  auto it = registry.find(name);
  if (it == registry.end()) {
    std::string known;
    for (const auto& [k, _] : registry) known += (known.empty() ? "" : ", ") + k;
    r.fail("policy", "names no known policy: '" + name + "' (known: " + known + ")");
  }
  auto p = it->second(r);
  r.finish();
  return p;
}

template <class M> std::vector<std::string> names(const M& m) {
  std::vector<std::string> out;
  for (const auto& [k, _] : m) out.push_back(k);
  return out;
}

}  // namespace

PolicySet load_policy(const nlohmann::json& config) {
  try {
    ConfigReader top(config, "");
    PolicySet s;
    s.name = top.text("name", "unnamed");
    top.child("recovery");
    top.child("checkpoint");
    top.child("scaling");
    top.child("description");
    top.finish();
    s.recovery = build(config, "recovery", "diagnose", recovery_registry());
    s.checkpoint = build(config, "checkpoint", "flash", checkpoint_registry());
    s.scaling = build(config, "scaling", "wait", scaling_registry());
    s.config = config;
    return s;
  } catch (const ConfigError& e) {
    throw PolicyError(e.what());
  }
}

Duration young_interval(Duration save_cost, Duration mtbf) {
  if (save_cost <= 0 || mtbf <= 0) return 0;
  return static_cast<Duration>(std::sqrt(2.0 * static_cast<double>(save_cost) * static_cast<double>(mtbf)));
}

Duration daly_interval(Duration save_cost, Duration mtbf) {
  if (save_cost <= 0 || mtbf <= 0) return 0;
  const double d = static_cast<double>(save_cost), m = static_cast<double>(mtbf);
  if (d >= 2 * m) return mtbf;
  const double x = d / (2 * m);
  return static_cast<Duration>(std::sqrt(2 * d * m) * (1 + std::sqrt(x) / 3 + x / 9) - d);
}

PolicySet default_policy() { return load_policy(nlohmann::json{{"name", "default"}}); }

std::vector<std::string> recovery_policy_names() { return names(recovery_registry()); }
std::vector<std::string> checkpoint_policy_names() { return names(checkpoint_registry()); }
std::vector<std::string> scaling_policy_names() { return names(scaling_registry()); }

void set_config_path(nlohmann::json& config, const std::string& path, const std::string& value) {
  nlohmann::json* node = &config;
  std::stringstream ss(path);
  std::string part;
  std::vector<std::string> parts;
  while (std::getline(ss, part, '.')) {
    if (part.empty()) throw PolicyError("bad setting path '" + path + "'");
    parts.push_back(part);
  }
  if (parts.empty()) throw PolicyError("bad setting path '" + path + "'");
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!node->is_object()) throw PolicyError("setting '" + path + "': '" + parts[i] + "' is not a section");
    node = &(*node)[parts[i]];
    if (node->is_null()) *node = nlohmann::json::object();
  }
  // Numbers and booleans stay typed; everything else (durations, names) is a string.
  nlohmann::json v;
  try {
    v = nlohmann::json::parse(value);
    if (!v.is_number() && !v.is_boolean()) v = value;
  } catch (const nlohmann::json::exception&) {
    v = value;
  }
  (*node)[parts.back()] = v;
}

}  // namespace goodput
