// `goodput operator`: runs GoodputJobs on a Kubernetes cluster.
#pragma once

#include <CLI/CLI.hpp>

namespace goodput {

void add_operator_command(CLI::App& app, int& rc);

}  // namespace goodput
