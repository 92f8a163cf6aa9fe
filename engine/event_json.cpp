#include "engine/event_json.h"

#include <array>

namespace goodput {
namespace {

// One list of fields per event type serves both directions.
template <class F> void fields(JobStarted& v, F&& f) {
  f("job", v.job); f("nodes", v.nodes); f("accelerators_per_node", v.accelerators_per_node);
  f("step_time_ns", v.step_time); f("total_steps", v.total_steps);
  f("checkpoint_bytes_per_node", v.checkpoint_bytes_per_node);
  f("memory_bandwidth_bytes_per_s", v.memory_bandwidth_bytes_per_s);
  f("storage_bandwidth_bytes_per_s", v.storage_bandwidth_bytes_per_s); f("policy", v.policy);
  f.optional("network_bandwidth_bytes_per_s", v.network_bandwidth_bytes_per_s);
}
template <class F> void fields(NodeJoined& v, F&& f) {
  f("node", v.node); f("slot", v.slot); f("name", v.name); f.optional("replica_type", v.replica_type);
}
template <class F> void fields(FailureObserved& v, F&& f) {
  f("node", v.node); f("kind", v.kind); f("exit_code", v.exit_code); f("signal", v.signal); f("reason", v.reason);
  f("stalled_since_ns", v.stalled_since);
}
template <class F> void fields(NoSpareNode& v, F&& f) { f("slot", v.slot); f.optional("fixed", v.fixed); }
template <class F> void fields(NodeReturned& v, F&& f) { f("node", v.node); }
template <class F> void fields(SlowdownObserved& v, F&& f) { f("node", v.node); f("slowdown_permille", v.slowdown_permille); }
template <class F> void fields(ProcessesStarted& v, F&& f) { f("world_size", v.world_size); f("restart", v.restart); }
template <class F> void fields(RendezvousComplete& v, F&& f) { f("world_size", v.world_size); f("restart", v.restart); }
template <class F> void fields(CheckpointLoaded& v, F&& f) { f("step", v.step); f("tier", v.tier); f("load_time_ns", v.load_time); }
template <class F> void fields(CheckpointSaved& v, F&& f) {
  f("step", v.step); f("tier", v.tier); f("blocking_ns", v.blocking); f("persist", v.persist); f("count", v.count);
  f.optional("replicate", v.replicate);
}
template <class F> void fields(CheckpointPersisted& v, F&& f) { f("step", v.step); f("count", v.count); }
template <class F> void fields(ReplicaStored& v, F&& f) { f("step", v.step); f("count", v.count); }
template <class F> void fields(ShardsCompleted& v, F&& f) { f("node", v.node); f("step", v.step); f("shards", v.shards); }
template <class F> void fields(ShardsAssigned& v, F&& f) { f("node", v.node); f("request", v.request); f("shards", v.shards); f.optional("local_rank", v.local_rank);
}
template <class F> void fields(NodeChecked& v, F&& f) {
  f("node", v.node); f("round", v.round); f("peer", v.peer); f("compute_mflops", v.compute_mflops);
  f("compute_ok", v.compute_ok); f("link_mb_per_s", v.link_mb_per_s); f("link_ok", v.link_ok);
  f("verdict", v.verdict); f("detail", v.detail);
}
template <class F> void fields(StatusObserved& v, F&& f) { f("object", v.object); f("name", v.name); f("status", v.status); }
template <class F> void fields(CheckRequested& v, F&& f) {
  f("nodes", v.nodes); f("fault", v.fault); f("reason", v.reason);
  f.optional("waiting", v.waiting); f.optional("after_step", v.after_step);
}
template <class F> void fields(StallObserved& v, F&& f) {
  f("node", v.node); f("stalled_since_ns", v.stalled_since); f("resumed", v.resumed); f("reason", v.reason);
}
template <class F> void fields(ApiRefused& v, F&& f) { f("peer", v.peer); f("count", v.count); f("reason", v.reason); }
template <class F> void fields(JobFinished& v, F&& f) {
  f("reason", v.reason); f("step", v.step); f.optional("in_recovery", v.in_recovery);
  f.optional("restore_step", v.restore_step); f.optional("restore_tier", v.restore_tier);
}
template <class F> void fields(RecoveryDecided& v, F&& f) {
  f("node", v.node); f("diagnosis", v.diagnosis); f("action", v.action); f("attempt", v.attempt);
  f("backoff_ns", v.backoff); f("memory_permille", v.memory_permille); f("rule", v.rule);
}
template <class F> void fields(CheckpointPlanSet& v, F&& f) {
  f("every_steps", v.every_steps); f("tier", v.tier); f("persist_every", v.persist_every); f("reason", v.reason);
  f.optional("replicas", v.replicas); f.optional("placement", v.placement);
}
template <class F> void fields(ScaleDecided& v, F&& f) {
  f("from", v.from); f("to", v.to); f("reason", v.reason); f.optional("group", v.group); f.optional("released", v.released);
}
template <class F> void fields(ScaleRequested& v, F&& f) {
  f("group", v.group); f("from", v.from); f("to", v.to); f("release", v.release); f("reason", v.reason);
}
template <class F> void fields(SparesHeld& v, F&& f) { f("held", v.held); }
template <class F> void fields(RestartJob& v, F&& f) {
  f("world_size", v.world_size); f("restart", v.restart); f("delay_ns", v.delay); f("restore_step", v.restore_step);
  f("restore_tier", v.restore_tier); f.optional("warm", v.warm);
}

constexpr std::array<std::string_view, std::variant_size_v<EventPayload>> kTypeNames = {
    "job_started",         "node_joined",       "failure_observed", "no_spare_node",    "node_returned",
    "slowdown_observed",   "processes_started", "rendezvous_complete", "checkpoint_loaded", "checkpoint_saved",
    "checkpoint_persisted", "job_finished",     "recovery_decided", "checkpoint_plan_set", "scale_decided",
    "restart_job",         "shards_completed", "shards_assigned",  "node_checked",
    "status_observed",     "check_requested",     "stall_observed",      "api_refused",
    "scale_requested",     "spares_held",         "replica_stored"};

constexpr std::array<std::string_view, 4> kFailureKinds = {"process_exit", "node_lost", "hang", "maintenance"};
constexpr std::array<std::string_view, kDiagnosisCount> kDiagnoses = {"software_error", "hardware_error",
                                                                      "out_of_memory", "preemption", "unknown",
                                                                      "straggler", "configuration_error"};
constexpr std::array<std::string_view, kRecoveryActionCount> kActions = {"restart_process", "relaunch_node",
                                                                         "relaunch_with_more_memory", "give_up"};
constexpr std::array<std::string_view, kTierCount> kTiers = {"none", "memory", "storage", "peer"};

template <class E, size_t N>
std::optional<E> enum_from(const std::array<std::string_view, N>& names, std::string_view s) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<E>(i);
  return std::nullopt;
}

// ---- encoding ----
struct Encoder {
  nlohmann::json& out;
  template <class T> void operator()(const char* name, T& v) {
    if constexpr (std::is_same_v<T, FailureKind>) out[name] = to_string(v);
    else if constexpr (std::is_same_v<T, Diagnosis>) out[name] = to_string(v);
    else if constexpr (std::is_same_v<T, RecoveryAction>) out[name] = to_string(v);
    else if constexpr (std::is_same_v<T, Tier>) out[name] = to_string(v);
    else out[name] = v;
  }
  // A field added after logs were written: left out at its default, so older logs read the same.
  template <class T> void optional(const char* name, T& v) {
    if (v != T{}) (*this)(name, v);
  }
};

// ---- decoding ----
struct Decoder {
  const nlohmann::json& in;
  std::string_view type;
  [[noreturn]] void fail(const char* name, const char* what) const {
    throw EventDecodeError(std::string(type) + ": field '" + name + "' " + what);
  }
  template <class E, size_t N>
  void decode_enum(const char* name, const nlohmann::json& j, const std::array<std::string_view, N>& names, E& v) {
    if (!j.is_string()) fail(name, "must be a string");
    auto e = enum_from<E>(names, j.get_ref<const std::string&>());
    if (!e) fail(name, "has an unknown value");
    v = *e;
  }
  template <class T> void optional(const char* name, T& v) {
    if (in.contains(name)) (*this)(name, v);
  }
  template <class T> void operator()(const char* name, T& v) {
    auto it = in.find(name);
    if (it == in.end()) fail(name, "is missing");
    const nlohmann::json& j = *it;
    if constexpr (std::is_same_v<T, FailureKind>) decode_enum(name, j, kFailureKinds, v);
    else if constexpr (std::is_same_v<T, Diagnosis>) decode_enum(name, j, kDiagnoses, v);
    else if constexpr (std::is_same_v<T, RecoveryAction>) decode_enum(name, j, kActions, v);
    else if constexpr (std::is_same_v<T, Tier>) decode_enum(name, j, kTiers, v);
    else if constexpr (std::is_same_v<T, bool>) {
      if (!j.is_boolean()) fail(name, "must be true or false");
      v = j.get<bool>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!j.is_string()) fail(name, "must be a string");
      v = j.get<std::string>();
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<int32_t>>) {
      using I = typename T::value_type;
      if (!j.is_array()) fail(name, "must be an array of integers");
      v.clear();
      v.reserve(j.size());
      for (const auto& x : j) {
        if (!x.is_number_integer()) fail(name, "must be an array of integers");
        if (x.is_number_unsigned() ? x.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<I>::max())
                                   : x.get<int64_t>() < std::numeric_limits<I>::min() || x.get<int64_t>() > std::numeric_limits<I>::max())
          fail(name, "has an integer out of range");
        v.push_back(static_cast<I>(x.get<int64_t>()));
      }
    } else {
      static_assert(std::is_integral_v<T>);
      if (!j.is_number_integer()) fail(name, "must be an integer");
      if (j.is_number_unsigned()) {
        const auto u = j.get<uint64_t>();
        if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) fail(name, "is out of range");
        v = static_cast<T>(u);
      } else {
        const auto s = j.get<int64_t>();
        if (s < std::numeric_limits<T>::min() || s > std::numeric_limits<T>::max()) fail(name, "is out of range");
        v = static_cast<T>(s);
      }
    }
  }
};

