// Traces from published failure statistics: per-cause interruption counts of a real run become
// per-node-hour rates, which then drive a cluster of any size and length.
#pragma once

#include <string>

#include "sim/trace.h"

namespace goodput {

struct PaperTraceOptions {
  std::string paper_path;  // e.g. ../shared/data/papers/llama3-405b-interruptions.json
  int32_t accelerators = 0;  // 0: as in the paper
  double days = 0;           // 0: as in the paper
  int32_t spare_nodes = -1;  // -1: 1/64 of the nodes
  uint64_t seed = 1;
  JobSpec job;               // cost model; duration is set from `days`
  Duration repair_time = 12 * kHour;
};

// Throws TraceError naming the paper file and field.
Trace trace_from_paper(const PaperTraceOptions& options);

}  // namespace goodput
