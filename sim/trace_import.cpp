#include "sim/trace_import.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>

namespace goodput {
namespace {

int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {  // proleptic Gregorian, 1970-01-01 = 0
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

bool digits(std::string_view s, size_t at, size_t n, int64_t& out) {
  if (at + n > s.size()) return false;
  out = 0;
  for (size_t i = at; i < at + n; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
    out = out * 10 + (s[i] - '0');
  }
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

// Whether s is well-formed UTF-8 (what a trace, JSON, must hold).
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    i += n;
  }
  return true;
}

}  // namespace

std::optional<int64_t> parse_timestamp_ns(std::string_view s) {
  int64_t y, mo, d, h, mi, sec;
  if (s.size() < 19 || !digits(s, 0, 4, y) || s[4] != '-' || !digits(s, 5, 2, mo) || s[7] != '-' || !digits(s, 8, 2, d) ||
      (s[10] != 'T' && s[10] != ' ') || !digits(s, 11, 2, h) || s[13] != ':' || !digits(s, 14, 2, mi) || s[16] != ':' ||
      !digits(s, 17, 2, sec))
    return std::nullopt;
  // Nanoseconds in 64 bits reach the year 2262: a history is well inside 1970..2200.
  if (y < 1970 || y > 2200 || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return std::nullopt;
  size_t i = 19;
  int64_t frac_ns = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    int64_t scale = 100'000'000;
    const size_t start = i;
    for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {
      frac_ns += (s[i] - '0') * scale;
      scale /= 10;
    }
    if (i == start) return std::nullopt;
  }
  int64_t offset_s = 0;
  if (i < s.size()) {
    if (s[i] == 'Z' && i + 1 == s.size()) {
      ++i;
    } else if ((s[i] == '+' || s[i] == '-') && s.size() == i + 6 && s[i + 3] == ':') {
      int64_t oh, om;
      if (!digits(s, i + 1, 2, oh) || !digits(s, i + 4, 2, om)) return std::nullopt;
      offset_s = (oh * 3600 + om * 60) * (s[i] == '+' ? 1 : -1);
      i = s.size();
    } else {
      return std::nullopt;
    }
  }
  const int64_t days = days_from_civil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d));
  return ((days * 86400 + h * 3600 + mi * 60 + sec) - offset_s) * 1'000'000'000 + frac_ns;
}

std::vector<std::string> expand_hostlist(std::string_view list) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < list.size()) {
    // One host expression: a prefix, then optionally [ranges], possibly more text.
    size_t end = i;
    int depth = 0;
    for (; end < list.size(); ++end) {
      if (list[end] == '[') ++depth;
      else if (list[end] == ']' && --depth < 0) throw TraceError("unbalanced ']' in hostlist '" + std::string(list) + "'");
      else if (list[end] == ',' && depth == 0) break;
    }
    if (depth != 0) throw TraceError("unbalanced '[' in hostlist '" + std::string(list) + "'");
    const std::string_view expr = list.substr(i, end - i);
    if (expr.empty()) throw TraceError("an empty host in hostlist '" + std::string(list) + "'");
    std::vector<std::string> hosts = {""};
    size_t j = 0;
    while (j < expr.size()) {
      if (expr[j] != '[') {
        const size_t next = std::min(expr.find('[', j), expr.size());
        for (auto& h : hosts) h += expr.substr(j, next - j);
        j = next;
        continue;
      }
      const size_t close = expr.find(']', j);
      std::vector<std::string> parts;
      for (const std::string& range : split(std::string(expr.substr(j + 1, close - j - 1)), ',')) {
        const size_t dash = range.find('-');
        const std::string a = range.substr(0, dash), b = dash == std::string::npos ? a : range.substr(dash + 1);
        auto all_digits = [](const std::string& x) {
          return !x.empty() && x.size() <= 9 && std::all_of(x.begin(), x.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
        };
        if (!all_digits(a) || !all_digits(b)) throw TraceError("bad range '" + range + "' in hostlist '" + std::string(list) + "'");
        const long lo = std::stol(a), hi = std::stol(b);
        if (hi < lo || hi - lo > 100000) throw TraceError("bad range '" + range + "' in hostlist '" + std::string(list) + "'");
        for (long v = lo; v <= hi; ++v) {
          std::string n = std::to_string(v);
          if (n.size() < a.size()) n.insert(0, a.size() - n.size(), '0');  // zero padding, as written
          parts.push_back(n);
        }
      }
      std::vector<std::string> grown;
      for (const auto& h : hosts)
        for (const auto& p : parts) grown.push_back(h + p);
      if (grown.size() > 1'000'000) throw TraceError("hostlist '" + std::string(list) + "' names too many hosts");
      hosts = std::move(grown);
      j = close + 1;
    }
    out.insert(out.end(), hosts.begin(), hosts.end());
    i = end + 1;
  }
  return out;
}

