// The live master's own code under simulation (as FoundationDB and TigerBeetle's VOPR test theirs):
// LiveMaster and its MasterApi run unchanged on a virtual clock; the agents, their trainers, the
// network between them, the machines (a NodeProvider) and the event log's disk are simulated, and
// every one of them misbehaves on purpose, chosen by one seeded generator. One seed is one run:
// the same seed gives the same run and the byte-identical event log.
//
// What is simulated, and how it fails:
//   network   requests and answers dropped, delayed (so reordered: an agent gives up on an answer
//             after 2 s and asks again, and the old request may still arrive), duplicated
//   agents    follow the real protocol (register, heartbeat with the whole trainer status, exit,
//             data shards; the JSON the master's API parses): they die (the provider may or may
//             not notice), go silent for a while, restart under the same name, come back after
//             being replaced
//   trainers  crash (SIGKILL, an error, out of memory), hang, and stall when a peer is gone
//   machines  are slow to come, or never come
//   disk      a commit fails (fsync error, disk full): the master stops; a crash loses what was
//             not committed
//   master    killed between requests and resumed from what its log holds
//
// Invariants, checked after every step of 100 ms of virtual time: an answered request's events are
// all durable (the master logs before it acts or answers); a run order names a restart whose
// decision is durable; no node holds two slots and no slot two nodes; no data shard is held by two
// live trainers at once; the job state folded from the durable log equals the master's. At the end:
// once faults stop, the job completes within a bound, with every data shard trained exactly once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace goodput::vopr {

struct Options {
  uint64_t seed = 1;
  int64_t steps = 600;      // steps of 100 ms with faults; then none, and the job must complete
  int64_t calm_steps = 1800;  // the bound on that (3 minutes of virtual time)
  int32_t nodes = 3;
  int64_t total_steps = 400;  // training steps of the simulated job (50 ms each)
  bool faults = true;
  // For the VOPR's own tests: a disk that lies about its commits (a crash also loses the last
  // event it said was durable). Its checks must then fail.
  bool lying_disk = false;
};

struct Result {
  bool ok = true;
  std::string failure;               // the invariant that broke, and how
  int64_t failed_at_step = -1;
  int64_t steps_run = 0;
  bool completed = false;            // the job finished with "completed"
  std::string finish_reason;
  std::string log_digest;            // XXH3 of the durable log: the same seed gives the same digest
  uint64_t events = 0;
  int64_t master_restarts = 0;
  std::map<std::string, int64_t> faults;  // injected, by kind
  std::map<std::string, int64_t> logged;  // the durable log's events, by type
  std::vector<std::string> history;  // what the simulation did, in order (the end of it on failure)
  std::vector<std::string> log_tail;  // on failure: the durable log's events, as JSON lines
};

// Runs one seed. Never throws for a finding: a broken invariant is a Result with ok false.
Result run(const Options& options);

// "seed N: ok, 1234 events, 3 master restarts, ..." or the failure with the history that led to it.
std::string describe(const Options& options, const Result& result, bool full_history = false);

}  // namespace goodput::vopr
