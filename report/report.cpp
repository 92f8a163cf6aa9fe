#include "report/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/event_json.h"

namespace goodput {
namespace {

std::string pct(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f%%", v * 100.0);
  return b;
}

double share(Duration part, Duration whole) { return whole > 0 ? static_cast<double>(part) / static_cast<double>(whole) : 0.0; }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  // Nearest rank.
  size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  k = std::clamp<size_t>(k, 1, v.size());
  return v[k - 1];
}

}  // namespace

Report make_report(const JobState& s) {
  Report r;
  r.job = s.job().job;
  r.policy = s.job().policy;
  r.end_reason = s.finished() ? s.finish_reason() : "running";
  r.gave_up = s.gave_up();
  r.gave_up_after = s.gave_up() ? s.gave_up_at() - s.start_time() : 0;
  r.gave_up_reason = s.gave_up_because();
  r.nodes = s.job().nodes;
  r.accelerators = s.job().nodes * s.job().accelerators_per_node;
  r.wall = s.wall();
  r.productive = s.productive();
  for (int i = 0; i < kLossCount; ++i) r.loss[i] = s.loss(static_cast<Loss>(i));
  r.goodput = share(r.productive, r.wall);
  r.accelerator_goodput = s.accelerator_ns_held() > 0 ? s.accelerator_ns_productive() / s.accelerator_ns_held() : 0.0;
  r.steps = s.steps_done();
  r.failures = s.failures();
  for (int i = 0; i < kDiagnosisCount; ++i) r.by_diagnosis[i] = s.failures_by(static_cast<Diagnosis>(i));
  for (int i = 0; i < kRecoveryActionCount; ++i) r.by_action[i] = s.decisions_by(static_cast<RecoveryAction>(i));
  r.restarts = s.restarts();
  r.scale_changes = s.scale_changes();
  r.checkpoints_memory = s.checkpoints_saved(Tier::Memory);
  r.checkpoints_storage = s.checkpoints_saved(Tier::Storage);
  r.checkpoints_persisted = s.checkpoints_persisted();
  r.checkpoints_replicated = s.checkpoints_replicated();
  for (int i = 0; i < kTierCount; ++i) r.restores[i] = s.restores_from(static_cast<Tier>(i));
  r.events = s.last_seq();
  return r;
}

nlohmann::ordered_json report_json(const Report& r) {
  nlohmann::ordered_json j;
  j["job"] = r.job;
  j["policy"] = r.policy;
  j["end"] = r.end_reason;
  j["gave_up"] = r.gave_up;
  if (r.gave_up) {
    j["gave_up_after_ns"] = r.gave_up_after;
    j["gave_up_reason"] = r.gave_up_reason;
  }
  j["nodes"] = r.nodes;
  j["accelerators"] = r.accelerators;
  j["wall_ns"] = r.wall;
  j["productive_ns"] = r.productive;
  j["goodput"] = r.goodput;
  j["accelerator_goodput"] = r.accelerator_goodput;
  auto& losses = j["losses_ns"] = nlohmann::ordered_json::object();
  for (int i = 0; i < kLossCount; ++i) losses[std::string(to_string(static_cast<Loss>(i)))] = r.loss[i];
  j["steps"] = r.steps;
  j["failures"] = r.failures;
  auto& diag = j["failures_by_diagnosis"] = nlohmann::ordered_json::object();
  for (int i = 0; i < kDiagnosisCount; ++i) diag[std::string(to_string(static_cast<Diagnosis>(i)))] = r.by_diagnosis[i];
  auto& act = j["decisions_by_action"] = nlohmann::ordered_json::object();
  for (int i = 0; i < kRecoveryActionCount; ++i) act[std::string(to_string(static_cast<RecoveryAction>(i)))] = r.by_action[i];
  j["restarts"] = r.restarts;
  j["scale_changes"] = r.scale_changes;
  j["checkpoints"] = {{"memory", r.checkpoints_memory},
                      {"storage", r.checkpoints_storage},
                      {"persisted", r.checkpoints_persisted},
                      {"replicated", r.checkpoints_replicated}};
  // Which tier each restore read: the peer tier is what checkpoint.replicas buys.
  j["restores"] = {{"memory", r.restores[static_cast<size_t>(Tier::Memory)]},
                   {"peer", r.restores[static_cast<size_t>(Tier::Peer)]},
                   {"storage", r.restores[static_cast<size_t>(Tier::Storage)]},
                   {"scratch", r.restores[static_cast<size_t>(Tier::None)]}};
  j["events"] = r.events;
  return j;
}

