// A stored event log (from replay or, later, the live master) turned into a trace.
#pragma once

#include "engine/event_store.h"
#include "sim/trace.h"

namespace goodput {

// Failures at the times progress stopped, slowdowns, operators' scale requests, machines (the first world's nodes as n0..,
// later ones as spares) and a cost model of medians measured in the log. Throws TraceError.
Trace trace_from_log(const EventStore& log, const std::string& name);

}  // namespace goodput
