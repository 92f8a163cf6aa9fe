#include "sim/paper.h"

#include <cmath>
#include <fstream>
#include <sstream>

namespace goodput {

Trace trace_from_paper(const PaperTraceOptions& o) {
  std::ifstream in(o.paper_path);
  if (!in) throw TraceError(o.paper_path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json p;
  try {
    p = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw TraceError(o.paper_path + ": not valid JSON: " + e.what());
  }
  auto fail = [&](const std::string& field, const std::string& what) {
    return TraceError(o.paper_path + ": field '" + field + "' " + what);
  };
  auto number = [&](const nlohmann::json& j, const char* key, const std::string& path) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number()) throw fail(path + key, "is missing or not a number");
    return j[key].get<double>();
  };
  const nlohmann::json& job = p.contains("job") ? p["job"] : nlohmann::json();
  const double paper_gpus = number(job, "accelerators", "job.");
  const double per_node = number(job, "gpus_per_node", "job.");
  const double paper_days = number(job, "days", "job.");
  if (paper_gpus <= 0 || per_node <= 0 || paper_days <= 0) throw fail("job", "needs positive accelerators, gpus_per_node, days");
  const double paper_node_hours = paper_gpus / per_node * paper_days * 24.0;

  Trace t;
  t.name = std::string(p.value("job", nlohmann::json::object()).value("model", "paper")) + " failure statistics";
  t.source = p.value("source", "");
  t.cluster.accelerators_per_node = static_cast<int32_t>(per_node);
  const double gpus = o.accelerators > 0 ? o.accelerators : paper_gpus;
  t.cluster.nodes = static_cast<int32_t>(std::ceil(gpus / per_node));
  t.cluster.spare_nodes = o.spare_nodes >= 0 ? o.spare_nodes : std::max(1, t.cluster.nodes / 64);
  t.cluster.repair_time = o.repair_time;
  t.job = o.job;
  t.job.duration = static_cast<Duration>((o.days > 0 ? o.days : paper_days) * static_cast<double>(kDay));

  if (!p.contains("unexpected_by_cause") || !p["unexpected_by_cause"].is_array())
    throw fail("unexpected_by_cause", "is missing or not a list");
  const auto& causes = p["unexpected_by_cause"];
  for (size_t i = 0; i < causes.size(); ++i) {
    const std::string at = "unexpected_by_cause[" + std::to_string(i) + "].";
    const auto& c = causes[i];
    const double count = number(c, "count", at);
    if (!c.contains("kind") || !c["kind"].is_string()) throw fail(at + "kind", "is missing");
    if (!c.contains("component") || !c["component"].is_string()) throw fail(at + "component", "is missing");
    const std::string kind = c["kind"];
    FailureRate r;
    r.reason = c["component"].get<std::string>();
    // Our reading of each kind (see the paper file's note): how the failure shows itself.
    if (kind == "hardware") r.type = TraceEventType::NodeFailure;
    else if (kind == "software") r.type = TraceEventType::ProcessCrash;
    else if (kind == "maintenance") r.type = TraceEventType::Maintenance;
    else if (kind == "unknown") r.type = TraceEventType::Hang;
    else throw fail(at + "kind", "is '" + kind + "'; expected hardware, software, maintenance or unknown");
    r.per_node_hour = count / paper_node_hours;
    t.rates.push_back(r);
  }
  if (p.contains("interruptions_planned") && p["interruptions_planned"].is_number()) {
    FailureRate r;
    r.type = TraceEventType::Maintenance;
    r.reason = "planned: " + p.value("interruptions_planned_cause", std::string("maintenance"));
    r.per_node_hour = p["interruptions_planned"].get<double>() / paper_node_hours;
    t.rates.push_back(r);
  }
  t.events = generate_failures(t, o.seed);
  return t;
}

}  // namespace goodput
