// The pre-flight node check: rounds of checks, their verdicts, and which verdicts are still to act on.
//
// Every node is checked once, when the world it joined is complete (a spare too, beside the
// training world, so that a lost node's slot takes a node known good): round 1 pairs the new nodes
// (each measures its link to its partner, so both directions are tried; an odd one goes to the
// fastest node already checked); a node with a wrong product is faulty at once; one whose link
// failed is a suspect, and round 2 pairs each suspect (slowest first) with a node that passed
// (fastest first). A suspect whose link fails again is faulty: it failed with two partners.
// Once no round is left, the verdicts go to the policies: LiveMaster turns a faulty node into a
// failure ("node check failed" reads as a hardware error) and a straggler into a slowdown with its
// ratio; not before, since round 2 may need them as partners. See docs/node-check.md.
//
// Verdicts and numbers are folded from the log (NodeChecked, CheckRequested); the round in
// progress is not (a resumed master checks again what had no verdict). An operator's check that
// waits for the next checkpoint is kept here too, until LiveMaster starts it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/live/job_spec.h"
#include "backends/live/world.h"

namespace goodput::live {

// One agent's result for a check round, as its heartbeat carried it.
struct CheckReport {
  int64_t mflops = 0;
  bool compute_ok = false;
  std::optional<bool> link_ok;  // absent: no link was measured
  int64_t link = 0;
  std::string error;
};

class NodeChecks {
 public:
  explicit NodeChecks(NodeCheckSpec spec) : spec_(std::move(spec)) {}

  // ---- the fold
  void joined(const NodeJoined& joined);  // checked if the spec says so; a slot's first node gets its drill
  void fold(const NodeChecked& checked);
  void fold(const CheckRequested& request);  // one that waits is kept (waiting()); else checked anew

  // ---- what the master asks
  bool on() const { return spec_.enabled || requested_; }
  // A node of the world has no check verdict yet. Asked with every heartbeat: the answer is kept
  // until the world's slots or a node's wish or verdict change.
  bool pending(const World& world) const;
  bool in_round() const { return round_ > 0; }
  const std::optional<CheckRequested>& waiting() const { return waiting_; }
  void drop_waiting() { waiting_.reset(); }  // it starts now (or has nobody left to check)
  // The check a node is to run now (the "check" object of its assignment); null: none.
  nlohmann::json order(const Node& node, const World& world) const;
  // What /status says of a node's check: its verdict, "round N" while it runs, or "".
  std::string state_of(NodeId node) const;
  const std::map<std::string, int64_t>& verdict_counts() const { return verdict_counts_; }

  // ---- rounds
  // A report from an agent; kept only if it answers the node's round in progress (`id` names it).
  void report(NodeId node, int64_t id, CheckReport report);
  // A round is over when every member still in the world reported, or at its deadline.
  bool round_over(const World& world, Time now) const;
  // The verdicts of the round in progress (the round ends); they become NodeChecked events.
  std::vector<NodeChecked> judge(const World& world);
  // After judge(): a second round for the suspects still in the world; false: none needed.
  bool start_second_round(const World& world, Time now);
  // With no round in progress: a first round for the world's nodes still unchecked; false: none.
  bool start_first_round(World& world, Time now);
  // The next node of the world whose verdict is not acted on yet (marked acted), in slot order:
  // its verdict ("passed", "faulty", "straggler"), its detail, and a straggler's slowdown.
  struct Verdict {
    NodeId node = -1;
    std::string verdict;
    std::string detail;
    int32_t slowdown_permille = 0;
  };
  std::optional<Verdict> next_to_act(const World& world);
  // Spares found faulty whose verdict is not acted on yet (marked acted): they leave the pool.
  std::vector<NodeId> failed_spares(const World& world);

 private:
  struct State {
    std::string fault;         // fault drill for its check (the first node of a slot)
    bool wanted = false;       // to be checked: every node when the spec has node_check, else on request
    std::string verdict;       // passed, straggler or faulty; empty: not checked yet
    std::string detail;
    int32_t slowdown = 0;      // a straggler's measured slowdown (permille); not in the log
    bool acted = false;        // its verdict went to the policies
    int64_t mflops = 0;
    int64_t link = 0;          // MB/s; 0: not measured
    int32_t round = 0;         // the round it was asked for
    int64_t id = 0;            // that round's id, unique across master restarts: its report must name it
    NodeId peer = -1;
    std::optional<CheckReport> report;  // its agent's result for id
  };
  bool active(const World& world, NodeId id) const;  // still in the job, holding a slot or a spare
  void start_round(int32_t round, std::vector<NodeId> members, const std::vector<NodeId>& peers, Time now);
  std::vector<NodeId> by_link(std::vector<NodeId> ids);  // fastest measured link first

  NodeCheckSpec spec_;
  std::map<NodeId, State> nodes_;
  std::set<int32_t> slots_seen_;        // slots some node has joined (a check's fault drill goes to the first)
  bool requested_ = false;              // an operator asked for a check (so a job without node_check checks)
  std::optional<CheckRequested> waiting_;  // asked for (logged as waiting), to start after the next checkpoint
  int32_t round_ = 0;                   // the round in progress (0: none)
  int64_t last_id_ = 0;
  Time deadline_ = 0;
  std::vector<NodeId> members_;
  std::vector<NodeId> suspects_;        // of the round judged last
  uint64_t changes_ = 0;                // of a node's wish to be checked or its verdict
  struct PendingMemo {
    uint64_t epoch = 0;    // the world's, when it was worked out
    uint64_t changes = 0;  // changes_, then
    bool pending = false;
  };
  mutable std::optional<PendingMemo> pending_;
  std::map<std::string, int64_t> verdict_counts_;  // node_checked events by verdict, for /metrics
};

}  // namespace goodput::live
