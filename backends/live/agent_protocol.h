// The messages agents send the master, typed: what MasterApi reads off the wire (strictly: every
// key known, every field its type) and LiveMaster acts on. The JSON spellings are in master_api.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backends/live/node_checks.h"
#include "engine/event.h"

namespace goodput::live {

// A request the master cannot take in its current state (an unknown node: 404; a shard not
// assigned to it: 409). MasterApi answers it with `status` and the message.
struct ApiError : std::runtime_error {
  ApiError(int status, const std::string& what) : std::runtime_error(what), status(status) {}
  int status;
};

// POST /v1/register: a node's agent introduces itself (again, after a master restart).
struct RegisterRequest {
  std::string name;
  std::string host;         // where other ranks reach it (its own word, else the request's source)
  int64_t slot = -1;        // the slot it was launched for; -1: any
  uint16_t check_port = 0;  // its link-probe port
  uint16_t rdzv_port = 0;   // a free port it offers for the rendezvous store
  uint16_t replica_port = 0;  // where peers put and get checkpoint copies (agent/replica.h)
};

// POST /v1/heartbeat (and /v1/exit, with `leaving`).
// (TrainerReport, the trainer's part, is in world.h, next to the Trainer it updates.)
struct AgentReport {
  NodeId node = -1;
  std::string host;
  uint16_t check_port = 0;  // 0: not said
  uint16_t rdzv_port = 0;
  std::string persist_error;
  uint16_t replica_port = 0;  // 0: not said
  std::vector<std::pair<int32_t, int64_t>> held;  // copies of other ranks' checkpoints it holds: (rank, step), sorted
  std::string replica_error;  // why its newest copy to a holder failed; empty: none did
  std::string fetch_error;    // why it could not fetch its ranks' copies for this restart (said once)
  std::optional<std::pair<int64_t, CheckReport>> check;  // a check result and the round id it answers
  std::optional<std::string> leaving;                    // the agent was stopped on purpose, and why
  std::optional<TrainerReport> trainer;
};

}  // namespace goodput::live
