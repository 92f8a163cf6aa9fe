#include "sim/trace.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <fstream>
#include <sstream>

#include "engine/json_reader.h"
#include "engine/rng.h"

namespace goodput {
namespace {

constexpr std::array<std::string_view, 8> kTypes = {"node_failure", "process_crash", "hang",  "slowdown",
                                                    "maintenance",  "node_return",   "pause", "scale"};

std::optional<TraceEventType> type_from(std::string_view s) {
  for (size_t i = 0; i < kTypes.size(); ++i)
    if (kTypes[i] == s) return static_cast<TraceEventType>(i);
  return std::nullopt;
}

std::string known_types() {
  std::string s;
  for (auto t : kTypes) s += (s.empty() ? "" : ", ") + std::string(t);
  return s;
}

void read_cluster(ConfigReader& r, ClusterSpec& c) {
  c.nodes = static_cast<int32_t>(r.integer("nodes", 0, 1, 1'000'000));
  if (!r.has("nodes")) r.fail("nodes", "is missing");
  c.accelerators_per_node = static_cast<int32_t>(r.integer("accelerators_per_node", c.accelerators_per_node, 1, 1024));
  c.spare_nodes = static_cast<int32_t>(r.integer("spare_nodes", c.spare_nodes, 0, 1'000'000));
  c.repair_time = r.duration("repair_time", c.repair_time);
  c.check_time = r.duration("check_time", c.check_time);
  c.node_hours = r.number("node_hours", 0, 0, 1e15);
  c.job_nodes = static_cast<int32_t>(r.integer("job_nodes", 0, 1, 1'000'000));
  r.finish();
}

void read_job(ConfigReader& r, JobSpec& j) {
  j.name = r.text("name", j.name);
  j.step_time = r.duration("step_time", j.step_time);
  if (j.step_time <= 0) r.fail("step_time", "must be positive");
  j.total_steps = r.integer("total_steps", 0, 0, int64_t{1} << 50);
  j.duration = r.duration("duration", 0);
  if (j.duration <= 0 && j.total_steps == 0) r.fail("duration", "is missing (give a horizon, total_steps, or both)");
  j.checkpoint_bytes_per_node = r.integer("checkpoint_bytes_per_node", 0, 0, int64_t{1} << 50);
  j.memory_bandwidth_bytes_per_s = r.integer("memory_bandwidth_bytes_per_s", j.memory_bandwidth_bytes_per_s, 1, int64_t{1} << 50);
  j.storage_bandwidth_bytes_per_s = r.integer("storage_bandwidth_bytes_per_s", j.storage_bandwidth_bytes_per_s, 1, int64_t{1} << 50);
  j.network_bandwidth_bytes_per_s = r.integer("network_bandwidth_bytes_per_s", j.network_bandwidth_bytes_per_s, 1, int64_t{1} << 50);
  j.process_restart = r.duration("process_restart", j.process_restart);
  j.warm_restart = r.duration("warm_restart", j.warm_restart);
  if (j.warm_restart < 0) r.fail("warm_restart", "must not be negative");
  j.node_scheduling = r.duration("node_scheduling", j.node_scheduling);
  j.spare_activation = r.duration("spare_activation", j.spare_activation);
  if (j.spare_activation < 0) r.fail("spare_activation", "must not be negative");
  j.rendezvous = r.duration("rendezvous", j.rendezvous);
  j.exit_detection = r.duration("exit_detection", j.exit_detection);
  j.heartbeat_timeout = r.duration("heartbeat_timeout", j.heartbeat_timeout);
  j.hang_timeout = r.duration("hang_timeout", j.hang_timeout);
  r.finish();
}

FailureRate read_rate(ConfigReader& r) {
  FailureRate f;
  const std::string type = r.text("type", "");
  auto t = type_from(type);
  if (!t || *t == TraceEventType::Slowdown || *t == TraceEventType::NodeReturn || *t == TraceEventType::Scale)
    r.fail("type", "must be node_failure, process_crash, hang, maintenance or pause");
  f.type = *t;
  f.reason = r.text("reason", "");
  f.per_node_hour = r.number("per_node_hour", -1, 0, 1e6);
  if (f.per_node_hour < 0) r.fail("per_node_hour", "is missing");
  f.exit_code = static_cast<int32_t>(r.integer("exit_code", 1, -1000, 1000));
  f.count = r.integer("count", -1, 0, int64_t{1} << 50);
  if (const nlohmann::json* ci = r.child("ci95")) {
    if (!ci->is_array() || ci->size() != 2 || !(*ci)[0].is_number() || !(*ci)[1].is_number() ||
        (*ci)[0].get<double>() < 0 || (*ci)[1].get<double>() < (*ci)[0].get<double>())
      r.fail("ci95", "must be [low, high], 0 <= low <= high");
    f.ci_lo = (*ci)[0].get<double>();
    f.ci_hi = (*ci)[1].get<double>();
  }
  if (f.type == TraceEventType::Pause) {
    f.duration = r.duration("duration", 0);
    if (f.duration <= 0) r.fail("duration", "is missing (how long each pause lasts)");
  }
  r.finish();
  return f;
}

}  // namespace

std::string_view to_string(TraceEventType t) { return kTypes[static_cast<size_t>(t)]; }

std::string Trace::machine_name(int32_t m) const {
  return m < cluster.nodes ? "n" + std::to_string(m) : "s" + std::to_string(m - cluster.nodes);
}

std::optional<int32_t> Trace::machine_index(std::string_view name) const {
  if (name.size() < 2 || (name[0] != 'n' && name[0] != 's')) return std::nullopt;
  int32_t i = -1;
  auto [p, ec] = std::from_chars(name.data() + 1, name.data() + name.size(), i);
  if (ec != std::errc() || p != name.data() + name.size() || i < 0) return std::nullopt;
  if (name.size() > 2 && name[1] == '0') return std::nullopt;  // "n01" is not "n1"
  if (name[0] == 'n') return i < cluster.nodes ? std::optional(i) : std::nullopt;
  return i < cluster.spare_nodes ? std::optional(cluster.nodes + i) : std::nullopt;
}

JobStarted Trace::job_started(const std::string& policy) const {
  JobStarted s;
  s.job = job.name;
  s.nodes = cluster.nodes;
  s.accelerators_per_node = cluster.accelerators_per_node;
  s.step_time = job.step_time;
  s.total_steps = job.total_steps;
  s.checkpoint_bytes_per_node = job.checkpoint_bytes_per_node;
  s.memory_bandwidth_bytes_per_s = job.memory_bandwidth_bytes_per_s;
  s.storage_bandwidth_bytes_per_s = job.storage_bandwidth_bytes_per_s;
  s.policy = policy;
  s.network_bandwidth_bytes_per_s = job.network_bandwidth_bytes_per_s;
  return s;
}

Trace parse_trace(const std::string& text, const std::string& file) {
  Trace t;
  t.path = file;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  bool header = false;
  Time last_t = 0;
  auto fail = [&](const std::string& what) -> TraceError { return TraceError(file + ":" + std::to_string(lineno) + ": " + what); };
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw fail(std::string("not valid JSON (truncated line?): ") + e.what());
    }
    try {
      if (!header) {
        ConfigReader r(j, "");
        const std::string format = r.text("format", "");
        if (format != "goodput-trace") r.fail("format", "must be \"goodput-trace\" (is this a Goodput trace?)");
        t.version = static_cast<int>(r.integer("version", 0, 0, 1'000'000));
        if (t.version != kTraceVersion)
          r.fail("version", "is " + std::to_string(t.version) + "; this build reads version " + std::to_string(kTraceVersion));
        t.name = r.text("name", "");
        t.source = r.text("source", "");
        const nlohmann::json* c = r.child("cluster");
        if (!c) r.fail("cluster", "is missing");
        ConfigReader cr(*c, "cluster");
        read_cluster(cr, t.cluster);
        const nlohmann::json* jb = r.child("job");
        if (!jb) r.fail("job", "is missing");
        ConfigReader jr(*jb, "job");
        read_job(jr, t.job);
        if (const nlohmann::json* rates = r.child("failure_rates")) {
          if (!rates->is_array()) r.fail("failure_rates", "must be a list");
          for (size_t i = 0; i < rates->size(); ++i) {
            ConfigReader rr((*rates)[i], "failure_rates[" + std::to_string(i) + "]");
            t.rates.push_back(read_rate(rr));
          }
        }
        r.finish();
        header = true;
        continue;
      }
      ConfigReader r(j, "");
      TraceEvent e;
      e.line = lineno;
      if (!r.has("t")) r.fail("t", "is missing");
      const double secs = r.number("t", 0, -1e300, 1e300);
      if (secs < 0) r.fail("t", "is negative");
      // Microsecond resolution: a double holds that exactly for any plausible job, so a trace
      // written and read again is the same trace.
      auto ns = seconds_to_ns(secs);
      if (!ns) r.fail("t", "is out of range");
      e.t = (*ns + kMicrosecond / 2) / kMicrosecond * kMicrosecond;
      if (e.t < last_t) r.fail("t", "goes back in time (" + std::to_string(secs) + "s after " + format_seconds(last_t) + "s): events must be sorted");
      if (t.job.duration > 0 && e.t > t.job.duration) r.fail("t", "is past the job's duration");
      last_t = e.t;
      if (!r.has("type")) r.fail("type", "is missing");
      const std::string type = r.text("type", "");
      auto ty = type_from(type);
      if (!ty) r.fail("type", "is unknown: '" + type + "' (known: " + known_types() + ")");
      e.type = *ty;
      if (e.type == TraceEventType::Scale) {  // no node: the whole job's layout changes
        e.group = r.text("group", "");
        if (e.group.empty()) r.fail("group", "is missing (the replica group scaled: \"ps\" or \"worker\")");
        if (!r.has("from") || !r.has("to")) r.fail(r.has("from") ? "to" : "from", "is missing (the group's node count)");
        e.from = static_cast<int32_t>(r.integer("from", 0, 0, 1'000'000));
        e.to = static_cast<int32_t>(r.integer("to", 1, 1, 1'000'000));
        e.reason = r.text("reason", "");
        r.finish();
        t.events.push_back(std::move(e));
        continue;
      }
      const bool by_node = r.has("node"), by_rank = r.has("rank");
      if (by_node == by_rank) r.fail("node", by_node ? "and 'rank' are both given; give one" : "is missing (give 'node' or 'rank')");
      if (by_node) {
        const std::string n = r.text("node", "");
        auto idx = t.machine_index(n);
        if (!idx)
          r.fail("node", "names an unknown node '" + n + "' (the cluster has n0..n" + std::to_string(t.cluster.nodes - 1) +
                             (t.cluster.spare_nodes ? " and s0..s" + std::to_string(t.cluster.spare_nodes - 1) : "") + ")");
        e.node = *idx;
      } else {
        e.rank = static_cast<int32_t>(r.integer("rank", 0, 0, t.cluster.nodes - 1));
        if (e.type == TraceEventType::NodeReturn) r.fail("rank", "cannot name a returning node; use 'node'");
      }
      e.reason = r.text("reason", "");
      e.exit_code = static_cast<int32_t>(r.integer("exit_code", 1, -1000, 1000));
      e.signal = static_cast<int32_t>(r.integer("signal", 0, 0, 128));
      const double factor = r.number("factor", 1.0, 1.0, 1000.0);
      e.slowdown_permille = static_cast<int32_t>(factor * 1000.0 + 0.5);
      if (e.type == TraceEventType::Slowdown && !r.has("factor")) r.fail("factor", "is missing (slowdown factor >= 1)");
      const double needed = r.number("memory_needed", 0.0, 0.0, 1000.0);
      e.memory_needed_permille = static_cast<int32_t>(needed * 1000.0 + 0.5);
      if (r.has("memory_needed") && (e.type != TraceEventType::ProcessCrash || needed <= 1.0))
        r.fail("memory_needed", "applies to process_crash only, as a factor above 1");
      const bool timed = e.type == TraceEventType::Slowdown || e.type == TraceEventType::Pause;
      e.duration = r.duration(timed ? "duration" : e.memory_needed_permille ? "recur_after" : "repair", 0);
      if (e.type == TraceEventType::Pause && e.duration <= 0) r.fail("duration", "is missing (how long the pause lasts)");
      r.finish();
      t.events.push_back(std::move(e));
    } catch (const ConfigError& e) {
      throw fail(std::string(header ? "" : "header: ") + e.what());
    }
  }
  if (!header) throw TraceError(file + ": empty trace (the first line must be the header)");
  return t;
}

