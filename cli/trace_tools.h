// `goodput trace import` (a cluster's history as a trace) and `goodput trace fit` (its failure rates).
#pragma once

#include <CLI/CLI.hpp>

namespace goodput {
void add_trace_tools(CLI::App* trace, int& rc);
}  // namespace goodput
