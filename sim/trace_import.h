// Traces from what a cluster already records. Each importer is strict (a bad line is a TraceError
// naming the file, the line and the field), reads line-oriented inputs as a stream, and gives a
// trace that `goodput trace validate` accepts: the machines it saw as n0.. (sorted by name; their
// own names stay in the reasons), t = 0 at the first thing seen, and `cluster.node_hours` the
// exposure the failures were seen over, so `goodput trace fit` divides by the right number.
// The Kubernetes importer is import/kube_history.h, a floor above sim/ and backends/: it reads pods
// with the live Kubernetes backend's own reading of a pod's status.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "sim/trace.h"

namespace goodput {

// "2026-01-02T03:04:05", with optional fraction and "Z" or "+hh:mm"; ns since the Unix epoch.
std::optional<int64_t> parse_timestamp_ns(std::string_view s);

// Slurm's hostlist syntax: "gpu[01-03,07],cpu5" -> gpu01 gpu02 gpu03 gpu07 cpu5. Throws
// TraceError(what) on a malformed list.
std::vector<std::string> expand_hostlist(std::string_view list);

// What an importer gathers before it is a trace: events on named machines at absolute times.
struct ImportedEvent {
  int64_t unix_ns = 0;
  TraceEvent event;     // node unset: `machine` names it
  std::string machine;  // the cluster's own name for it; empty: the history does not say (rank 0)
  int32_t job_nodes = 0;  // the size of the job it happened to (0: not known)
};

struct TraceBuilder {
  std::string name, source;
  std::vector<ImportedEvent> events;
  std::set<std::string> machines;        // every machine seen
  double node_hours = 0;                 // exposure
  int32_t min_nodes = 0;                 // the cluster is at least this big (a history that names no machines)
  std::map<int32_t, double> size_hours;  // exposure by job size, where the history says it
  std::map<int32_t, std::set<std::string>> size_machines;
  int64_t first_ns = INT64_MAX, last_ns = INT64_MIN;
  std::map<std::string, int64_t> skipped;  // what was read and is not a failure, by why: for the summary

  void saw(int64_t ns) {
    first_ns = std::min(first_ns, ns);
    last_ns = std::max(last_ns, ns);
  }
  // A job of `job_nodes` nodes ran on `hosts` (may be empty: not named) for `hours` each node.
  void ran(const std::vector<std::string>& hosts, int32_t job_nodes, double node_hours_run);
  std::vector<int32_t> sizes() const;  // the job sizes seen, ascending
  // Sorted by time (stable: equal times keep their input order). job_nodes > 0: only the jobs of
  // that size, with `cluster.job_nodes` set. Throws TraceError when nothing was seen at all.
  Trace build(Duration step_time, int32_t job_nodes = 0) const;
  std::string summary() const;  // "N failures (by type) on M machines over D; skipped: ..."
};

// `sacct --parsable2` output (with its header line; see traces/SCHEMA.md for the exact command).
TraceBuilder import_slurm(const std::vector<std::string>& files);

// Alibaba PAI 2020 (clusterdata cluster-trace-gpu-v2020): pai_instance_table.csv, which the
// dataset ships without a header line (its columns are data_pai_instance_table.header's). An
// instance is one worker of a job on one machine: exposure is instance-hours, a job's size is its
// instance count, and a Failed instance is a process crash whose cause the table does not give.
TraceBuilder import_pai2020(const std::vector<std::string>& files);

// AcmeTrace (Shanghai AI Lab, NSDI '24): a job trace (trace_seren.csv, trace_kalos.csv: a header
// line, one job a row, no machine names), or cluster_summary.csv (one row per cluster, shares of
// GPU jobs and GPU time by final state). The summary holds no events: `cluster` picks its row,
// and the trace is a header whose one counted rate is failed GPU jobs per node-hour.
TraceBuilder import_acme(const std::vector<std::string>& files);
bool is_acme_summary(const std::string& file);
Trace import_acme_summary(const std::string& file, const std::string& cluster, int32_t gpus_per_node, std::string* summary);

}  // namespace goodput
