#include "sim/fit.h"

#include <algorithm>
#include <boost/math/distributions/chi_squared.hpp>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

namespace goodput {
namespace {

double exposure_of(const Trace& t) {
  if (t.cluster.node_hours > 0) return t.cluster.node_hours;
  return static_cast<double>(t.cluster.nodes) * static_cast<double>(t.job.duration) / static_cast<double>(kHour);
}

FailureKind kind_of(TraceEventType t) {
  switch (t) {
    case TraceEventType::ProcessCrash: return FailureKind::ProcessExit;
    case TraceEventType::Hang:
    case TraceEventType::Pause: return FailureKind::Hang;
    case TraceEventType::Maintenance: return FailureKind::Maintenance;
    default: return FailureKind::NodeLost;
  }
}

bool is_failure(TraceEventType t) {
  return t == TraceEventType::NodeFailure || t == TraceEventType::ProcessCrash || t == TraceEventType::Hang ||
         t == TraceEventType::Maintenance;
}

template <class T>
T most_common(const std::map<T, int64_t>& counts) {
  T best{};
  int64_t n = -1;
  for (const auto& [v, c] : counts)  // ordered: a tie goes to the smallest value
    if (c > n) best = v, n = c;
  return best;
}

Duration median(std::vector<Duration> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string sci(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

}  // namespace

std::pair<double, double> poisson_interval(int64_t k, double exposure, double confidence) {
  if (exposure <= 0) return {0, 0};
  const double alpha = 1 - confidence;
  const double lo = k == 0 ? 0.0
                           : boost::math::quantile(boost::math::chi_squared(2.0 * static_cast<double>(k)), alpha / 2) / 2;
  const double hi = boost::math::quantile(boost::math::chi_squared(2.0 * static_cast<double>(k + 1)), 1 - alpha / 2) / 2;
  return {lo / exposure, hi / exposure};
}

TraceFit fit_traces(const std::vector<Trace>& traces, const std::vector<bool>& from_log, bool by_reason) {
  TraceFit fit;
  const DiagnosisTable table = DiagnosisTable::defaults();
  struct Acc {
    int64_t count = 0;
    std::map<std::string, int64_t> reasons;
    std::map<int32_t, int64_t> exit_codes;
    std::vector<Duration> durations;
  };
  std::map<std::tuple<TraceEventType, Diagnosis, std::string>, Acc> causes;
  std::map<int32_t, std::pair<double, int64_t>> by_size;  // nodes -> node-hours, failures
  std::vector<Duration> restart, scheduling, rendezvous, exit_detection, heartbeat, hang;
  for (size_t i = 0; i < traces.size(); ++i) {
    const Trace& t = traces[i];
    const double hours = exposure_of(t);
    fit.sources.push_back(t.path.empty() ? t.name : t.path);
    fit.node_hours += hours;
    fit.largest_nodes = std::max(fit.largest_nodes, t.cluster.nodes);
    fit.longest = std::max(fit.longest, t.job.duration);
    auto& size = by_size[t.cluster.job_nodes > 0 ? t.cluster.job_nodes : t.cluster.nodes];
    size.first += hours;
    if (t.events.empty()) {  // a header of counted rates (an earlier fit, a published summary): its counts
      for (const FailureRate& r : t.rates) {
        if (r.count <= 0) continue;
        FailureObserved f;
        f.kind = kind_of(r.type);
        f.exit_code = r.type == TraceEventType::ProcessCrash ? r.exit_code : 0;
        f.reason = r.reason;
        Acc& a = causes[{r.type, table.diagnose(f).diagnosis, by_reason ? r.reason : std::string()}];
        a.count += r.count;
        a.reasons[r.reason] += r.count;
        a.exit_codes[r.exit_code] += r.count;
        if (r.type == TraceEventType::Pause) a.durations.push_back(r.duration);
        if (is_failure(r.type)) size.second += r.count, fit.failures += r.count;
      }
    }
    for (const TraceEvent& e : t.events) {
      if (!is_failure(e.type) && e.type != TraceEventType::Pause) continue;
      FailureObserved f;
      f.kind = kind_of(e.type);
      f.exit_code = e.type == TraceEventType::ProcessCrash ? e.exit_code : 0;
      f.signal = e.signal;
      f.reason = e.reason;
      const Diagnosis d = table.diagnose(f).diagnosis;
      Acc& a = causes[{e.type, d, by_reason ? e.reason : std::string()}];
      ++a.count;
      ++a.reasons[e.reason];
      ++a.exit_codes[e.exit_code];
      if (e.type == TraceEventType::Pause) a.durations.push_back(e.duration);
      if (is_failure(e.type)) ++size.second, ++fit.failures;
    }
    if (i < from_log.size() && from_log[i]) {
      ++fit.logs;
      restart.push_back(t.job.process_restart);
      scheduling.push_back(t.job.node_scheduling);
      rendezvous.push_back(t.job.rendezvous);
      exit_detection.push_back(t.job.exit_detection);
      heartbeat.push_back(t.job.heartbeat_timeout);
      hang.push_back(t.job.hang_timeout);
    }
  }
  if (fit.node_hours <= 0) throw TraceError("nothing to fit: the inputs cover no node-hours (duration 0?)");
  fit.cost_model = traces.front().job;
  fit.cluster = traces.front().cluster;
  fit.cost_model.measured_process_restart.clear();
  fit.cost_model.measured_rendezvous.clear();
  if (fit.logs > 0) {
    fit.cost_model.process_restart = median(restart);
    fit.cost_model.node_scheduling = median(scheduling);
    fit.cost_model.rendezvous = median(rendezvous);
    fit.cost_model.exit_detection = median(exit_detection);
    fit.cost_model.heartbeat_timeout = median(heartbeat);
    fit.cost_model.hang_timeout = median(hang);
  }
  for (auto& [key, a] : causes) {
    CauseFit c;
    c.type = std::get<0>(key);
    c.diagnosis = std::get<1>(key);
    c.reason = most_common(a.reasons);
    c.exit_code = most_common(a.exit_codes);
    c.duration = median(a.durations);
    c.count = a.count;
    c.per_node_hour = static_cast<double>(a.count) / fit.node_hours;
    std::tie(c.lo, c.hi) = poisson_interval(a.count, fit.node_hours);
    fit.causes.push_back(std::move(c));
  }
  const double pooled = static_cast<double>(fit.failures) / fit.node_hours;
  if (by_size.size() > 1) {
    for (const auto& [nodes, v] : by_size) {
      SizeFit s;
      s.nodes = nodes;
      s.node_hours = v.first;
      s.failures = v.second;
      const double job_hours = v.first / nodes;
      if (s.failures > 0) {
        s.mtbf_hours = job_hours / static_cast<double>(s.failures);
        const auto [lo, hi] = poisson_interval(s.failures, job_hours);
        s.lo_hours = 1 / hi;
        s.hi_hours = lo > 0 ? 1 / lo : 0;
      }
      if (pooled > 0) s.predicted_hours = 1 / (pooled * nodes);
      fit.sizes.push_back(s);
    }
  }
  return fit;
}

Trace fitted_header(const TraceFit& fit) {
  Trace t;
  t.name = "failure rates fitted by goodput trace fit";
  t.source = "goodput trace fit of";
  for (const std::string& s : fit.sources) t.source += " " + s;
  t.source += " (" + fixed(fit.node_hours, 1) + " node-hours, " + std::to_string(fit.failures) + " failures)";
  t.cluster = fit.cluster;
  t.cluster.node_hours = 0;
  t.cluster.nodes = std::max(fit.largest_nodes, 1);
  t.job = fit.cost_model;
  t.job.name = "job";
  t.job.total_steps = 0;  // the rates, not the recorded job's end: a drawn trace runs to its horizon
  t.job.duration = std::max(fit.longest, kHour);
  for (const CauseFit& c : fit.causes) {
    FailureRate r;
    r.type = c.type;
    r.reason = c.reason;
    r.per_node_hour = c.per_node_hour;
    r.exit_code = c.exit_code;
    r.duration = c.duration;
    r.count = c.count;
    r.ci_lo = c.lo;
    r.ci_hi = c.hi;
    t.rates.push_back(std::move(r));
  }
  return t;
}

std::string fit_text(const TraceFit& fit) {
  std::string out = "fitted over " + fixed(fit.node_hours, 1) + " node-hours, " + std::to_string(fit.failures) +
                    " failures, from " + std::to_string(fit.sources.size()) + " input(s)";
  if (fit.logs > 0) out += " (" + std::to_string(fit.logs) + " event log(s): the cost model is their medians)";
  out += "\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-13s %-20s %7s %12s %25s  %s\n", "type", "diagnosis", "count", "per node-h",
                "95% interval", "reason (most common)");
  out += line;
  for (const CauseFit& c : fit.causes) {
    const std::string interval = "[" + sci(c.lo) + ", " + sci(c.hi) + "]";
    std::string reason = c.reason.size() > 60 ? c.reason.substr(0, 57) + "..." : c.reason;
    if (c.type == TraceEventType::Pause) reason += " (median " + format_duration(c.duration) + ")";
    std::snprintf(line, sizeof line, "%-13s %-20s %7lld %12s %25s  %s\n", std::string(to_string(c.type)).c_str(),
                  std::string(to_string(c.diagnosis)).c_str(), static_cast<long long>(c.count), sci(c.per_node_hour).c_str(),
                  interval.c_str(), reason.c_str());
    out += line;
  }
  if (!fit.sizes.empty()) {
    out += "\njob MTBF by size (job hours per failure; predicted: the pooled per-node rate, MTBF ∝ 1/nodes)\n";
    std::snprintf(line, sizeof line, "%7s %12s %9s %11s %25s %11s\n", "nodes", "node-hours", "failures", "MTBF h",
                  "95% interval", "predicted");
    out += line;
    for (const SizeFit& s : fit.sizes) {
      const std::string interval =
          s.failures ? "[" + fixed(s.lo_hours, 2) + ", " + (s.hi_hours > 0 ? fixed(s.hi_hours, 2) : "inf") + "]" : "-";
      std::snprintf(line, sizeof line, "%7d %12s %9lld %11s %25s %11s\n", s.nodes, fixed(s.node_hours, 1).c_str(),
                    static_cast<long long>(s.failures), s.failures ? fixed(s.mtbf_hours, 2).c_str() : "-", interval.c_str(),
                    s.predicted_hours > 0 ? fixed(s.predicted_hours, 2).c_str() : "-");
      out += line;
    }
  }
  return out;
}

}  // namespace goodput
