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
  std::string machine;  // the cluster's own name for it
};

struct TraceBuilder {
  std::string name, source;
  std::vector<ImportedEvent> events;
  std::map<std::string, bool> machines;  // every machine seen (the value is unused)
  double node_hours = 0;                 // exposure
  int64_t first_ns = INT64_MAX, last_ns = INT64_MIN;
  std::map<std::string, int64_t> skipped;  // what was read and is not a failure, by why: for the summary

  void saw(int64_t ns) {
    first_ns = std::min(first_ns, ns);
    last_ns = std::max(last_ns, ns);
  }
  // Sorted by time (stable: equal times keep their input order). Throws TraceError when nothing
  // was seen at all.
  Trace build(Duration step_time) const;
  std::string summary() const;  // "N failures (by type) on M machines over D; skipped: ..."
};

// `sacct --parsable2` output (with its header line; see traces/SCHEMA.md for the exact command).
Trace import_slurm(const std::vector<std::string>& files, Duration step_time, std::string* summary = nullptr);

}  // namespace goodput