template <size_t I = 0>
EventPayload decode_index(size_t index, std::string_view type, const nlohmann::json& j) {
  if constexpr (I == std::variant_size_v<EventPayload>) {
    throw EventDecodeError("unknown event type '" + std::string(type) + "'");
  } else {
    if (I == index) {
      std::variant_alternative_t<I, EventPayload> v{};
      fields(v, Decoder{j, type});
      return v;
    }
    return decode_index<I + 1>(index, type, j);
  }
}

}  // namespace

std::string_view event_type_name(const EventPayload& p) { return kTypeNames[p.index()]; }
std::string_view to_string(FailureKind v) { return kFailureKinds[static_cast<size_t>(v)]; }
std::string_view to_string(Diagnosis v) { return kDiagnoses[static_cast<size_t>(v)]; }
std::string_view to_string(RecoveryAction v) { return kActions[static_cast<size_t>(v)]; }
std::string_view to_string(Tier v) { return kTiers[static_cast<size_t>(v)]; }
std::optional<FailureKind> failure_kind_from(std::string_view s) { return enum_from<FailureKind>(kFailureKinds, s); }
std::optional<Diagnosis> diagnosis_from(std::string_view s) { return enum_from<Diagnosis>(kDiagnoses, s); }
std::optional<RecoveryAction> recovery_action_from(std::string_view s) { return enum_from<RecoveryAction>(kActions, s); }
std::optional<Tier> tier_from(std::string_view s) { return enum_from<Tier>(kTiers, s); }

