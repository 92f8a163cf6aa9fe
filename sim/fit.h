// Failure rates fitted to what a cluster recorded: traces (imported histories, recorded live logs)
// in, per-cause rates per node-hour with exact Poisson confidence intervals out, as a trace header
// that `goodput trace generate --rates` draws new traces from.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "policies/policy.h"
#include "sim/trace.h"

namespace goodput {

// The exact (Garwood) two-sided interval for a Poisson rate: k events over `exposure`.
std::pair<double, double> poisson_interval(int64_t k, double exposure, double confidence = 0.95);

// One cause: an event type and the diagnosis the shipped table gives its events (and, fitted
// by reason, one reason text).
struct CauseFit {
  TraceEventType type = TraceEventType::NodeFailure;
  Diagnosis diagnosis = Diagnosis::Unknown;
  std::string reason;  // the cause's most common reason, which the table diagnoses the same way
  int32_t exit_code = 1;
  Duration duration = 0;  // pause: the median length
  int64_t count = 0;
  double per_node_hour = 0, lo = 0, hi = 0;
};

// Time between failures of a whole job, for the jobs of one size.
struct SizeFit {
  int32_t nodes = 0;
  double node_hours = 0;
  int64_t failures = 0;  // failures of the job (pauses and node returns are none)
  double mtbf_hours = 0, lo_hours = 0, hi_hours = 0;  // job hours per failure (0 failures: 0)
  double predicted_hours = 0;  // if MTBF ∝ 1/nodes, from the rate of every size pooled
};

struct TraceFit {
  std::vector<std::string> sources;
  double node_hours = 0;
  int64_t failures = 0;
  std::vector<CauseFit> causes;  // by type, then diagnosis
  std::vector<SizeFit> sizes;    // by size, when the inputs have several
  int32_t largest_nodes = 0;
  Duration longest = 0;
  int32_t logs = 0;              // inputs that were event logs: their measured medians make the cost model
  JobSpec cost_model;            // medians over the logs' measured timings, else the first input's
  ClusterSpec cluster;           // the first input's (accelerators per node, repair and check times)
};

// A trace's events are counted; a trace with no events counts its rates' `count`s (an earlier
// fit's header, an imported published summary), so fits pool. A trace's job size, for MTBF by
// size, is its `cluster.job_nodes`, else its `nodes`.
// by_reason: one cause per (type, diagnosis, reason) instead of per (type, diagnosis).
// Throws TraceError if there is nothing to fit (no node-hours).
TraceFit fit_traces(const std::vector<Trace>& traces, const std::vector<bool>& from_log, bool by_reason = false);

// A trace header of the fitted rates (no events), for `goodput trace generate --rates`.
Trace fitted_header(const TraceFit& fit);

// The table people read: causes with counts, rates and intervals; MTBF by job size.
std::string fit_text(const TraceFit& fit);

}  // namespace goodput
