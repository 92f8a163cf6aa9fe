#include "import/kube_history.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>

#include "backends/kubernetes/kube_nodes.h"
#include "sim/trace_import.h"

namespace goodput::kube {
namespace {

using json = nlohmann::json;

const json& at(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}
std::string text(const json& j, const char* key) {
  const json& v = at(j, key);
  return v.is_string() ? v.get<std::string>() : "";
}
const json& items(const json& j, const char* key) {
  static const json kEmpty = json::array();
  const json& v = at(j, key);
  return v.is_array() ? v : kEmpty;
}

// The number after `key` in a reason the live backend wrote ("... exitCode=137 signal=9 ..."), or 0.
int32_t number_after(const std::string& s, const std::string& key) {
  const size_t i = s.find(key);
  if (i == std::string::npos) return 0;
  size_t j = i + key.size();
  int32_t v = 0;
  bool neg = j < s.size() && s[j] == '-';
  if (neg) ++j;
  for (; j < s.size() && std::isdigit(static_cast<unsigned char>(s[j])) && v < 100000; ++j) v = v * 10 + (s[j] - '0');
  return neg ? -v : v;
}

class History {
 public:
  History() {
    b_.name = "kubernetes history";
    b_.source = "goodput trace import --from k8s";
  }

  void read(const std::string& file) {
    file_ = file;
    b_.source += " " + file;
    std::ifstream in(file);
    if (!in) throw TraceError(file + ": cannot open");
    std::string line;
    line_ = 0;
    // A watch stream: one frame per line. Anything else: one JSON document.
    std::string first;
    std::streampos start = in.tellg();
    int first_line = 0;
    while (std::getline(in, line)) {
      ++first_line;
      if (line.find_first_not_of(" \t\r") != std::string::npos) {
        first = line;
        break;
      }
    }
    const json probe = json::parse(first, nullptr, false);
    if (probe.is_object() && probe.contains("type") && probe.contains("object")) {
      line_ = first_line;
      frame(probe);
      while (std::getline(in, line)) {
        ++line_;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        json j;
        try {
          j = json::parse(line);
        } catch (const json::exception& e) {
          throw fail(std::string("not valid JSON (a cut frame?): ") + e.what());
        }
        frame(j);
      }
      return;
    }
    in.clear();
    in.seekg(start);
    // One document, read as a stream: each item of a list that names its own kind (kubectl prints
    // them so) is taken as the parser finishes it and then dropped, so a dump of a whole cluster's
    // pods never sits in memory as one tree. Items without a kind wait for the list's.
    std::string top_key;
    const json::parser_callback_t take = [&](int depth, json::parse_event_t event, json& parsed) {
      if (event == json::parse_event_t::key && depth == 1) top_key = parsed.get<std::string>();
      if (event == json::parse_event_t::object_end && depth == 2 && top_key == "items" && parsed.is_object() &&
          parsed.contains("kind")) {
        object(parsed, "");
        return false;
      }
      return true;
    };
    json j;
    try {
      j = json::parse(in, take);
    } catch (const json::parse_error& e) {
      std::ifstream again(file);
      line_ = 1;
      for (size_t i = 0; i < e.byte && again; ++i)
        if (again.get() == '\n') ++line_;
      throw fail(std::string("not valid JSON: ") + e.what());
    } catch (const json::exception& e) {
      throw fail(std::string("not valid JSON: ") + e.what());
    }
    line_ = 0;
    document(j);
  }

  TraceBuilder finish() {
    // A pod's exposure: from its start to its end, or to the last moment the history shows.
    for (const auto& [key, span] : spans_) {
      if (span.start == INT64_MAX) continue;
      const int64_t end = span.end != INT64_MIN ? span.end : b_.last_ns;
      if (end > span.start) b_.node_hours += static_cast<double>(end - span.start) / 3.6e12;
    }
    return std::move(b_);
  }

 private:
  struct Span {
    std::string machine;
    int64_t start = INT64_MAX, end = INT64_MIN;
  };

  TraceError fail(const std::string& what) const {
    return TraceError(file_ + (line_ > 0 ? ":" + std::to_string(line_) : "") + ": " + what);
  }

  // A timestamp field, strictly: absent is nullopt; present and not a time is an error.
  std::optional<int64_t> time(const json& obj, const char* key, const std::string& path, const std::string& whose) {
    const json& v = at(obj, key);
    if (v.is_null()) return std::nullopt;
    const auto t = v.is_string() ? parse_timestamp_ns(v.get<std::string>()) : std::nullopt;
    if (!t) throw fail("field '" + path + key + "' of " + whose + ": not a time: " + v.dump());
    b_.saw(*t);
    return t;
  }

