// `goodput trace import` and `goodput trace fit`: a cluster's own history in, a trace and its
// fitted failure rates out.
#include "cli/trace_tools.h"

#include <fstream>
#include <iostream>

#include "import/kube_history.h"
#include "engine/event_store.h"
#include "sim/fit.h"
#include "sim/from_log.h"
#include "sim/trace_import.h"

namespace goodput {
namespace {

void write_out(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    std::cout << text;
    return;
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    if (!out) throw TraceError(path + ": cannot write");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw TraceError(path + ": cannot write");  // whole, or not at all
}

bool is_sqlite(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[16] = {};
  in.read(magic, sizeof magic);
  return in.gcount() == 16 && std::string(magic, 15) == "SQLite format 3";
}

// A trace file, or an event log (live or replayed) read as one.
Trace load_any(const std::string& path) {
  if (!is_sqlite(path)) return load_trace(path);
  SqliteStore log(path, SqliteStore::Mode::OpenReadOnly);
  Trace t = trace_from_log(log, path);
  t.path = path;
  return t;
}

Duration duration_arg(const std::string& flag, const std::string& v) {
  const auto d = parse_duration(v);
  if (!d || *d <= 0) throw TraceError("--" + flag + ": not a duration: '" + v + "'");
  return *d;
}

// "out.jsonl" -> "out.nodes-8.jsonl": one file per job size.
std::string sized_path(const std::string& out, int32_t nodes) {
  const std::string ext = ".jsonl";
  const bool has = out.size() > ext.size() && out.compare(out.size() - ext.size(), ext.size(), ext) == 0;
  return (has ? out.substr(0, out.size() - ext.size()) : out) + ".nodes-" + std::to_string(nodes) + ext;
}

}  // namespace

void add_trace_tools(CLI::App* trace, int& rc) {
  static std::string from, out, step_time = "1s", cost_model, cluster;
  static std::vector<std::string> inputs;
  static bool split_by_size = false;
  static int32_t gpus_per_node = 8;
  auto* imp = trace->add_subcommand("import", "Make a trace of a cluster's own history (Kubernetes, Slurm, Alibaba PAI 2020, AcmeTrace)");
  imp->add_option("--from", from, "What the files are: k8s (kubectl get pods/nodes/events -o json, or a watch stream "
                                  "as NDJSON), slurm (sacct --parsable2, see traces/SCHEMA.md), pai2020 (Alibaba's "
                                  "pai_instance_table.csv) or acme (AcmeTrace's trace_seren.csv / trace_kalos.csv, or "
                                  "cluster_summary.csv with --cluster)")
      ->required()
      ->check(CLI::IsMember({"k8s", "slurm", "pai2020", "acme"}));
  imp->add_option("files", inputs, "Input files")->required()->check(CLI::ExistingFile);
  imp->add_option("-o,--output", out, "The trace (default: stdout)");
  imp->add_flag("--split-by-size", split_by_size,
                "One trace per job size (OUT.nodes-N.jsonl, each with cluster.job_nodes), so goodput trace fit gives "
                "MTBF by job size; needs -o (slurm, pai2020, acme)");
  imp->add_option("--cluster", cluster, "acme cluster_summary.csv: which cluster's row (Seren, Kalos, ...)");
  imp->add_option("--gpus-per-node", gpus_per_node, "acme cluster_summary.csv: GPUs per node, to turn GPU time into node-hours")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  imp->add_option("--step-time", step_time, "The job's step time, for the trace's cost model")->capture_default_str();
  imp->add_option("--cost-model", cost_model, "Take the job's cost model (step, restart, placement, rendezvous, detection "
                                              "times) from this trace or event log (its measured medians), not the defaults")
      ->check(CLI::ExistingFile);
  imp->callback([&rc] {
    const Duration step = duration_arg("step-time", step_time);
    if (split_by_size && (out.empty() || out == "-")) throw TraceError("--split-by-size writes one file per size: give -o");
    if (split_by_size && from == "k8s") throw TraceError("--split-by-size: a Kubernetes history does not say how big each job was");
    auto finish = [&](Trace t, const std::string& path, const std::string& summary) {
      if (!cost_model.empty()) {  // a history says what failed and when; how long recovering takes, a run measured
        JobSpec job = load_any(cost_model).job;
        job.duration = t.job.duration;
        job.total_steps = 0;
        job.measured_process_restart.clear();
        job.measured_rendezvous.clear();
        t.job = job;
      } else {
        t.job.step_time = step;
      }
      const std::string text = write_trace(t);
      parse_trace(text, path.empty() ? "(output)" : path);  // what it writes, `trace validate` accepts
      write_out(path, text);
      std::cerr << (path.empty() ? "trace" : path) << ": " << summary << "\n";
    };
    const bool summary_file = from == "acme" && inputs.size() == 1 && is_acme_summary(inputs.front());
    if (!cluster.empty() && !summary_file) throw TraceError("--cluster: only for AcmeTrace's cluster_summary.csv");
    if (summary_file) {
      if (cluster.empty()) throw TraceError(inputs.front() + ": a summary of several clusters: pick one with --cluster NAME");
      if (split_by_size) throw TraceError("--split-by-size: cluster_summary.csv has no job sizes");
      std::string summary;
      Trace t = import_acme_summary(inputs.front(), cluster, gpus_per_node, &summary);
      finish(std::move(t), out, summary);
      rc = 0;
      return;
    }
    const TraceBuilder b = from == "k8s"     ? kube::import_history(inputs)
                           : from == "slurm" ? import_slurm(inputs)
                           : from == "pai2020" ? import_pai2020(inputs)
                                               : import_acme(inputs);
    if (!split_by_size) {
      finish(b.build(step), out, b.summary());
    } else {
      const std::vector<int32_t> sizes = b.sizes();
      if (sizes.empty()) throw TraceError("--split-by-size: no job in the history has a size");
      for (int32_t n : sizes) {
        const Trace t = b.build(step, n);
        int64_t failures = 0;
        for (const auto& e : t.events) failures += e.type != TraceEventType::NodeReturn;
        char hours[64];
        std::snprintf(hours, sizeof hours, "%.1f", t.cluster.node_hours);
        finish(t, sized_path(out, n), "jobs of " + std::to_string(n) + " nodes: " + std::to_string(failures) +
                                          " failures over " + hours + " node-hours");
      }
      std::cerr << "all: " << b.summary() << "\n";
    }
    rc = 0;
  });

  static std::vector<std::string> fit_inputs;
  static std::string fit_out, by = "diagnosis";
  auto* fit = trace->add_subcommand("fit", "Failure rates per node-hour, with 95% intervals, from traces and live event logs");
  fit->add_option("inputs", fit_inputs, "Traces (JSON Lines) and live event logs (events.db)")->required()->check(CLI::ExistingFile);
  fit->add_option("-o,--output", fit_out, "A trace header of the rates, for goodput trace generate --rates (default: none)");
  fit->add_option("--by", by, "One rate per diagnosis (what a policy acts on) or per reason text")
      ->check(CLI::IsMember({"diagnosis", "reason"}))
      ->capture_default_str();
  fit->callback([&rc] {
    std::vector<Trace> traces;
    std::vector<bool> from_log;
    for (const std::string& f : fit_inputs) {
      traces.push_back(load_any(f));
      from_log.push_back(is_sqlite(f));
    }
    const TraceFit result = fit_traces(traces, from_log, by == "reason");
    std::cout << fit_text(result);
    if (!fit_out.empty()) {
      const std::string text = write_trace(fitted_header(result));
      parse_trace(text, fit_out);
      write_out(fit_out, text);
      std::cerr << fit_out << ": " << result.causes.size() << " failure rates (goodput trace generate --rates " << fit_out
                << " --nodes N --days D)\n";
    }
    rc = 0;
  });
}

}  // namespace goodput
