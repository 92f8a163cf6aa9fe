// The node agent: one per machine. Registers with the master, heartbeats the whole status of its
// trainer, and makes the machine do what the answer says: run the trainer of restart N with the
// torchrun environment, stop it, or leave. It persists the trainer's flash checkpoints to storage
// in the background (and once more when the trainer dies), and carries out injected faults.
#pragma once

#include <cstdint>
#include <string>

namespace goodput::agent {

struct AgentOptions {
  std::string master_url;      // http://host:port
  std::string token;           // bearer token (from GOODPUT_TOKEN, never argv)
  std::string name;            // unique node name
  std::string host;            // the address other ranks reach it at; empty: the one the master sees
  std::string work_dir;        // trainer logs, progress and error files
  int32_t memory_permille = 1000;  // scales the job's memory limit (relaunch with more memory)
  int32_t slot = -1;               // the rank slot this node was launched for; -1: any
  int master_timeout_s = 300;      // no master this long: stop the trainer, free its memory, exit
};

// Runs until the master says the job is over (returns 0) or a fatal error (returns 1).
int run_agent(const AgentOptions& options);

}  // namespace goodput::agent
