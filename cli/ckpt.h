#pragma once

#include <CLI/CLI.hpp>

namespace goodput {
// `goodput ckpt ls|verify|rm`: look after flash checkpoints in shared memory and storage.
void add_ckpt_commands(CLI::App& app, int& rc);
}  // namespace goodput
