// The `goodput` command. Exit codes: 0 ok, 2 bad input (trace, policy, log, arguments), 1 internal error.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>

#include "cli/bench.h"
#include "cli/bench_api.h"
#include "cli/bench_zone.h"
#include "cli/ckpt.h"
#include "cli/k8s_convert.h"
#include "cli/operator.h"
#include "cli/vopr.h"
#include "cli/live.h"
#include "cli/torchrun.h"
#include "agent/checkpoint/flash_checkpoint.h"
#include "engine/event_json.h"
#include "engine/event_store.h"
#include "engine/json_reader.h"
#include "report/html.h"
#include "report/report.h"
#include "cli/trace_tools.h"
#include "sim/from_log.h"
#include "sim/montecarlo.h"
#include "sim/paper.h"
#include "sim/policy_file.h"
#include "sim/simulator.h"

namespace goodput {
namespace {

struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

PolicySet policy_from(const std::string& path) { return path.empty() ? default_policy() : load_policy_file(path); }

std::string policy_label(const PolicySet& p, const std::string& path) {
  if (p.name != "unnamed") return p.name;
  return path.empty() ? "default" : path;
}

// A one-line progress bar on stderr, only when stderr is a terminal.
std::function<void(int, int)> progress_bar(const std::string& what) {
  if (!::isatty(STDERR_FILENO)) return {};
  auto mu = std::make_shared<std::mutex>();
  return [mu, what](int done, int total) {
    std::lock_guard<std::mutex> lock(*mu);
    const int width = 30;
    const int fill = total ? done * width / total : width;
    std::fprintf(stderr, "\r%s [%.*s%*s] %d/%d runs", what.c_str(), fill, "##############################",
                 width - fill, "", done, total);
    if (done == total) std::fprintf(stderr, "\n");
  };
}

void check_format(const std::string& f) {
  if (f != "text" && f != "json") throw BadInput("--format must be text or json");
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw BadInput(path + ": cannot write");
  std::cerr << "wrote " << path << "\n";
}

int cmd_replay(const std::string& trace_path, const std::string& policy_path, uint64_t seed, bool resample,
               const std::string& events_path, const std::string& format, bool digest, const std::string& html,
               const std::string& from_log) {
  check_format(format);
  if (trace_path.empty() == from_log.empty()) throw BadInput("replay needs a TRACE or --from-log EVENTS.db (one of them)");
  const Trace trace = from_log.empty() ? load_trace(trace_path) : [&] {
    SqliteStore log(from_log, SqliteStore::Mode::OpenReadOnly);
    int64_t checks = 0;
    Trace t = trace_from_log(log, from_log, &checks);
    if (checks > 0)
      std::cerr << "goodput: note: " << checks << " node check(s) an operator asked for (goodput check) are not "
                << "replayed\n";
    return t;
  }();
  PolicySet policy = policy_from(policy_path);
  policy.name = policy_label(policy, policy_path);
  std::vector<EventSink*> sinks;
  std::unique_ptr<SqliteStore> store;
  DigestSink dig;
  if (!events_path.empty()) {
    store = std::make_unique<SqliteStore>(events_path, SqliteStore::Mode::Create, 4096);
    store->set_meta("trace", trace_path);
    store->set_meta("policy", policy.config.dump());
    store->set_meta("seed", std::to_string(seed));
    store->set_meta("created_by", "goodput replay");
    sinks.push_back(store.get());
  }
  if (digest) sinks.push_back(&dig);
  TimelineSink timeline;
  if (!html.empty()) sinks.push_back(&timeline);
  Simulator sim(trace, policy, SimOptions{seed, resample}, sinks);
  const Report r = make_report(sim.run());
  if (store) store->flush();
  if (!html.empty())
    write_file(html, report_html(r, timeline.finish(), "Goodput replay of " + (trace.name.empty() ? trace_path : trace.name)));
  if (format == "json") {
    auto j = report_json(r);
    if (digest) j["digest"] = dig.hex();
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << "Replay of " << (from_log.empty() ? trace_path : from_log) << " (" << sim.failures().size()
              << " failures, seed " << seed << ")\n"
              << report_text(r);
    if (digest) std::cout << "  digest               " << dig.hex() << "\n";
    if (store) std::cout << "  event log            " << events_path << "\n";
  }
  return 0;
}

int cmd_report(const std::string& db, const std::string& format, bool digest, const std::string& html) {
  if (format != "events") check_format(format);
  SqliteStore store(db, SqliteStore::Mode::OpenReadOnly);
  TimelineSink folded;
  const JobState& state = folded.state;
  DigestSink dig;
  const bool dump = format == "events";
  store.for_each([&](const Event& e) {  // one pass over the log, whatever is asked
    folded.append(e);
    if (digest) dig.append(e);
    if (dump) std::cout << event_to_line(e) << "\n";
  });
  if (!state.started()) throw BadInput(db + ": the log has no job_started event");
  const Report r = make_report(state);
  if (!html.empty()) write_file(html, report_html(r, folded.finish(), "Goodput report of " + db));
  if (dump) return 0;  // the lines were the output
  if (format == "json") {
    auto j = report_json(r);
    if (digest) j["digest"] = dig.hex();
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << "Report of " << db << "\n" << report_text(r);
    if (digest) std::cout << "  digest               " << dig.hex() << "\n";
  }
  return 0;
}

// The chain of observations and decisions about one node, and what the job did about them.
int cmd_explain(const std::string& db, const std::string& node) {
  SqliteStore store(db, SqliteStore::Mode::OpenReadOnly);
  std::vector<Event> events;
  std::map<std::string, NodeId> ids;
  store.for_each([&](const Event& e) {
    if (const auto* j = std::get_if<NodeJoined>(&e.payload)) ids[j->name] = j->node;
    events.push_back(e);
  });
  NodeId id = -1;
  if (auto it = ids.find(node); it != ids.end()) id = it->second;
  else if (!node.empty() && node.size() < 10 && node.find_first_not_of("0123456789") == std::string::npos) id = std::stoi(node);
  if (id < 0) {
    std::string known;
    for (const auto& [name, _] : ids) known += (known.empty() ? "" : ", ") + name;
    if (known.size() > 200) known = known.substr(0, 200) + "...";
    throw BadInput(db + ": no node '" + node + "' in the log (nodes: " + known + ")");
  }
  std::string name_of_id;  // status changes name the pod or Ray job, which is the node's name
  for (const auto& [n, i] : ids)
    if (i == id) name_of_id = n;
  const Time start = events.empty() ? 0 : events.front().time;
  auto at = [&](const Event& e) { return "T+" + format_duration(e.time - start) + "  #" + std::to_string(e.seq) + "  "; };
  std::cout << "Node " << node << " (id " << id << ") in " << db << "\n";
  int lines = 0;
  bool follow = false;  // after a decision about this node: show how the job came back
  for (const Event& e : events) {
    std::string line;
    std::visit(
        [&](const auto& p) {
          using T = std::decay_t<decltype(p)>;
          if constexpr (std::is_same_v<T, NodeJoined>) {
            if (p.node == id)
              line = (p.slot >= 0 ? "joined as slot " + std::to_string(p.slot) : std::string("joined as a spare")) +
                     (p.replica_type.empty() ? "" : " (" + p.replica_type + ")");
          } else if constexpr (std::is_same_v<T, FailureObserved>) {
            if (p.node == id)
              line = "observed " + std::string(to_string(p.kind)) + ": exit code " + std::to_string(p.exit_code) +
                     ", signal " + std::to_string(p.signal) + (p.reason.empty() ? "" : ", '" + p.reason + "'") +
                     "; progress had stopped " + format_duration(e.time - p.stalled_since) + " earlier";
          } else if constexpr (std::is_same_v<T, SlowdownObserved>) {
            if (p.node == id) line = "observed running at 1/" + format_seconds(p.slowdown_permille * kMillisecond).substr(0, 5) + " speed";
          } else if constexpr (std::is_same_v<T, NodeChecked>) {
            if (p.node == id)
              line = "checked (round " + std::to_string(p.round) + "): " + p.verdict + "; compute " +
                     std::to_string(p.compute_mflops) + " MFLOP/s" + (p.compute_ok ? "" : " WRONG RESULT") +
                     (p.peer >= 0 ? ", link to node " + std::to_string(p.peer) + " " +
                                        (p.link_ok ? std::to_string(p.link_mb_per_s) + " MB/s" : "FAILED")
                                  : "") +
                     (p.detail.empty() ? "" : " (" + p.detail + ")");
          } else if constexpr (std::is_same_v<T, StallObserved>) {
            if (p.node == id)
              line = std::string(p.resumed ? "moving again after a stall of " : "stalled (left alone) for ") +
                     format_duration(e.time - p.stalled_since) + ": " + p.reason;
          } else if constexpr (std::is_same_v<T, CheckRequested>) {
            if (std::find(p.nodes.begin(), p.nodes.end(), id) != p.nodes.end())
              line = std::string(p.waiting ? "check requested, to start after the next checkpoint: " : "checking: ") +
                     p.reason + (p.fault.empty() ? "" : " (fault drill: " + p.fault + ")");
          } else if constexpr (std::is_same_v<T, StatusObserved>) {
            if (p.name == name_of_id) line = p.object + " status: " + p.status;
          } else if constexpr (std::is_same_v<T, NodeReturned>) {
            if (p.node == id) line = "repaired, back in the pool of spares";
          } else if constexpr (std::is_same_v<T, ScaleDecided>) {
            if (std::find(p.released.begin(), p.released.end(), id) != p.released.end())
              line = "released: the " + p.group + " group shrank (world " + std::to_string(p.from) + " -> " +
                     std::to_string(p.to) + " nodes): " + p.reason;
          } else if constexpr (std::is_same_v<T, RecoveryDecided>) {
            if (p.node == id) {
              line = "decided: " + std::string(to_string(p.diagnosis)) + " by rule '" + p.rule + "' -> " +
                     std::string(to_string(p.action)) + " (failure " + std::to_string(p.attempt) + " of this node" +
                     (p.backoff ? ", backoff " + format_duration(p.backoff) : std::string()) +
                     (p.memory_permille != 1000 ? ", memory x" + format_seconds(p.memory_permille * kMillisecond).substr(0, 4) : std::string()) + ")";
              follow = true;
            }
          } else if constexpr (std::is_same_v<T, RestartJob>) {
            if (follow)
              line = "job: restart " + std::to_string(p.restart) + " of " + std::to_string(p.world_size) +
                     " nodes, restoring step " + std::to_string(p.restore_step) + " from " + std::string(to_string(p.restore_tier));
          } else if constexpr (std::is_same_v<T, CheckpointLoaded>) {
            if (follow) {
              line = "job: training again from step " + std::to_string(p.step) + " (" + std::string(to_string(p.tier)) +
                     ", loaded in " + format_duration(p.load_time) + ")";
              follow = false;
            }
          }
        },
        e.payload);
    if (!line.empty()) {
      std::cout << at(e) << line << "\n";
      ++lines;
    }
  }
  if (lines == 0) std::cout << "nothing in the log concerns this node\n";
  return 0;
}

struct MonteCarloArgs {
  uint64_t seed = 1;
  int runs = 100;
  int threads = 0;
};

int cmd_compare(const std::string& trace_path, const std::vector<std::string>& policies, const MonteCarloArgs& mc,
                const std::string& format, const std::string& html) {
  check_format(format);
  if (policies.size() < 2) throw BadInput("compare needs at least two --policy files");
  const Trace trace = load_trace(trace_path);
  std::vector<PolicySet> sets;
  for (const auto& p : policies) sets.push_back(load_policy_file(p));  // all policies checked before any run
  std::vector<Summary> rows;
  for (size_t i = 0; i < sets.size(); ++i) {
    MonteCarloOptions o{mc.seed, mc.runs, mc.threads, true, progress_bar(policies[i])};
    const std::string label = policy_label(sets[i], policies[i]);
    sets[i].name = label;
    rows.push_back(summarize(label, run_monte_carlo(trace, sets[i], o)));
  }
  if (!html.empty())
    write_file(html, summaries_html(rows, "Policies compared on " + (trace.name.empty() ? trace_path : trace.name) + " (" +
                                              std::to_string(mc.runs) + " runs each)",
                                    "policy", std::nullopt));
  if (format == "json") {
    nlohmann::ordered_json j;
    j["trace"] = trace_path;
    j["seed"] = mc.seed;
    j["runs"] = mc.runs;
    for (const auto& s : rows) j["policies"].push_back(summary_json(s));
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << "Compare on " << trace_path << " (" << mc.runs << " runs from seed " << mc.seed
              << (trace.rates.empty() ? ", the trace's own failures" : ", failures drawn from the trace's rates")
              << ")\n"
              << summaries_text(rows, "policy");
  }
  return 0;
}

// "checkpoint.interval=10m,20m,40m" -> path and values.
std::pair<std::string, std::vector<std::string>> parse_set(const std::string& s) {
  const auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
    throw BadInput("--set wants PATH=V1,V2,... (e.g. checkpoint.interval=10m,20m,40m), got '" + s + "'");
  std::vector<std::string> values;
  std::stringstream ss(s.substr(eq + 1));
  std::string v;
  while (std::getline(ss, v, ',')) {
    if (v.empty()) throw BadInput("--set '" + s + "' has an empty value");
    values.push_back(v);
  }
  return {s.substr(0, eq), values};
}

int cmd_sweep(const std::string& trace_path, const std::string& policy_path, const std::vector<std::string>& sets,
              const MonteCarloArgs& mc, const std::string& format, const std::string& html) {
  check_format(format);
  if (sets.empty()) throw BadInput("sweep needs at least one --set PATH=V1,V2,...");
  const Trace trace = load_trace(trace_path);
  if (trace.rates.empty() && mc.runs > 1)
    throw BadInput(trace_path + ": Monte Carlo needs 'failure_rates' in the trace header (or use --runs 1)");
  nlohmann::json base = policy_path.empty() ? default_policy().config : load_policy_file(policy_path).config;
  // Cartesian product of all --set lists, first --set varying slowest. A path under job. or
  // cluster. sets the trace's header (timeouts, spares, repair time); any other, the policy.
  struct Point {
    std::string label;
    nlohmann::json policy;
    nlohmann::json header;  // the trace's first line
  };
  const std::string text = write_trace(trace);
  const size_t header_end = text.find('\n');
  std::vector<Point> points{{"", base, nlohmann::json::parse(text.substr(0, header_end))}};
  for (const auto& s : sets) {
    auto [path, values] = parse_set(s);
    const bool of_trace = path.rfind("job.", 0) == 0 || path.rfind("cluster.", 0) == 0;
    std::vector<Point> next;
    for (const auto& p : points)
      for (const auto& v : values) {
        Point q = p;
        set_config_path(of_trace ? q.header : q.policy, path, v);
        q.label += (q.label.empty() ? "" : " ") + path + "=" + v;
        next.push_back(std::move(q));
      }
    points = std::move(next);
  }
  std::vector<PolicySet> policies;
  std::vector<Trace> traces;
  for (const auto& p : points) {
    try {
      policies.push_back(load_policy(p.policy));
    } catch (const PolicyError& e) {
      throw PolicyError(p.label + ": " + e.what());
    }
    policies.back().name = p.label;
    traces.push_back(parse_trace(p.header.dump() + text.substr(header_end), trace_path + " with " + p.label));
    traces.back().path = trace_path;
  }
  std::vector<Summary> rows;
  auto bar = progress_bar("sweep");
  const int total = static_cast<int>(points.size()) * mc.runs;
  for (size_t i = 0; i < policies.size(); ++i) {
    std::function<void(int, int)> prog;
    if (bar) prog = [&, i](int d, int) { bar(static_cast<int>(i) * mc.runs + d, total); };
    MonteCarloOptions o{mc.seed, mc.runs, mc.threads, true, prog};
    rows.push_back(summarize(points[i].label, run_monte_carlo(traces[i], policies[i], o)));
  }
  // The highest mean goodput; among points within 0.01 points of it (the same figure, as printed),
  // the one that holds the fewest accelerators for it (warm spares, say) is the better buy.
  size_t best = 0;
  for (size_t i = 1; i < rows.size(); ++i)
    if (rows[i].goodput_mean > rows[best].goodput_mean) best = i;
  const double top = rows[best].goodput_mean;
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].goodput_mean >= top - 1e-4 &&
        rows[i].accelerator_goodput_mean > rows[best].accelerator_goodput_mean)
      best = i;
  const CheckpointOptimum opt_storage = optimum_checkpoint_interval(trace, Tier::Storage);
  const CheckpointOptimum opt_memory = optimum_checkpoint_interval(trace, Tier::Memory);
  if (!html.empty()) {
    // One duration-valued setting: plot goodput against it, with Daly's optimum marked for intervals.
    std::optional<SummaryPlot> plot;
    if (sets.size() == 1) {
      auto [path, values] = parse_set(sets[0]);
      SummaryPlot p;
      p.x_label = path + " (seconds)";
      for (const auto& v : values)
        if (auto d = parse_duration(v)) p.x.push_back(to_seconds(*d));
      if (p.x.size() == values.size()) {
        if (path.find("interval") != std::string::npos) {
          const bool memory = policies.front().config.value("checkpoint", nlohmann::json::object()).value("tier", "") == "memory" ||
                              policies.front().config.value("checkpoint", nlohmann::json::object()).value("policy", "flash") == "flash";
          const Duration yd = (memory ? opt_memory : opt_storage).daly;
          if (yd > 0) {
            p.marker_x = to_seconds(yd);
            p.marker_label = std::string("Daly optimum ") + (memory ? "(memory) " : "(storage) ") + format_duration(yd);
          }
        }
        plot = p;
      }
    }
    write_file(html, summaries_html(rows, "Sweep on " + (trace.name.empty() ? trace_path : trace.name) + " (" +
                                              std::to_string(mc.runs) + " runs per point)",
                                    "setting", plot));
  }
  if (format == "json") {
    nlohmann::ordered_json j;
    j["trace"] = trace_path;
    j["seed"] = mc.seed;
    j["runs"] = mc.runs;
    for (const auto& s : rows) j["points"].push_back(summary_json(s));
    j["best"] = rows[best].label;
    j["daly_interval_s"] = {{"storage", to_seconds(opt_storage.daly)}, {"memory", to_seconds(opt_memory.daly)}};
    j["young_interval_s"] = {{"storage", to_seconds(opt_storage.young)}, {"memory", to_seconds(opt_memory.young)}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << "Sweep on " << trace_path << " (" << mc.runs << " runs per point from seed " << mc.seed << ")\n"
              << summaries_text(rows, "setting") << "best: " << rows[best].label << "\n";
    if (opt_storage.daly > 0)
      std::cout << "Optimum checkpoint interval from the trace's rates (Daly's higher-order formula): "
                << format_duration(opt_storage.daly) << " (storage tier), " << format_duration(opt_memory.daly)
                << " (memory tier); Young's first-order sqrt(2 delta M): " << format_duration(opt_storage.young) << ", "
                << format_duration(opt_memory.young) << "\n";
  }
  return 0;
}

int cmd_trace_validate(const std::vector<std::string>& files) {
  for (const auto& f : files) {
    const Trace t = load_trace(f);
    std::cout << f << ": ok, version " << t.version << ", " << t.cluster.nodes << " nodes x "
              << t.cluster.accelerators_per_node << " accelerators, " << t.cluster.spare_nodes << " spares, "
              << t.events.size() << " events, " << t.rates.size() << " failure rates, horizon "
              << format_duration(t.job.duration) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace goodput

int main(int argc, char** argv) {
  using namespace goodput;
  CLI::App app{"Goodput: keeps distributed training jobs productive through failures.\n"
               "Replays failure traces on a virtual clock to measure goodput and tune recovery,\n"
               "checkpoint and scaling policies."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("goodput ") + PROJECT_VERSION_STRING);
  int rc = 0;

  std::string trace_path, policy_path, events_path, format = "text", db;
  uint64_t seed = 1;
  bool resample = false, digest = false;
  auto* replay = app.add_subcommand("replay", "Replay a trace with a policy and print the goodput report");
  std::string from_log;
  replay->add_option("trace", trace_path, "Trace file (JSON Lines, see traces/SCHEMA.md)");
  replay->add_option("--from-log", from_log, "Replay a recorded event log instead of a trace (its failures and measured costs)");
  replay->add_option("--policy", policy_path, "Policy JSON (default: diagnose + flash checkpoints + wait for spares)");
  replay->add_option("--seed", seed, "Seed for failures drawn from the trace's rates")->capture_default_str();
  replay->add_flag("--resample", resample, "Draw failures from the trace's rates even if it lists its own");
  replay->add_option("--events", events_path, "Write the event log to this new SQLite file");
  replay->add_option("--format", format, "text or json")->capture_default_str();
  replay->add_flag("--digest", digest, "Print the XXH3 digest of the event log");
  std::string html;
  replay->add_option("--html", html, "Also write a self-contained HTML report with the timeline");
  replay->callback(
      [&] { rc = cmd_replay(trace_path, policy_path, seed, resample, events_path, format, digest, html, from_log); });

  auto* report = app.add_subcommand("report", "Recompute the goodput report from a stored event log");
  report->add_option("events", db, "Event log (SQLite) written by replay or the live master")->required();
  report->add_option("--format", format, "text, json, or events (the log itself, one canonical JSON line per event)")
      ->capture_default_str();
  report->add_flag("--digest", digest, "Print the XXH3 digest of the event log");
  report->add_option("--html", html, "Also write a self-contained HTML report with the timeline");
  report->callback([&] { rc = cmd_report(db, format, digest, html); });

  std::string node;
  auto* explain = app.add_subcommand("explain", "The chain of observations and decisions for one node of an event log");
  explain->add_option("events", db, "Event log (SQLite)")->required();
  explain->add_option("--node", node, "Node name (as it joined, e.g. n17) or id")->required();
  explain->callback([&] { rc = cmd_explain(db, node); });

  MonteCarloArgs mc;
  std::vector<std::string> policies, sets;
  auto add_mc = [&](CLI::App* c) {
    c->add_option("--runs", mc.runs, "Monte Carlo runs per configuration")->capture_default_str()->check(CLI::Range(1, 10'000'000));
    c->add_option("--seed", mc.seed, "Seed of run 0 (run i uses seed+i)")->capture_default_str();
    c->add_option("--threads", mc.threads, "Worker threads (0: all cores); results do not depend on it")
        ->capture_default_str()
        ->check(CLI::Range(0, 1024));
    c->add_option("--format", format, "text or json")->capture_default_str();
    c->add_option("--html", html, "Also write a self-contained HTML page");
  };
  auto* compare = app.add_subcommand("compare", "Compare policies on one trace, side by side");
  compare->add_option("trace", trace_path, "Trace file")->required();
  compare->add_option("--policy", policies, "Policy JSON (give two or more)")->required();
  add_mc(compare);
  compare->callback([&] { rc = cmd_compare(trace_path, policies, mc, format, html); });

  auto* sweep = app.add_subcommand("sweep", "Monte Carlo sweep of policy settings (mean, p5, p95 goodput)");
  sweep->add_option("trace", trace_path, "Trace file with failure_rates")->required();
  sweep->add_option("--policy", policy_path, "Base policy JSON (default: the default policy)");
  sweep->add_option("--set", sets,
                    "PATH=V1,V2,... e.g. checkpoint.interval=10m,20m,40m; job.* and cluster.* set the trace, e.g. "
                    "job.hang_timeout=1m,5m (repeatable)")
      ->required();
  add_mc(sweep);
  sweep->callback([&] { rc = cmd_sweep(trace_path, policy_path, sets, mc, format, html); });

  auto* trace = app.add_subcommand("trace", "Validate, generate, import traces and fit their failure rates");
  trace->require_subcommand(1);
  std::vector<std::string> files;
  auto* validate = trace->add_subcommand("validate", "Check trace files against the schema");
  validate->add_option("files", files, "Trace files")->required();
  validate->callback([&] { rc = cmd_trace_validate(files); });

  PaperTraceOptions po;
  std::string out_path, step_time = "6s", process_restart = "2m", scheduling = "5m", rendezvous = "1m",
                        heartbeat = "1m", hang = "10m", exit_detection = "5s", repair = "12h";
  double ckpt_gib = 16, mem_gbps = 50, storage_gbps = 1;
  auto* gen = trace->add_subcommand("generate", "Make a trace from published failure statistics");
  static std::string rates_path;
  static int32_t rate_nodes = 0;
  auto* paper_opt = gen->add_option("--paper", po.paper_path,
                                    "Paper statistics JSON (e.g. ../shared/data/papers/llama3-405b-interruptions.json)");
  auto* rates_opt = gen->add_option("--rates", rates_path, "A trace header of failure rates (goodput trace fit -o): "
                                                           "draws from it, with its cost model, at --nodes and --days")
                        ->check(CLI::ExistingFile);
  paper_opt->excludes(rates_opt);
  gen->add_option("--nodes", rate_nodes, "With --rates: nodes in the job (default: the header's)");
  gen->add_option("--accelerators", po.accelerators, "Accelerators in the job (default: as in the paper)");
  gen->add_option("--days", po.days, "Length of the job in days (default: as in the paper)");
  gen->add_option("--spares", po.spare_nodes, "Spare nodes (default: 1/64 of the nodes)");
  gen->add_option("--seed", po.seed, "Seed for drawing the failures")->capture_default_str();
  gen->add_option("--step-time", step_time, "Training step time")->capture_default_str();
  gen->add_option("--checkpoint-gib", ckpt_gib, "Checkpoint GiB per node")->capture_default_str();
  gen->add_option("--memory-gbps", mem_gbps, "Host-memory save bandwidth per node, GB/s")->capture_default_str();
  gen->add_option("--storage-gbps", storage_gbps, "Storage bandwidth per node, GB/s")->capture_default_str();
  gen->add_option("--process-restart", process_restart, "Time to restart trainer processes")->capture_default_str();
  gen->add_option("--scheduling", scheduling, "Time to place a spare node")->capture_default_str();
  gen->add_option("--rendezvous", rendezvous, "Rendezvous time")->capture_default_str();
  gen->add_option("--exit-detection", exit_detection, "Process exit to master")->capture_default_str();
  gen->add_option("--heartbeat-timeout", heartbeat, "Lost node detection")->capture_default_str();
  gen->add_option("--hang-timeout", hang, "Hang detection")->capture_default_str();
  gen->add_option("--repair", repair, "Time until a failed machine is back")->capture_default_str();
  gen->add_option("-o,--output", out_path, "Output file (default: stdout)");
  gen->callback([&] {
    auto d = [](const std::string& flag, const std::string& v) {
      auto r = parse_duration(v);
      if (!r) throw BadInput("--" + flag + ": not a duration: '" + v + "'");
      return *r;
    };
    if (rates_path.empty() && po.paper_path.empty()) throw BadInput("trace generate needs --paper FILE or --rates FILE");
    if (!rates_path.empty()) {  // the fitted header: its rates, its cost model; the size and length asked for
      Trace t = load_trace(rates_path);
      if (t.rates.empty()) throw BadInput(rates_path + ": no failure_rates to draw from");
      if (rate_nodes > 0) t.cluster.nodes = rate_nodes;
      if (po.days > 0) t.job.duration = static_cast<Duration>(po.days * static_cast<double>(kDay));
      if (po.spare_nodes >= 0) t.cluster.spare_nodes = po.spare_nodes;
      t.cluster.node_hours = 0;  // the new trace's exposure is its own nodes x duration
      t.events = generate_failures(t, po.seed);
      t.source += " | generated by goodput trace generate --rates --seed " + std::to_string(po.seed);
      const std::string text = write_trace(t);
      if (out_path.empty()) std::cout << text;
      else {
        std::ofstream out(out_path, std::ios::binary);
        out << text;
        if (!out) throw BadInput(out_path + ": cannot write");
        std::cerr << out_path << ": " << t.events.size() << " failures over " << format_duration(t.job.duration) << " on "
                  << t.cluster.nodes << " nodes\n";
      }
      return;
    }
    po.job.name = "pretraining";
    po.job.step_time = d("step-time", step_time);
    po.job.process_restart = d("process-restart", process_restart);
    po.job.node_scheduling = d("scheduling", scheduling);
    po.job.rendezvous = d("rendezvous", rendezvous);
    po.job.exit_detection = d("exit-detection", exit_detection);
    po.job.heartbeat_timeout = d("heartbeat-timeout", heartbeat);
    po.job.hang_timeout = d("hang-timeout", hang);
    po.repair_time = d("repair", repair);
    po.job.checkpoint_bytes_per_node = static_cast<int64_t>(ckpt_gib * 1024.0 * 1024.0 * 1024.0);
    po.job.memory_bandwidth_bytes_per_s = static_cast<int64_t>(mem_gbps * 1e9);
    po.job.storage_bandwidth_bytes_per_s = static_cast<int64_t>(storage_gbps * 1e9);
    Trace t = trace_from_paper(po);
    t.source += " | generated by goodput trace generate --seed " + std::to_string(po.seed) +
                "; job cost model and repair time are assumptions (see traces/README.md)";
    const std::string text = write_trace(t);
    if (out_path.empty()) {
      std::cout << text;
    } else {
      std::ofstream out(out_path, std::ios::binary);
      out << text;
      if (!out) throw BadInput(out_path + ": cannot write");
      std::cerr << out_path << ": " << t.events.size() << " failures over " << format_duration(t.job.duration) << " on "
                << t.cluster.nodes << " nodes\n";
    }
  });

  add_trace_tools(trace, rc);
  add_ckpt_commands(app, rc);
  add_live_commands(app, rc);
  add_torchrun_command(app, rc);
  add_k8s_commands(app, rc);
  add_operator_command(app, rc);
  add_vopr_command(app, rc);

  BenchOptions bo;
  auto* bench = app.add_subcommand("bench", "Benchmarks: core loop, replay, Monte Carlo (ratios against baselines)");
  bench->add_option("--trace", bo.trace_path, "The 54-day trace")->capture_default_str();
  bench->add_option("--runs", bo.runs, "Monte Carlo runs")->capture_default_str();
  bench->add_option("--threads", bo.threads, "Threads for Monte Carlo (0: all)")->capture_default_str();
  bench->callback([&] {
    if (bench->get_subcommands().empty()) rc = run_bench(bo);
  });
  static ApiBenchOptions api_o;
  auto* api = bench->add_subcommand("api", "Simulated agents heartbeating a real master: latency, CPU, RSS");
  api->add_option("--agents", api_o.agents, "Simulated agents (one connection each)")->capture_default_str();
  api->add_option("--seconds", api_o.seconds, "How long to drive the master")->capture_default_str();
  api->add_option("--fail", api_o.fail,
                  "Agents that fall silent at once a third of the way in (a zone lost); as many replacements "
                  "join once the master noticed: time to notice, to re-form, heartbeat latency meanwhile")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  api->callback([&] { rc = run_api_bench(api_o); });
  // A zone lost under a big job, on Kubernetes or on Ray: the same options, the cluster's emulator.
  static ZoneBenchOptions kube_o, ray_o;
  for (auto [o, name, backend, emulator, data, what] :
       {std::tuple{&kube_o, "kube", "kubernetes", "kube/kube_emulator.py", "k8s", "pods"},
        std::tuple{&ray_o, "ray", "ray", "ray/ray_emulator.py", "ray", "Ray jobs"}}) {
    o->backend = backend;
    // Beside the build: the source tree's emulator, and the shared data next to the checkout.
    const std::filesystem::path exe = std::filesystem::canonical("/proc/self/exe").parent_path();
    o->emulator = (exe.parent_path() / "tests/emulators" / emulator).string();
    const char* shared = std::getenv("GOODPUT_SHARED_DATA");
    o->fixtures = shared && *shared ? std::string(shared) + "/" + data : (exe.parent_path().parent_path() / "shared/data" / data).string();
    auto* z = bench->add_subcommand(name, std::string("A zone of a big job's ") + what + " lost at once, on the " +
                                              (o == &ray_o ? "Ray dashboard" : "Kubernetes API") +
                                              " emulator (cheap nodes, simulated agents): time to the replacements and "
                                              "to training again, against client-go's default limits");
    z->add_option("--nodes", o->nodes, "The job's nodes")->check(CLI::Range(2, 16384))->capture_default_str();
    z->add_option("--lose", o->lose, "Of them, lost at once with their machines")->check(CLI::PositiveNumber)->capture_default_str();
    z->add_option("--qps", o->qps, "The master's backend.api_qps")->check(CLI::PositiveNumber)->capture_default_str();
    z->add_option("--burst", o->burst, "Its backend.api_burst")->check(CLI::PositiveNumber)->capture_default_str();
    z->add_option("--concurrency", o->concurrency, "Its backend.api_concurrency")->check(CLI::Range(1, 256))->capture_default_str();
    z->add_flag("!--no-baseline", o->baseline, "Skip the run with client-go's default limits");
    z->add_option("--emulator", o->emulator, "The cluster's emulator")->capture_default_str();
    z->add_option("--fixtures", o->fixtures, "Its fixtures (shared/data/...)")->capture_default_str();
    z->callback([&, o = o] {
      try {
        rc = run_zone_bench(*o);
      } catch (const std::exception& e) {
        std::cerr << "goodput: " << e.what() << "\n";
        rc = 1;
      }
    });
  }
  static SimScaleOptions sim_o;
  auto* simb = bench->add_subcommand("sim", "The simulator at the largest jobs' scale: replay time per event at each "
                                            "size (linear growth reads 1.0x), peak memory, Monte Carlo runs");
  simb->add_option("--trace", sim_o.trace_path, "Failure rates and cost model to draw from")->capture_default_str();
  simb->add_option("--accelerators", sim_o.accelerators, "Job sizes, in accelerators")
      ->delimiter(',')
      ->check(CLI::Range(8, 10'000'000))
      ->capture_default_str();
  simb->add_option("--days", sim_o.days, "Length of each job")->check(CLI::Range(0.001, 3650.0))->capture_default_str();
  simb->add_option("--runs", sim_o.runs, "Monte Carlo runs of the largest")->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  simb->add_option("--threads", sim_o.threads, "Threads for Monte Carlo (0: all)")->capture_default_str();
  simb->callback([&] { rc = run_sim_scale_bench(sim_o); });
  static CrashBenchOptions crash_o;
  auto* crash = bench->add_subcommand("crash", "SIGKILL the master at random moments; check no acknowledged event is lost");
  crash->add_option("--kills", crash_o.kills, "How many times to kill the master")->capture_default_str();
  crash->add_option("--agents", crash_o.agents, "Simulated agents")->capture_default_str();
  crash->add_option("--steps", crash_o.steps, "Steps of the simulated job (one data shard per agent and step)")
      ->capture_default_str();
  crash->add_option("--seed", crash_o.seed, "Seed for the kill times")->capture_default_str();
  crash->callback([&] { rc = run_crash_bench(crash_o); });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (const TraceError& e) {
    std::cerr << "goodput: " << e.what() << "\n";
    return 2;
  } catch (const PolicyError& e) {
    std::cerr << "goodput: policy: " << e.what() << "\n";
    return 2;
  } catch (const StoreError& e) {
    std::cerr << "goodput: " << e.what() << "\n";
    return 2;
  } catch (const ckpt::CheckpointError& e) {
    std::cerr << "goodput: " << e.what() << "\n";
    return 2;
  } catch (const ConfigError& e) {
    std::cerr << "goodput: " << e.what() << "\n";
    return 2;
  } catch (const BadInput& e) {
    std::cerr << "goodput: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "goodput: internal error: " << e.what() << "\n";
    return 1;
  }
  return rc;
}