Trace TraceBuilder::build(Duration step_time) const {
  if (first_ns == INT64_MAX) throw TraceError(source + ": nothing in it to make a trace of");
  Trace t;
  t.name = name;
  t.source = source;
  std::map<std::string, int32_t> index;
  for (const auto& [m, unused] : machines) index.emplace(m, static_cast<int32_t>(index.size()));
  t.cluster.nodes = std::max<int32_t>(1, static_cast<int32_t>(index.size()));
  t.cluster.node_hours = node_hours;
  t.job.step_time = step_time;
  const Duration span = ((last_ns - first_ns + 999) / 1000) * 1000;  // the format's microseconds, rounded up
  t.job.duration = std::max<Duration>(span, kSecond);
  std::vector<const ImportedEvent*> order;
  for (const ImportedEvent& e : events) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->unix_ns < b->unix_ns; });
  for (const ImportedEvent* e : order) {
    TraceEvent ev = e->event;
    ev.t = ((e->unix_ns - first_ns) / 1000) * 1000;
    ev.node = index.at(e->machine);
    ev.rank = -1;
    t.events.push_back(std::move(ev));
  }
  return t;
}

std::string TraceBuilder::summary() const {
  std::map<std::string, int64_t> by_type;
  for (const auto& e : events) ++by_type[std::string(to_string(e.event.type))];
  std::string s = std::to_string(events.size()) + " failures";
  if (!by_type.empty()) {
    s += " (";
    bool first = true;
    for (const auto& [type, n] : by_type) s += (first ? "" : ", ") + std::to_string(n) + " " + type, first = false;
    s += ")";
  }
  s += " on " + std::to_string(machines.size()) + " machines";
  if (first_ns != INT64_MAX) s += " over " + format_duration(last_ns - first_ns);
  if (node_hours > 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f", node_hours);
    s += ", " + std::string(buf) + " node-hours";
  }
  if (!skipped.empty()) {
    s += "; not failures:";
    for (const auto& [why, n] : skipped) s += " " + std::to_string(n) + " " + why + ";";
    s.pop_back();
  }
  return s;
}

