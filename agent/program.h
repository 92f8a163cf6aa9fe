// The agent's small OS helpers: child programs run with a deadline (stack dumps, the collective
// probe) and a TCP port free on this machine now.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace goodput::agent {

// A program started in its own process group, its stdout on a pipe (stderr stays the agent's,
// so its complaints land in the agent's log).
struct Program {
  pid_t pid = -1;
  int out = -1;
};

// argv[0] is a path; env_add holds KEY=VALUE entries set over this process's environment.
// pid is -1 when it could not be started.
Program spawn_program(const std::vector<std::string>& argv, const std::vector<std::string>& env_add = {});

struct ProgramResult {
  std::string out;         // its stdout (the first 64 KiB)
  bool exited_ok = false;  // exited with status 0 before the deadline
};

// Reads its stdout until it exits or the deadline passes, then kills its process group (nothing
// of it may linger) and reaps it.
ProgramResult finish_program(Program& p, std::chrono::steady_clock::time_point deadline);

// A TCP port free on this machine now (0 if none could be had).
uint16_t free_tcp_port();

}  // namespace goodput::agent