std::string report_text(const Report& r) {
  std::string o;
  char b[256];
  std::snprintf(b, sizeof b, "Job %s (%d nodes, %d accelerators), policy %s, ended: %s\n", r.job.c_str(), r.nodes,
                r.accelerators, r.policy.c_str(), r.end_reason.c_str());
  o += b;
  if (r.gave_up) {
    std::snprintf(b, sizeof b, "  GAVE UP after %s and %d failures", format_duration(r.gave_up_after).c_str(), r.failures);
    o += b;
    if (r.loss[static_cast<size_t>(Loss::GaveUp)] >= kMillisecond) {  // a simulated horizon, not a live end
      std::snprintf(b, sizeof b, ": the remaining %s of its wall time are charged as gave_up",
                    format_duration(r.wall - r.gave_up_after).c_str());
      o += b;
    }
    o += "\n    why: " + r.gave_up_reason + "\n";
  }
  std::snprintf(b, sizeof b, "  goodput              %s   (accelerator-weighted %s)\n", pct(r.goodput).c_str(),
                pct(r.accelerator_goodput).c_str());
  o += b;
  std::snprintf(b, sizeof b, "  wall time            %s\n", format_duration(r.wall).c_str());
  o += b;
  std::snprintf(b, sizeof b, "  productive             %-16s %8s\n", format_duration(r.productive).c_str(),
                pct(share(r.productive, r.wall)).c_str());
  o += b;
  o += "  lost to\n";
  for (int i = 0; i < kLossCount; ++i) {
    std::snprintf(b, sizeof b, "    %-20s %-16s %8s\n", std::string(to_string(static_cast<Loss>(i))).c_str(),
                  format_duration(r.loss[i]).c_str(), pct(share(r.loss[i], r.wall)).c_str());
    o += b;
  }
  std::snprintf(b, sizeof b, "  steps kept           %lld\n", static_cast<long long>(r.steps));
  o += b;
  std::snprintf(b, sizeof b, "  failures             %d:", r.failures);
  o += b;
  bool any = false;
  for (int i = 0; i < kDiagnosisCount; ++i) {
    if (!r.by_diagnosis[i]) continue;
    std::snprintf(b, sizeof b, " %s %d", std::string(to_string(static_cast<Diagnosis>(i))).c_str(), r.by_diagnosis[i]);
    o += (any ? "," : "") + std::string(b);
    any = true;
  }
  o += "\n  decisions           ";
  for (int i = 0; i < kRecoveryActionCount; ++i) {
    std::snprintf(b, sizeof b, " %s %d", std::string(to_string(static_cast<RecoveryAction>(i))).c_str(), r.by_action[i]);
    o += b;
  }
  std::snprintf(b, sizeof b, "\n  restarts %d, scale changes %d\n", r.restarts, r.scale_changes);
  o += b;
  std::snprintf(b, sizeof b, "  checkpoints          %lld to memory (%lld persisted), %lld to storage\n",
                static_cast<long long>(r.checkpoints_memory), static_cast<long long>(r.checkpoints_persisted),
                static_cast<long long>(r.checkpoints_storage));
  o += b;
  if (r.checkpoints_replicated > 0) {
    std::snprintf(b, sizeof b, "                       %lld copied to peers\n", static_cast<long long>(r.checkpoints_replicated));
    o += b;
  }
  std::snprintf(b, sizeof b, "  restores             %lld from memory, %lld from peers, %lld from storage, %lld from scratch\n",
                static_cast<long long>(r.restores[static_cast<size_t>(Tier::Memory)]),
                static_cast<long long>(r.restores[static_cast<size_t>(Tier::Peer)]),
                static_cast<long long>(r.restores[static_cast<size_t>(Tier::Storage)]),
                static_cast<long long>(r.restores[static_cast<size_t>(Tier::None)]));
  o += b;
  std::snprintf(b, sizeof b, "  events               %llu\n", static_cast<unsigned long long>(r.events));
  o += b;
  return o;
}