  void add(const std::string& key, int64_t ns, TraceEventType type, const std::string& machine, std::string reason,
           int32_t exit_code = 1, int32_t signal = 0) {
    if (!seen_.insert(key).second) return;  // the same failure in another frame or file
    ImportedEvent e;
    e.unix_ns = ns;
    e.machine = machine;
    e.event.type = type;
    e.event.reason = std::move(reason);
    e.event.exit_code = exit_code;
    e.event.signal = signal;
    b_.machines.insert(machine);
    b_.events.push_back(std::move(e));
  }

  void frame(const json& f) {
    const std::string type = text(f, "type");
    if (type == "BOOKMARK") return;
    if (type == "ERROR") {
      ++b_.skipped["watch ERROR frames (410 Expired and kin: a gap the stream does not cover)"];
      return;
    }
    if (type != "ADDED" && type != "MODIFIED" && type != "DELETED")
      throw fail("field 'type': '" + type + "' is not a watch event type (ADDED, MODIFIED, DELETED, BOOKMARK, ERROR)");
    object(at(f, "object"), "");
  }

  void document(const json& j) {
    if (!j.is_object()) throw fail("not a Kubernetes object or list (a JSON object with 'kind')");
    const std::string kind = text(j, "kind");
    if (kind == "List" || kind == "PodList" || kind == "NodeList" || kind == "EventList") {
      const std::string item_kind = kind == "List" ? "" : kind.substr(0, kind.size() - 4);
      for (const json& item : items(j, "items")) object(item, item_kind);
      return;
    }
    object(j, "");
  }

  void object(const json& o, const std::string& kind_of_list) {
    if (!o.is_object()) throw fail("an item is not an object");
    const std::string kind = text(o, "kind").empty() ? kind_of_list : text(o, "kind");
    if (kind == "Pod") pod(o);
    else if (kind == "Node") node(o);
    else if (kind == "Event") event(o);
    else if (kind.empty()) throw fail("field 'kind' is missing (a Pod, Node or Event, or a list of them)");
    else ++b_.skipped["objects of kind " + kind];
  }

  void pod(const json& p) {
    const json& meta = at(p, "metadata");
    const std::string name = text(meta, "name");
    if (name.empty()) throw fail("field 'metadata.name' of a pod is missing");
    const std::string key = text(meta, "namespace") + "/" + name;
    const std::string whose = "pod " + key;
    const std::string machine = text(at(p, "spec"), "nodeName");
    const json& status = at(p, "status");
    const auto created = time(meta, "creationTimestamp", "metadata.", whose);
    if (machine.empty()) {
      if (unscheduled_.insert(key).second) ++b_.skipped["pods never scheduled"];
      return;
    }
    b_.machines.insert(machine);
    Span& span = spans_[key];
    span.machine = machine;
    if (auto s = time(status, "startTime", "status.", whose)) span.start = std::min(span.start, *s);
    else if (created) span.start = std::min(span.start, *created);
    int64_t latest = span.start == INT64_MAX ? INT64_MIN : span.start;
    bool ended = false;
    for (const char* group : {"initContainerStatuses", "containerStatuses"}) {
      for (const json& cs : items(status, group)) {
        for (const char* state : {"state", "lastState"}) {
          const json& term = at(at(cs, state), "terminated");
          if (!term.is_object()) continue;
          const std::string path = std::string("status.") + group + "[].";
          if (auto f = time(term, "finishedAt", path + state + ".terminated.", whose)) {
            latest = std::max(latest, *f);
            if (std::string(state) == "state" && std::string(group) == "containerStatuses") ended = true;
          }
        }
      }
    }
    std::optional<int64_t> disrupted;
    std::string disruption;
    for (const json& c : items(status, "conditions")) {
      const auto t = time(c, "lastTransitionTime", "status.conditions[].", whose);
      if (t) latest = std::max(latest, *t);
      if (text(c, "type") == "DisruptionTarget" && text(c, "status") == "True" && t) {
        disrupted = t;
        disruption = text(c, "reason") + ": " + text(c, "message");
      }
    }
    const std::string phase = text(status, "phase");
    if (ended && (phase == "Failed" || phase == "Succeeded") && latest != INT64_MIN) span.end = std::max(span.end, latest);
    if (disrupted) {  // evicted or preempted: its container's exit is the consequence
      add(key + "|disrupted", *disrupted, TraceEventType::Maintenance, machine,
          "pod " + key + " on " + machine + " DisruptionTarget (" + disruption + ")");
      return;
    }
    const auto trouble = pod_trouble(p);
    if (!trouble || trouble->reason == "pod completed") return;
    const int64_t when = latest != INT64_MIN ? latest : b_.last_ns;
    if (when == INT64_MIN) throw fail(whose + " failed and has no time in it (status.startTime, a finishedAt)");
    if (trouble->fatal) {
      if (seen_.insert(key + "|config").second) ++b_.skipped["configuration errors (" + trouble->reason.substr(0, 60) + "...)"];
      return;
    }
    const std::string reason = "pod " + key + " on " + machine + ": " + trouble->reason;
    if (trouble->reason.rfind("pod Evicted", 0) == 0) {
      add(key + "|disrupted", when, TraceEventType::Maintenance, machine, reason);
      return;
    }
    const int32_t code = number_after(trouble->reason, "exitCode=");
    int32_t sig = number_after(trouble->reason, "signal=");
    if (sig == 0 && code > 128 && code < 160) sig = code - 128;
    // One failure per pod and moment: later frames of the same end (Failed, then DELETED without
    // its container statuses) say it again in other words.
    add(key + "|" + std::to_string(when), when, TraceEventType::ProcessCrash, machine, reason, code != 0 ? code : 1, sig);
  }

