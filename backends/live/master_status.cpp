#include "backends/live/master_status.h"

#include <sstream>

#include "report/html.h"
#include "report/report.h"
#include "report/timeline.h"

namespace goodput::live {

namespace {
// The nodes by what they do: holding a slot and training (every trainer of the node), holding a
// slot otherwise, or spare.
struct NodeCounts {
  int training = 0, not_training = 0, spare = 0;
};
NodeCounts count_nodes(const World& world) {
  NodeCounts c;
  for (const auto& [id, n] : world.nodes()) {
    if (n.gone) continue;
    if (n.slot < 0) ++c.spare;
    else if (n.trainer.phase == "training") ++c.training;
    else ++c.not_training;
  }
  return c;
}
}  // namespace

nlohmann::ordered_json status_of(const LiveMaster& m, bool with_nodes) {
  const JobState& s = m.state();
  const World& world = m.world();
  const Report r = make_report(s);
  nlohmann::ordered_json out;
  out["job"] = m.spec().job;
  out["phase"] = std::string(to_string(s.phase()));
  if (s.finished()) out["finish_reason"] = r.end_reason;
  out["step"] = m.newest_step();
  if (const Node* rank0 = world.size() > 0 ? world.holder(0) : nullptr; rank0 && rank0->trainer.loss)
    out["loss"] = *rank0->trainer.loss;  // rank 0's latest loss, if its trainer reports one
  out["total_steps"] = m.spec().total_steps;
  out["restart"] = m.restart().restart;
  out["world_size"] = world.size();
  out["replicas"] = replica_counts(world.groups(), world.size());
  // The step a restart from storage (a scale, a lost node) goes back to; null: none yet.
  if (const CheckpointRef& c = s.checkpoints().newest_in_storage(); c.valid) out["storage_step"] = c.step;
  else out["storage_step"] = nullptr;
  out["goodput"] = r.goodput;
  out["wall_s"] = static_cast<double>(r.wall) / kSecond;
  out["productive_s"] = static_cast<double>(r.productive) / kSecond;
  out["failures"] = r.failures;
  // The newest recovery and why (diagnosis, the failure behind it, the rule); null: none yet.
  if (const auto& last = m.last_recovery())
    out["last_failure"] = {{"diagnosis", std::string(to_string(last->decision.diagnosis))},
                           {"action", std::string(to_string(last->decision.action))},
                           {"message", last->note}};
  else
    out["last_failure"] = nullptr;
  out["events"] = s.last_seq();
  if (const ShardLedger& shards = m.shards(); shards.total() > 0)
    out["shards"] = {{"total", shards.total()}, {"done", shards.done()}, {"queued", shards.queued()},
                     {"duplicates", shards.duplicates()}};
  out["nodes_training"] = count_nodes(world).training;
  if (!with_nodes) return out;
  auto& nodes = out["nodes"] = nlohmann::ordered_json::array();
  const Time now = m.now();
  for (const auto& [id, n] : world.nodes()) {
    if (n.gone) continue;
    nodes.push_back({{"node", id},
                     {"name", n.name},
                     {"host", n.host},
                     {"slot", n.slot},
                     {"heartbeat_age_s", static_cast<double>(now - n.last_heartbeat) / kSecond},
                     {"check", m.checks().state_of(id)},
                     {"trainer", {{"restart", n.trainer.restart}, {"phase", n.trainer.phase}, {"pid", n.trainer.pid},
                                  {"step", n.trainer.step}, {"work_median_s", n.trainer.work_median_s}}}});
    if (n.trainer.processes > 1) {  // each of the node's trainer processes, as its agent reported it
      nodes.back()["trainer"]["processes"] = n.trainer.processes;
      if (!n.trainer.ranks.is_null()) nodes.back()["trainer"]["ranks"] = n.trainer.ranks;
    }
    if (!n.persist_error.empty()) nodes.back()["persist_error"] = n.persist_error;
    if (!n.replica_error.empty()) nodes.back()["replica_error"] = n.replica_error;
  }
  return out;
}

std::string page_of(const LiveMaster& m) {
  // The replay report's page, folded from the log as it stands, reloading itself every 5 s.
  TimelineSink sink;
  m.store().for_each([&](const Event& e) { sink.append(e); });
  std::string html = report_html(make_report(sink.state), sink.finish(), "Goodput live: " + m.spec().job);
  if (const auto head = html.find("<head>"); head != std::string::npos)
    html.insert(head + 6, "<meta http-equiv=\"refresh\" content=\"5\">");
  return html;
}

std::string metrics_of(const LiveMaster& m, const net::HttpRefusals& t) {
  const JobState& s = m.state();
  const Report r = make_report(s);
  std::ostringstream o;
  o.precision(9);
  o << "# HELP goodput_ratio Share of wall time spent on training progress that was kept.\n"
       "# TYPE goodput_ratio gauge\n"
    << "goodput_ratio " << r.goodput << "\n"
    << "# HELP goodput_wall_seconds Wall time of the job so far.\n# TYPE goodput_wall_seconds gauge\n"
    << "goodput_wall_seconds " << static_cast<double>(r.wall) / kSecond << "\n"
    << "# HELP goodput_productive_seconds Training time that was kept.\n# TYPE goodput_productive_seconds gauge\n"
    << "goodput_productive_seconds " << static_cast<double>(r.productive) / kSecond << "\n"
    << "# HELP goodput_lost_seconds Time lost, by cause.\n# TYPE goodput_lost_seconds gauge\n";
  for (int l = 0; l < kLossCount; ++l)
    o << "goodput_lost_seconds{cause=\"" << to_string(static_cast<Loss>(l)) << "\"} "
      << static_cast<double>(r.loss[l]) / kSecond << "\n";
  o << "# HELP goodput_failures_total Failures, by diagnosis.\n# TYPE goodput_failures_total counter\n";
  for (int d = 0; d < kDiagnosisCount; ++d)
    o << "goodput_failures_total{diagnosis=\"" << to_string(static_cast<Diagnosis>(d)) << "\"} " << r.by_diagnosis[d] << "\n";
  o << "# HELP goodput_recoveries_total Recovery decisions, by action.\n# TYPE goodput_recoveries_total counter\n";
  for (int a = 0; a < kRecoveryActionCount; ++a)
    o << "goodput_recoveries_total{action=\"" << to_string(static_cast<RecoveryAction>(a)) << "\"} " << r.by_action[a] << "\n";
  o << "# HELP goodput_restarts_total Restarts of the whole job.\n# TYPE goodput_restarts_total counter\n"
    << "goodput_restarts_total " << r.restarts << "\n";
  const NodeCounts nodes = count_nodes(m.world());
  o << "# HELP goodput_nodes Nodes, by state.\n# TYPE goodput_nodes gauge\n"
    << "goodput_nodes{state=\"training\"} " << nodes.training << "\n"
    << "goodput_nodes{state=\"not_training\"} " << nodes.not_training << "\n"
    << "goodput_nodes{state=\"spare\"} " << nodes.spare << "\n"
    << "# HELP goodput_step Newest training step any trainer reported.\n# TYPE goodput_step gauge\n"
    << "goodput_step " << m.newest_step() << "\n"
    << "# HELP goodput_node_checks_total Node check results (one per node and round), by verdict.\n"
    << "# TYPE goodput_node_checks_total counter\n";
  for (const char* v : {"passed", "suspect", "faulty", "straggler"}) {
    const auto it = m.checks().verdict_counts().find(v);
    o << "goodput_node_checks_total{verdict=\"" << v << "\"} " << (it == m.checks().verdict_counts().end() ? 0 : it->second)
      << "\n";
  }
  o << "# HELP goodput_api_unauthorized_total Agent API requests refused for a missing or wrong token.\n"
    << "# TYPE goodput_api_unauthorized_total counter\n"
    << "goodput_api_unauthorized_total " << m.refusals().token << "\n";
  // Every refusal by reason: the token's, the handlers' (400), and the HTTP server's own (before any
  // handler saw a request).
  o << "# HELP goodput_api_refused_total Requests the master refused, by reason.\n"
    << "# TYPE goodput_api_refused_total counter\n";
  const std::pair<const char*, uint64_t> reasons[] = {
      {"token", static_cast<uint64_t>(m.refusals().token)}, {"bad_request", static_cast<uint64_t>(m.refusals().bad_request)},
      {"body_too_large", t.body_too_large},           {"headers_too_large", t.headers_too_large},
      {"malformed_http", t.malformed},                {"slow_request", t.slow_request}};
  for (const auto& [reason, n] : reasons) o << "goodput_api_refused_total{reason=\"" << reason << "\"} " << n << "\n";
  return o.str();
}

std::string recovery_note(const World& world, const RecoveryDecided& d, const FailureObserved* last_failure) {
  const Node* n = world.node(d.node);
  std::string o = "node " + (n ? n->name : std::to_string(d.node));
  if (n && n->slot >= 0) o += " (slot " + std::to_string(n->slot) + ")";
  o += ": " + std::string(to_string(d.diagnosis));
  if (last_failure && last_failure->node == d.node) {
    const FailureObserved& f = *last_failure;
    o += " (" + std::string(to_string(f.kind));
    if (f.kind == FailureKind::ProcessExit) o += ", exit code " + std::to_string(f.exit_code);
    if (f.signal) o += ", signal " + std::to_string(f.signal);
    if (!f.reason.empty()) o += ": " + f.reason.substr(0, 200);
    o += ")";
  }
  o += " -> " + std::string(to_string(d.action)) + " [" + d.rule + "]";
  if (d.backoff > 0) o += " after " + format_duration(d.backoff);
  return o;
}

}  // namespace goodput::live
