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

}  // namespace

void add_trace_tools(CLI::App* trace, int& rc) {
  static std::string from, out, step_time = "1s", cost_model;
  static std::vector<std::string> inputs;
  auto* imp = trace->add_subcommand("import", "Make a trace of a cluster's own history (Kubernetes, Slurm)");
  imp->add_option("--from", from, "What the files are: k8s (kubectl get pods/nodes/events -o json, or a watch stream "
                                  "as NDJSON) or slurm (sacct --parsable2, see traces/SCHEMA.md)")
      ->required()
      ->check(CLI::IsMember({"k8s", "slurm"}));
  imp->add_option("files", inputs, "Input files")->required()->check(CLI::ExistingFile);
  imp->add_option("-o,--output", out, "The trace (default: stdout)");
  imp->add_option("--step-time", step_time, "The job's step time, for the trace's cost model")->capture_default_str();
  imp->add_option("--cost-model", cost_model, "Take the job's cost model (step, restart, placement, rendezvous, detection "
                                              "times) from this trace or event log (its measured medians), not the defaults")
      ->check(CLI::ExistingFile);
  imp->callback([&rc] {
    std::string summary;
    const Duration step = duration_arg("step-time", step_time);
    Trace t = from == "k8s" ? kube::import_history(inputs, step, &summary) : import_slurm(inputs, step, &summary);
    if (!cost_model.empty()) {  // a history says what failed and when; how long recovering takes, a run measured
      JobSpec job = load_any(cost_model).job;
      job.duration = t.job.duration;
      job.total_steps = 0;
      job.measured_process_restart.clear();
      job.measured_rendezvous.clear();
      t.job = job;
    }
    const std::string text = write_trace(t);
    parse_trace(text, out.empty() ? "(output)" : out);  // what it writes, `trace validate` accepts
    write_out(out, text);
    std::cerr << (out.empty() ? "trace" : out) << ": " << summary << "\n";
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
