#include "sim/trace_import.h"

#include "sim/fit.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <unordered_map>
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

// One line of a CSV file (RFC 4180 quoting within the line: "a,b" and "" for a quote). nullopt:
// an unterminated quote.
std::optional<std::vector<std::string>> split_csv(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c != '"') out.back() += c;
      else if (i + 1 < line.size() && line[i + 1] == '"') out.back() += '"', ++i;
      else quoted = false;
    } else if (c == '"' && out.back().empty()) {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  if (quoted) return std::nullopt;
  return out;
}

// Seconds as a decimal ("2081336.0"); nullopt unless it is one, in [0, 1e9).
std::optional<int64_t> seconds_ns(const std::string& s) {
  if (s.empty() || s.size() > 32 || s.find_first_not_of("0123456789.") != std::string::npos || s.front() == '.') return std::nullopt;
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !(v >= 0) || v >= 1e9) return std::nullopt;
  return static_cast<int64_t>(std::llround(v * 1e9));
}

std::optional<int64_t> count_of(const std::string& s, int64_t max) {
  if (s.empty() || s.size() > 12 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  const int64_t v = std::stoll(s);
  if (v > max) return std::nullopt;
  return v;
}

// A delimited file read line by line: blank lines skipped, CR stripped, UTF-8 checked; ',' is CSV
// (its quoting undone), any other separator splits as it stands (sacct's '|').
class CsvLines {
 public:
  explicit CsvLines(const std::string& file, char sep = ',') : file_(file), in_(file), sep_(sep) {
    if (!in_) throw TraceError(file + ": cannot open");
  }
  bool next(std::vector<std::string>& fields) {
    std::string line;
    while (std::getline(in_, line)) {
      ++line_;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      if (!valid_utf8(line)) throw error("not valid UTF-8 text");
      if (sep_ != ',') {
        fields = split(line, sep_);
        return true;
      }
      auto f = split_csv(line);
      if (!f) throw error("a quoted field is not closed");
      fields = std::move(*f);
      return true;
    }
    return false;
  }
  TraceError error(const std::string& what) const { return TraceError(file_ + ":" + std::to_string(line_) + ": " + what); }
  TraceError field(const std::string& name, const std::string& what) const { return error("field '" + name + "' " + what); }
  int line() const { return line_; }

 private:
  std::string file_;
  std::ifstream in_;
  char sep_;
  int line_ = 0;
};

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

void TraceBuilder::ran(const std::vector<std::string>& hosts, int32_t job_nodes, double node_hours_run) {
  node_hours += node_hours_run;
  machines.insert(hosts.begin(), hosts.end());
  if (job_nodes <= 0) return;
  size_hours[job_nodes] += node_hours_run;
  size_machines[job_nodes].insert(hosts.begin(), hosts.end());
}

std::vector<int32_t> TraceBuilder::sizes() const {
  std::vector<int32_t> s;  // a failure's job ran first (ran() precedes its event), so its size is here
  for (const auto& [n, unused] : size_hours) s.push_back(n);
  return s;
}

Trace TraceBuilder::build(Duration step_time, int32_t job_nodes) const {
  if (first_ns == INT64_MAX) throw TraceError(source + ": nothing in it to make a trace of");
  Trace t;
  t.name = name;
  t.source = source;
  std::set<std::string> names = machines;
  if (job_nodes > 0) {
    const auto it = size_machines.find(job_nodes);
    names = it != size_machines.end() ? it->second : std::set<std::string>{};
    for (const ImportedEvent& e : events)
      if (e.job_nodes == job_nodes && !e.machine.empty()) names.insert(e.machine);
    t.name += " (jobs of " + std::to_string(job_nodes) + " nodes)";
    t.cluster.job_nodes = job_nodes;
    const auto h = size_hours.find(job_nodes);
    t.cluster.node_hours = h != size_hours.end() ? h->second : 0;
  } else {
    t.cluster.node_hours = node_hours;
  }
  std::map<std::string, int32_t> index;
  for (const std::string& m : names) index.emplace(m, static_cast<int32_t>(index.size()));
  t.cluster.nodes = std::max({int32_t{1}, static_cast<int32_t>(index.size()), min_nodes, job_nodes});
  t.job.step_time = step_time;
  const Duration span = ((last_ns - first_ns + 999) / 1000) * 1000;  // the format's microseconds, rounded up
  t.job.duration = std::max<Duration>(span, kSecond);
  std::vector<const ImportedEvent*> order;
  for (const ImportedEvent& e : events)
    if (job_nodes == 0 || e.job_nodes == job_nodes) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->unix_ns < b->unix_ns; });
  for (const ImportedEvent* e : order) {
    TraceEvent ev = e->event;
    ev.t = ((e->unix_ns - first_ns) / 1000) * 1000;
    ev.node = e->machine.empty() ? -1 : index.at(e->machine);
    ev.rank = e->machine.empty() ? 0 : -1;  // no machine named: the job's first rank
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
  if (!machines.empty()) s += " on " + std::to_string(machines.size()) + " machines";
  else s += " (machines not named)";
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

TraceBuilder import_slurm(const std::vector<std::string>& files) {
  TraceBuilder b;
  b.name = "slurm history";
  b.source = "goodput trace import --from slurm";
  static const std::set<std::string> kNotFailures = {"COMPLETED", "RUNNING", "PENDING", "REQUEUED", "SUSPENDED",
                                                     "RESIZING", "TIMEOUT", "CANCELLED", "DEADLINE", "REVOKED",
                                                     "SPECIAL_EXIT", "STOPPED", "REQUEUE_FED", "REQUEUE_HOLD"};
  for (const std::string& file : files) {
    b.source += " " + file;
    CsvLines in(file, '|');
    std::map<std::string, size_t> col;
    size_t width = 0;
    auto fail = [&](const std::string& field, const std::string& what) { return in.field(field, what); };
    std::vector<std::string> g;
    while (in.next(g)) {
      if (col.empty()) {
        for (size_t i = 0; i < g.size(); ++i) col[g[i]] = i;
        width = g.size();
        for (const char* need : {"JobID", "State", "NodeList", "Start", "End"})
          if (!col.count(need))
            throw in.error(std::string("the header has no column '") + need +
                           "' (run sacct --parsable2 --format=JobID,State,ExitCode,NNodes,NodeList,Start,End)");
        continue;
      }
      // sacct --parsable2 ends no line with '|'; --parsable does: one empty field more.
      if (g.size() == width + 1 && g.back().empty()) g.pop_back();
      if (g.size() != width)
        throw in.error(std::to_string(g.size()) + " fields; the header has " + std::to_string(width));
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
      b.saw(*t0);
      if (end == "Unknown" || end.empty()) {
        b.machines.insert(hosts.begin(), hosts.end());
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
      b.ran(hosts, static_cast<int32_t>(std::min<int64_t>(nnodes, 1'000'000)), static_cast<double>(nnodes) * static_cast<double>(*t1 - *t0) / 3.6e12);
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
      e.job_nodes = static_cast<int32_t>(std::min<int64_t>(nnodes, 1'000'000));
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
  return b;
}


TraceBuilder import_pai2020(const std::vector<std::string>& files) {
  TraceBuilder b;
  b.name = "alibaba pai 2020 history";
  b.source = "goodput trace import --from pai2020";
  static const std::vector<std::string> kColumns = {"job_name", "task_name", "inst_name", "worker_name", "inst_id",
                                                    "status",   "start_time", "end_time",  "machine"};
  struct Job {
    int32_t instances = 0;
    double node_hours = 0;
    std::set<std::string> machines;
    std::vector<size_t> failed;  // indices into b.events
  };
  std::unordered_map<std::string, Job> jobs;
  std::vector<std::string> job_of;  // b.events[i]'s job
  for (const std::string& file : files) {
    b.source += " " + file;
    CsvLines in(file);
    std::vector<std::string> f;
    bool any = false;
    while (in.next(f)) {
      if (!any && f == kColumns) {  // a header line someone prepended: fine
        any = true;
        continue;
      }
      any = true;
      if (f.size() != kColumns.size())
        throw in.error(std::to_string(f.size()) + " fields; pai_instance_table has " + std::to_string(kColumns.size()) +
                       " (job_name,task_name,inst_name,worker_name,inst_id,status,start_time,end_time,machine): is this "
                       "the instance table?");
      const std::string &job = f[0], &task = f[1], &status = f[5], &start = f[6], &end = f[7], &machine = f[8];
      if (job.empty()) throw in.field("job_name", "is empty");
      Job& j = jobs[job];
      ++j.instances;
      if (status == "Waiting" || start.empty() || machine.empty()) {
        ++b.skipped["instances that never started"];
        continue;
      }
      const auto t0 = seconds_ns(start);
      if (!t0) throw in.field("start_time", "is not seconds: '" + start + "'");
      b.saw(*t0);
      b.machines.insert(machine);
      j.machines.insert(machine);
      if (status == "Running" || end.empty()) {
        ++b.skipped["still running (no exposure counted)"];
        continue;
      }
      const auto t1 = seconds_ns(end);
      if (!t1) throw in.field("end_time", "is not seconds: '" + end + "'");
      if (*t1 < *t0) throw in.field("end_time", "is before start_time");
      b.saw(*t1);
      j.node_hours += static_cast<double>(*t1 - *t0) / 3.6e12;
      if (status == "Terminated") continue;
      if (status == "Interrupted") {
        ++b.skipped["Interrupted (stopped by a user or the scheduler)"];
        continue;
      }
      if (status != "Failed") throw in.field("status", "is '" + status + "', not Terminated, Failed, Running, Waiting or Interrupted");
      ImportedEvent e;
      e.unix_ns = *t1;
      e.machine = machine;
      e.event.type = TraceEventType::ProcessCrash;
      e.event.exit_code = 1;
      e.event.reason = "pai Failed instance, task " + task + " on " + machine + " (job " + job;  // its size is known at the end
      j.failed.push_back(b.events.size());
      job_of.push_back(job);
      b.events.push_back(std::move(e));
    }
  }
  // A job's size is its instance count, known once every row is read.
  std::vector<std::pair<std::string, const Job*>> ordered;  // by name: the builder's sums do not depend on hashing
  for (const auto& [name, j] : jobs) ordered.emplace_back(name, &j);
  std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [name, j] : ordered) {
    const int32_t size = std::min(j->instances, 1'000'000);
    b.ran({j->machines.begin(), j->machines.end()}, size, j->node_hours);
    for (size_t i : j->failed) {
      b.events[i].job_nodes = size;
      b.events[i].event.reason += ", " + std::to_string(size) + " instances)";
    }
  }
  return b;
}

namespace {

bool acme_summary_header(const std::vector<std::string>& f) {
  return std::find(f.begin(), f.end(), "fail_rate_gpu") != f.end();
}

}  // namespace

bool is_acme_summary(const std::string& file) {
  CsvLines in(file);
  std::vector<std::string> f;
  return in.next(f) && acme_summary_header(f);
}

TraceBuilder import_acme(const std::vector<std::string>& files) {
  TraceBuilder b;
  b.name = "acmetrace history";
  b.source = "goodput trace import --from acme";
  for (const std::string& file : files) {
    b.source += " " + file;
    CsvLines in(file);
    std::vector<std::string> f;
    if (!in.next(f)) throw TraceError(file + ": empty (no header line)");
    if (acme_summary_header(f))
      throw TraceError(file + ": this is AcmeTrace's cluster_summary.csv; import it alone, with --cluster NAME");
    std::map<std::string, size_t> col;
    for (size_t i = 0; i < f.size(); ++i) col[f[i]] = i;
    for (const char* need : {"job_id", "node_num", "gpu_num", "state", "start_time", "end_time"})
      if (!col.count(need)) throw in.error(std::string("the header has no column '") + need + "' (is this trace_seren.csv or trace_kalos.csv?)");
    const size_t width = f.size();
    while (in.next(f)) {
      if (f.size() != width)
        throw in.error(std::to_string(f.size()) + " fields; the header has " + std::to_string(width));
      auto get = [&](const char* name) -> const std::string& {
        static const std::string none;
        return col.count(name) ? f[col.at(name)] : none;
      };
      const std::string& job = get("job_id");
      if (job.empty()) throw in.field("job_id", "is empty");
      const auto nodes = count_of(get("node_num"), 1'000'000);
      if (!nodes) throw in.field("node_num", "is not a count: '" + get("node_num") + "'");
      const auto gpus = count_of(get("gpu_num"), 1'000'000'000);
      if (!gpus) throw in.field("gpu_num", "is not a count: '" + get("gpu_num") + "'");
      const std::string& state = get("state");
      if (state.empty()) throw in.field("state", "is empty");
      if (*gpus == 0) {
        ++b.skipped["CPU jobs"];
        continue;
      }
      if (*nodes == 0) throw in.field("node_num", "is 0 for a job with GPUs");
      const std::string &start = get("start_time"), &end = get("end_time");
      if (start.empty()) {
        ++b.skipped["jobs that never started"];
        continue;
      }
      const auto t0 = parse_timestamp_ns(start);
      if (!t0) throw in.field("start_time", "is not a time: '" + start + "'");
      b.saw(*t0);
      b.min_nodes = std::max(b.min_nodes, static_cast<int32_t>(*nodes));
      if (end.empty()) {
        ++b.skipped["still running (no exposure counted)"];
        continue;
      }
      const auto t1 = parse_timestamp_ns(end);
      if (!t1) throw in.field("end_time", "is not a time: '" + end + "'");
      if (*t1 < *t0) throw in.field("end_time", "is before start_time");
      b.saw(*t1);
      const auto size = static_cast<int32_t>(*nodes);
      b.ran({}, size, static_cast<double>(size) * static_cast<double>(*t1 - *t0) / 3.6e12);
      if (state == "COMPLETED") continue;
      if (state == "CANCELLED" || state == "TIMEOUT") {
        ++b.skipped[state + " (ended by a user or its limit)"];
        continue;
      }
      ImportedEvent e;
      e.unix_ns = *t1;
      if (const std::string& ft = get("fail_time"); !ft.empty()) {  // Kalos: when the failure happened
        const auto tf = parse_timestamp_ns(ft);
        if (!tf) throw in.field("fail_time", "is not a time: '" + ft + "'");
        if (*tf < *t0 || *tf > *t1) throw in.field("fail_time", "is outside the job's start_time..end_time");
        e.unix_ns = *tf;
      }
      e.job_nodes = size;
      const std::string what = " (job " + job + ", " + std::to_string(size) + " nodes, " + std::to_string(*gpus) + " GPUs)";
      if (state == "FAILED") {
        e.event.type = TraceEventType::ProcessCrash;
        e.event.exit_code = 1;
        e.event.reason = "acme FAILED" + what;
      } else if (state == "NODE_FAIL") {
        e.event.type = TraceEventType::NodeFailure;
        e.event.reason = "acme NODE_FAIL: node crash" + what;
      } else {
        throw in.field("state", "is '" + state + "', not COMPLETED, CANCELLED, FAILED, TIMEOUT or NODE_FAIL");
      }
      b.events.push_back(std::move(e));
    }
  }
  return b;
}

Trace import_acme_summary(const std::string& file, const std::string& cluster, int32_t gpus_per_node, std::string* summary) {
  CsvLines in(file);
  std::vector<std::string> f;
  if (!in.next(f) || !acme_summary_header(f)) throw TraceError(file + ": not AcmeTrace's cluster_summary.csv (no fail_rate_gpu column)");
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < f.size(); ++i) col[f[i]] = i;
  for (const char* need : {"id", "gpu_job_num", "fail_rate_gpu", "complete_gpu_time", "cancel_gpu_time", "fail_gpu_time",
                           "max_run_time_gpu", "max_gpu"})
    if (!col.count(need)) throw in.error(std::string("the header has no column '") + need + "'");
  const size_t width = f.size();
  std::vector<std::string> names;
  while (in.next(f)) {
    if (f.size() != width) throw in.error(std::to_string(f.size()) + " fields; the header has " + std::to_string(width));
    names.push_back(f[col.at("id")]);
    if (f[col.at("id")] != cluster) continue;
    auto number = [&](const char* name, double max) {
      const std::string& v = f[col.at(name)];
      if (v.empty()) throw in.field(name, "is empty: the summary gives no such figure for " + cluster);
      double x = 0;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
      if (v.empty() || ec != std::errc() || end != v.data() + v.size() || !(x >= 0) || x > max)
        throw in.field(name, "is not a number in [0, " + std::to_string(static_cast<int64_t>(max)) + "]: '" + v + "'");
      return x;
    };
    const double jobs = number("gpu_job_num", 1e12), share = number("fail_rate_gpu", 1);
    const double gpu_seconds = number("complete_gpu_time", 1e18) + number("cancel_gpu_time", 1e18) + number("fail_gpu_time", 1e18);
    const double longest = number("max_run_time_gpu", 1e9), largest = number("max_gpu", 1e9);
    const double node_hours = gpu_seconds / 3600 / gpus_per_node;
    if (node_hours <= 0) throw in.field("complete_gpu_time", "and the other GPU times sum to 0: no exposure");
    Trace t;
    t.name = "acmetrace " + cluster + " summary";
    t.source = "goodput trace import --from acme " + file + " --cluster " + cluster +
               " (job-level: failed GPU jobs over GPU time / " + std::to_string(gpus_per_node) + " GPUs per node)";
    t.cluster.nodes = std::max<int32_t>(1, static_cast<int32_t>(std::min(1e6, std::ceil(largest / gpus_per_node))));
    t.cluster.accelerators_per_node = gpus_per_node;
    t.cluster.node_hours = node_hours;
    t.job.duration = std::max<Duration>(kHour, static_cast<Duration>(longest) * kSecond);
    FailureRate r;
    r.type = TraceEventType::ProcessCrash;
    r.reason = "acme FAILED GPU jobs, " + cluster + " (job-level shares: user errors included)";
    r.exit_code = 1;
    r.count = std::llround(jobs * share);  // the share is printed to 3 places: the count is good to +-0.05% of the jobs
    r.per_node_hour = static_cast<double>(r.count) / node_hours;
    std::tie(r.ci_lo, r.ci_hi) = poisson_interval(r.count, node_hours);
    t.rates.push_back(r);
    if (summary) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "%lld failed GPU jobs of %.0f over %.1f node-hours (%.3g per node-hour); no events, causes, sizes or times: a header of one counted rate",
                    static_cast<long long>(r.count), jobs, node_hours, r.per_node_hour);
      *summary = buf;
    }
    return t;
  }
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  throw TraceError(file + ": no cluster '" + cluster + "' (it has " + list + "; pick one with --cluster)");
}

}  // namespace goodput