  void node(const json& n) {
    const json& meta = at(n, "metadata");
    const std::string name = text(meta, "name");
    if (name.empty()) throw fail("field 'metadata.name' of a node is missing");
    const std::string whose = "node " + name;
    b_.machines.insert(name);
    const auto created = time(meta, "creationTimestamp", "metadata.", whose);
    std::optional<int64_t> when;
    for (const json& c : items(at(n, "status"), "conditions")) {
      const auto t = time(c, "lastTransitionTime", "status.conditions[].", whose);
      if (t && (text(c, "type") == "Ready" || text(c, "type") == "DisruptionTarget")) when = when ? std::max(*when, *t) : *t;
    }
    if (!when) when = created;
    const auto trouble = node_trouble(n);
    bool& bad = bad_nodes_[name];
    if (trouble && !bad && when) {
      add("node|" + name + "|" + std::to_string(*when / kSecond), *when, TraceEventType::NodeFailure, name,
          "node " + name + ": " + *trouble);
    } else if (!trouble && bad && when) {
      add("ready|" + name + "|" + std::to_string(*when / kSecond), *when, TraceEventType::NodeReturn, name, "node " + name + " Ready");
    }
    bad = trouble.has_value();
  }

  void event(const json& e) {
    const json& obj = at(e, "involvedObject");
    const std::string kind = text(obj, "kind"), name = text(obj, "name"), reason = text(e, "reason");
    const std::string whose = "event " + text(at(e, "metadata"), "name");
    std::optional<int64_t> when = time(e, "lastTimestamp", "", whose);
    if (!when) when = time(e, "eventTime", "", whose);
    if (!when) when = time(e, "firstTimestamp", "", whose);
    if (!when) when = time(at(e, "metadata"), "creationTimestamp", "metadata.", whose);
    if (!when) throw fail("field 'lastTimestamp' of " + whose + " is missing (and eventTime, firstTimestamp)");
    if (const json& c = at(e, "count"); c.is_number_integer() && c.get<int64_t>() > 1)
      b_.skipped["repeats folded into an event's count (their times are not kept)"] += c.get<int64_t>() - 1;
    const std::string msg = text(e, "message");
    if (kind == "Node" && (reason == "NodeNotReady" || reason == "NodeReady")) {
      if (name.empty()) throw fail("field 'involvedObject.name' of " + whose + " is missing");
      const bool down = reason == "NodeNotReady";
      bad_nodes_[name] = down;
      add((down ? "node|" : "ready|") + name + "|" + std::to_string(*when / kSecond), *when,
          down ? TraceEventType::NodeFailure : TraceEventType::NodeReturn, name,
          "node " + name + ": event " + reason + ": " + msg);
      return;
    }
    if (kind == "Pod" && (reason == "Evicted" || reason == "Preempted" || reason == "Preempting")) {
      const std::string key = text(obj, "namespace") + "/" + name;
      std::string machine = text(at(e, "source"), "host");
      if (const auto it = spans_.find(key); machine.empty() && it != spans_.end()) machine = it->second.machine;
      if (machine.empty()) {
        ++b_.skipped["pod evictions on an unknown node (give the pods too, before the events)"];
        return;
      }
      add(key + "|disrupted", *when, TraceEventType::Maintenance, machine,
          "pod " + key + " on " + machine + ": event " + reason + " (preempted or evicted): " + msg);
      return;
    }
    ++b_.skipped["events of other reasons"];
  }

  TraceBuilder b_;
  std::string file_;
  int line_ = 0;
  std::set<std::string> seen_, unscheduled_;
  std::map<std::string, Span> spans_;
  std::map<std::string, bool> bad_nodes_;
};

}  // namespace

TraceBuilder import_history(const std::vector<std::string>& files) {
  History h;
  for (const std::string& f : files) h.read(f);
  return h.finish();
}

}  // namespace goodput::kube