bool is_decision(const EventPayload& p) {
  return std::holds_alternative<RecoveryDecided>(p) || std::holds_alternative<CheckpointPlanSet>(p) ||
         std::holds_alternative<ScaleDecided>(p) || std::holds_alternative<RestartJob>(p) ||
         std::holds_alternative<ShardsAssigned>(p);
}

nlohmann::json payload_to_json(const EventPayload& payload) {
  nlohmann::json j = nlohmann::json::object();
  std::visit([&](const auto& v) { fields(const_cast<std::decay_t<decltype(v)>&>(v), Encoder{j}); }, payload);
  return j;
}

EventPayload payload_from_json(std::string_view type, const nlohmann::json& j) {
  if (!j.is_object()) throw EventDecodeError(std::string(type) + ": data must be an object");
  for (size_t i = 0; i < kTypeNames.size(); ++i)
    if (kTypeNames[i] == type) return decode_index(i, type, j);
  throw EventDecodeError("unknown event type '" + std::string(type) + "'");
}

std::string event_to_line(const Event& e) {
  nlohmann::json j;
  j["seq"] = e.seq;
  j["t"] = e.time;
  j["type"] = event_type_name(e.payload);
  j["data"] = payload_to_json(e.payload);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // reasons carry process output
}

Event event_from_line(std::string_view line) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& ex) {
    throw EventDecodeError(std::string("not valid JSON: ") + ex.what());
  }
  if (!j.is_object()) throw EventDecodeError("an event must be a JSON object");
  for (const char* k : {"seq", "t", "type", "data"})
    if (!j.contains(k)) throw EventDecodeError(std::string("field '") + k + "' is missing");
  if (!j["seq"].is_number_unsigned()) throw EventDecodeError("field 'seq' must be a non-negative integer");
  if (!j["t"].is_number_integer()) throw EventDecodeError("field 't' must be an integer");
  if (!j["type"].is_string()) throw EventDecodeError("field 'type' must be a string");
  Event e;
  e.seq = j["seq"].get<uint64_t>();
  e.time = j["t"].get<int64_t>();
  e.payload = payload_from_json(j["type"].get<std::string>(), j["data"]);
  return e;
}

}  // namespace goodput