Summary summarize(const std::string& label, const std::vector<Report>& runs) {
  Summary s;
  s.label = label;
  s.runs = static_cast<int>(runs.size());
  if (runs.empty()) return s;
  std::vector<double> g;
  for (const Report& r : runs) {
    g.push_back(r.goodput);
    s.goodput_mean += r.goodput;
    s.accelerator_goodput_mean += r.accelerator_goodput;
    s.failures_mean += r.failures;
    s.gave_up_share += r.gave_up ? 1.0 : 0.0;
    for (int i = 0; i < kLossCount; ++i) s.loss_share_mean[i] += share(r.loss[i], r.wall);
  }
  const double n = static_cast<double>(runs.size());
  s.goodput_mean /= n;
  s.accelerator_goodput_mean /= n;
  s.failures_mean /= n;
  s.gave_up_share /= n;
  for (double& v : s.loss_share_mean) v /= n;
  s.goodput_p5 = percentile(g, 0.05);
  s.goodput_p50 = percentile(g, 0.50);
  s.goodput_p95 = percentile(g, 0.95);
  return s;
}

nlohmann::ordered_json summary_json(const Summary& s) {
  nlohmann::ordered_json j;
  j["label"] = s.label;
  j["runs"] = s.runs;
  j["goodput_mean"] = s.goodput_mean;
  j["goodput_p5"] = s.goodput_p5;
  j["goodput_p50"] = s.goodput_p50;
  j["goodput_p95"] = s.goodput_p95;
  j["accelerator_goodput_mean"] = s.accelerator_goodput_mean;
  j["failures_mean"] = s.failures_mean;
  j["gave_up_share"] = s.gave_up_share;
  auto& l = j["loss_share_mean"] = nlohmann::ordered_json::object();
  for (int i = 0; i < kLossCount; ++i) l[std::string(to_string(static_cast<Loss>(i)))] = s.loss_share_mean[i];
  return j;
}

std::string summaries_text(const std::vector<Summary>& rows, const std::string& first_column) {
  size_t w = first_column.size();
  for (const Summary& s : rows) w = std::max(w, s.label.size());
  std::string o;
  char b[512];
  std::snprintf(b, sizeof b, "%-*s %5s %9s %9s %9s %9s %9s %8s  %s\n", static_cast<int>(w), first_column.c_str(), "runs",
                "goodput", "p5", "p95", "accel", "failures", "gave up", "largest losses");
  o += b;
  for (const Summary& s : rows) {
    // The three largest losses, by mean share of wall time.
    std::array<int, kLossCount> idx{};
    for (int i = 0; i < kLossCount; ++i) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int c) { return s.loss_share_mean[a] > s.loss_share_mean[c]; });
    std::string top;
    for (int k = 0; k < 3; ++k) {
      if (s.loss_share_mean[idx[k]] <= 0) break;
      top += (k ? ", " : "") + std::string(to_string(static_cast<Loss>(idx[k]))) + " " + pct(s.loss_share_mean[idx[k]]);
    }
    char gave_up[16];
    std::snprintf(gave_up, sizeof gave_up, "%.0f%%", s.gave_up_share * 100.0);
    if (s.gave_up_share > 0 && s.gave_up_share < 0.005) std::snprintf(gave_up, sizeof gave_up, "<1%%");
    std::snprintf(b, sizeof b, "%-*s %5d %9s %9s %9s %9s %9.1f %8s  %s\n", static_cast<int>(w), s.label.c_str(), s.runs,
                  pct(s.goodput_mean).c_str(), pct(s.goodput_p5).c_str(), pct(s.goodput_p95).c_str(),
                  pct(s.accelerator_goodput_mean).c_str(), s.failures_mean, gave_up, top.c_str());
    o += b;
  }
  return o;
}

}  // namespace goodput