Trace import_slurm(const std::vector<std::string>& files, Duration step_time, std::string* summary) {
  TraceBuilder b;
  b.name = "slurm history";
  b.source = "goodput trace import --from slurm";
  static const std::set<std::string> kNotFailures = {"COMPLETED", "RUNNING", "PENDING", "REQUEUED", "SUSPENDED",
                                                     "RESIZING", "TIMEOUT", "CANCELLED", "DEADLINE", "REVOKED",
                                                     "SPECIAL_EXIT", "STOPPED", "REQUEUE_FED", "REQUEUE_HOLD"};
  for (const std::string& file : files) {
    b.source += " " + file;
    std::ifstream in(file);
    if (!in) throw TraceError(file + ": cannot open");
    std::string line;
    int lineno = 0;
    std::map<std::string, size_t> col;
    size_t width = 0;
    auto fail = [&](const std::string& field, const std::string& what) {
      return TraceError(file + ":" + std::to_string(lineno) + ": field '" + field + "' " + what);
    };
    while (std::getline(in, line)) {
      ++lineno;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      if (!valid_utf8(line)) throw TraceError(file + ":" + std::to_string(lineno) + ": not valid UTF-8 text");
      const std::vector<std::string> f = split(line, '|');
      if (col.empty()) {
        for (size_t i = 0; i < f.size(); ++i) col[f[i]] = i;
        width = f.size();
        for (const char* need : {"JobID", "State", "NodeList", "Start", "End"})
          if (!col.count(need))
            throw TraceError(file + ":" + std::to_string(lineno) + ": the header has no column '" + need +
                             "' (run sacct --parsable2 --format=JobID,State,ExitCode,NNodes,NodeList,Start,End)");
        continue;
      }
      // sacct --parsable2 ends no line with '|'; --parsable does: one empty field more.
      std::vector<std::string> g = f;
      if (g.size() == width + 1 && g.back().empty()) g.pop_back();
      if (g.size() != width)
        throw TraceError(file + ":" + std::to_string(lineno) + ": " + std::to_string(g.size()) + " fields; the header has " +
                         std::to_string(width));
      auto get = [&](const char* name) -> std::string { return col.count(name) ? g[col.at(name)] : ""; };
      const std::string job = get("JobID");
      if (job.empty()) throw fail("JobID", "is empty");
      if (job.find('.') != std::string::npos) {
        ++b.skipped["job steps (allocations only: sacct -X)"];
        continue;
      }
      const std::string state_text = get("State");
      const std::string state = state_text.substr(0, state_text.find(' '));
      if (state.empty()) throw fail("State", "is empty");
      const std::string start = get("Start"), end = get("End"), nodelist = get("NodeList");
      if (start == "Unknown" || start == "None" || start.empty() || nodelist == "None assigned" || nodelist.empty()) {
        ++b.skipped["allocations that never started"];
        continue;
      }
      const auto t0 = parse_timestamp_ns(start);
      if (!t0) throw fail("Start", "is not a time: '" + start + "'");
      std::vector<std::string> hosts;
      try {
        hosts = expand_hostlist(nodelist);
      } catch (const TraceError& e) {
        throw fail("NodeList", e.what());
      }
      for (const auto& h : hosts) b.machines[h] = true;
      b.saw(*t0);
      if (end == "Unknown" || end.empty()) {
        ++b.skipped["still running (no exposure counted)"];
        continue;
      }
      const auto t1 = parse_timestamp_ns(end);
      if (!t1) throw fail("End", "is not a time: '" + end + "'");
      if (*t1 < *t0) throw fail("End", "is before Start");
      b.saw(*t1);
      int64_t nnodes = static_cast<int64_t>(hosts.size());
      if (const std::string n = get("NNodes"); !n.empty()) {
        if (n.find_first_not_of("0123456789") != std::string::npos || n.size() > 9) throw fail("NNodes", "is not a count: '" + n + "'");
        nnodes = std::stoll(n);
      }
      b.node_hours += static_cast<double>(nnodes) * static_cast<double>(*t1 - *t0) / 3.6e12;
      int32_t exit_code = 0, signal = 0;
      if (const std::string ec = get("ExitCode"); !ec.empty()) {
        const size_t colon = ec.find(':');
        const std::string a = ec.substr(0, colon), s = colon == std::string::npos ? "0" : ec.substr(colon + 1);
        if (a.empty() || s.empty() || a.find_first_not_of("0123456789") != std::string::npos ||
            s.find_first_not_of("0123456789") != std::string::npos || a.size() > 3 || s.size() > 3)
          throw fail("ExitCode", "is not EXIT:SIGNAL: '" + ec + "'");
        exit_code = std::stoi(a);
        signal = std::stoi(s);
      }
      if (kNotFailures.count(state)) {
        if (state != "COMPLETED" && state != "RUNNING") ++b.skipped[state + " (ended by its limit, a user or the scheduler)"];
        continue;
      }
      ImportedEvent e;
      e.unix_ns = *t1;
      e.machine = hosts.front();  // Slurm does not say which of the job's nodes failed: the first
      const std::string where = " on " + hosts.front() + " (job " + job + ", " + std::to_string(nnodes) + " nodes)";
      if (state == "NODE_FAIL" || state == "BOOT_FAIL") {
        e.event.type = TraceEventType::NodeFailure;
        e.event.reason = "slurm " + state + where;
      } else if (state == "OUT_OF_MEMORY") {
        e.event.type = TraceEventType::ProcessCrash;
        e.event.reason = "slurm OUT_OF_MEMORY: out of memory" + where;
        e.event.exit_code = exit_code ? exit_code : 137;
        e.event.signal = signal;
      } else if (state == "PREEMPTED") {
        e.event.type = TraceEventType::Maintenance;
        e.event.reason = "slurm PREEMPTED: preempted" + where;
      } else if (state == "FAILED") {
        e.event.type = TraceEventType::ProcessCrash;
        e.event.reason = "slurm FAILED, exit " + std::to_string(exit_code) + ":" + std::to_string(signal) + where;
        e.event.exit_code = exit_code ? exit_code : 1;
        e.event.signal = signal;
      } else {
        throw fail("State", "is '" + state_text + "', not a Slurm job state this reads");
      }
      b.events.push_back(std::move(e));
    }
    if (col.empty()) throw TraceError(file + ": empty (no sacct header line)");
  }
  Trace t = b.build(step_time);
  if (summary) *summary = b.summary();
  return t;
}

}  // namespace goodput