Trace load_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TraceError(path + ": cannot open trace");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_trace(ss.str(), path);
}

std::string write_trace(const Trace& t) {
  auto dur = [](Duration d) {
    std::string s = format_seconds(d);  // exact; trailing zeros trimmed
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
    return s + "s";
  };
  nlohmann::ordered_json h;
  h["format"] = "goodput-trace";
  h["version"] = t.version;
  h["name"] = t.name;
  if (!t.source.empty()) h["source"] = t.source;
  h["cluster"] = {{"nodes", t.cluster.nodes},
                  {"accelerators_per_node", t.cluster.accelerators_per_node},
                  {"spare_nodes", t.cluster.spare_nodes},
                  {"repair_time", dur(t.cluster.repair_time)},
                  {"check_time", dur(t.cluster.check_time)}};
  if (t.cluster.node_hours > 0) h["cluster"]["node_hours"] = t.cluster.node_hours;
  if (t.cluster.job_nodes > 0) h["cluster"]["job_nodes"] = t.cluster.job_nodes;
  nlohmann::ordered_json job = {{"name", t.job.name}, {"step_time", dur(t.job.step_time)}};
  if (t.job.total_steps) job["total_steps"] = t.job.total_steps;
  if (t.job.duration) job["duration"] = dur(t.job.duration);
  job["checkpoint_bytes_per_node"] = t.job.checkpoint_bytes_per_node;
  job["memory_bandwidth_bytes_per_s"] = t.job.memory_bandwidth_bytes_per_s;
  job["storage_bandwidth_bytes_per_s"] = t.job.storage_bandwidth_bytes_per_s;
  if (t.job.network_bandwidth_bytes_per_s != JobSpec{}.network_bandwidth_bytes_per_s)
    job["network_bandwidth_bytes_per_s"] = t.job.network_bandwidth_bytes_per_s;
  job["process_restart"] = dur(t.job.process_restart);
  if (t.job.warm_restart != JobSpec{}.warm_restart) job["warm_restart"] = dur(t.job.warm_restart);
  job["node_scheduling"] = dur(t.job.node_scheduling);
  if (t.job.spare_activation != JobSpec{}.spare_activation) job["spare_activation"] = dur(t.job.spare_activation);
  job["rendezvous"] = dur(t.job.rendezvous);
  job["exit_detection"] = dur(t.job.exit_detection);
  job["heartbeat_timeout"] = dur(t.job.heartbeat_timeout);
  job["hang_timeout"] = dur(t.job.hang_timeout);
  h["job"] = job;
  if (!t.rates.empty()) {
    auto& rates = h["failure_rates"] = nlohmann::ordered_json::array();
    for (const FailureRate& r : t.rates) {
      nlohmann::ordered_json x = {{"type", to_string(r.type)}, {"reason", r.reason}, {"per_node_hour", r.per_node_hour}};
      if (r.type == TraceEventType::ProcessCrash) x["exit_code"] = r.exit_code;
      if (r.type == TraceEventType::Pause) x["duration"] = dur(r.duration);
      if (r.count >= 0) x["count"] = r.count;
      if (r.ci_lo >= 0) x["ci95"] = {r.ci_lo, r.ci_hi};
      rates.push_back(x);
    }
  }
  std::string out = h.dump() + "\n";
  for (const TraceEvent& e : t.events) {
    nlohmann::ordered_json j;
    // Seconds with ns precision, written exactly.
    j["t"] = nlohmann::ordered_json::parse(format_seconds(e.t));
    j["type"] = to_string(e.type);
    if (e.type == TraceEventType::Scale) {
      j["group"] = e.group;
      j["from"] = e.from;
      j["to"] = e.to;
      if (!e.reason.empty()) j["reason"] = e.reason;
      out += j.dump() + "\n";
      continue;
    }
    if (e.node >= 0) j["node"] = t.machine_name(e.node);
    else j["rank"] = e.rank;
    if (!e.reason.empty()) j["reason"] = e.reason;
    if (e.type == TraceEventType::ProcessCrash) {
      j["exit_code"] = e.exit_code;
      if (e.signal) j["signal"] = e.signal;
    }
    if (e.type == TraceEventType::Slowdown) j["factor"] = e.slowdown_permille / 1000.0;
    if (e.memory_needed_permille) j["memory_needed"] = e.memory_needed_permille / 1000.0;
    if (e.duration)
      j[e.type == TraceEventType::Slowdown || e.type == TraceEventType::Pause ? "duration"
        : e.memory_needed_permille                                            ? "recur_after"
                                                                              : "repair"] = dur(e.duration);
    out += j.dump() + "\n";
  }
  return out;
}

std::vector<TraceEvent> generate_failures(const Trace& t, uint64_t seed) {
  std::vector<TraceEvent> out;
  Rng rng(seed);
  const double horizon_h = static_cast<double>(t.job.duration) / static_cast<double>(kHour);
  for (const FailureRate& r : t.rates) {
    const double per_hour = r.per_node_hour * t.cluster.nodes;
    if (per_hour <= 0 || horizon_h <= 0) continue;
    double at_h = 0;
    while (true) {
      at_h += rng.exponential(1.0 / per_hour);
      if (at_h >= horizon_h) break;
      TraceEvent e;
      e.t = static_cast<Time>(at_h * 3600e6) * kMicrosecond;  // the format's resolution
      e.type = r.type;
      e.rank = static_cast<int32_t>(rng.below(static_cast<uint64_t>(t.cluster.nodes)));
      e.reason = r.reason;
      e.exit_code = r.exit_code;
      e.duration = r.duration;
      out.push_back(std::move(e));
    }
  }
  // Stable: equal times keep cause order, so the result depends on the seed alone.
  std::stable_sort(out.begin(), out.end(), [](const TraceEvent& a, const TraceEvent& b) { return a.t < b.t; });
  return out;
}

}  // namespace goodput
