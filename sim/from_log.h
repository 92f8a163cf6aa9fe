// A stored event log (from replay or, later, the live master) turned into a trace.
#pragma once

#include "engine/event_store.h"
#include "sim/trace.h"

namespace goodput {

// Failures at the times progress stopped, slowdowns, operators' scale requests, machines (the first world's nodes as n0..,
// later ones as spares) and a cost model of medians measured in the log. Throws TraceError.
// `checks_left_out`, if given, counts the node checks operators asked for: a trace has no place for them.
Trace trace_from_log(const EventStore& log, const std::string& name, int64_t* checks_left_out = nullptr);

}  // namespace goodput
