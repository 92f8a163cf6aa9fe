// The world of a live job: the nodes the master knows (as their agents last reported them), the
// slots they hold (slot s is rank s of the next restart), and the replica layout the slots follow.
//
// Everything here is a fold of the log (which node joined for which slot, which was relaunched,
// how a scale moved the slots), so a master resumed from its log lays the world out the same way.
// What is not in the log (hosts, ports, trainer reports) is learnt again from the next heartbeats.
// The world decides nothing: it answers "who holds slot s", "is the world complete", "which slot
// is vacant", and LiveMaster decides what to do about it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backends/live/job_spec.h"
#include "engine/event.h"

namespace goodput::live {

// The trainer's whole status, as one heartbeat carries it. Ages are the agent's (how long ago).
struct TrainerReport {
  int32_t restart = -1;
  std::string phase = "none";  // none, starting, rendezvous, loaded, training, exited
  int64_t pid = 0;
  int64_t step = 0;
  int64_t progress_age_ms = 0;
  bool stopped = false;  // the process is stopped (SIGSTOP), alive but not running
  bool done = false;     // it reported its last step
  std::optional<double> loss;
  double work_median_s = -1;  // CPU work per step: median and MAD over the agent's window
  double work_mad_s = -1;
  int64_t saves = 0;
  int64_t save_blocking_ns = 0;
  int64_t saved_step = -1;
  std::vector<int64_t> storage_steps;
  std::optional<CheckpointLoaded> loaded;
  struct Exit {
    int32_t code = 0;
    int32_t signal = 0;
    std::string reason;
    bool done = false;
    int64_t age_ms = 0;
    int32_t local_rank = -1;  // the process that failed first (the root cause) on a node of several; -1: not said
    int32_t rank = -1;        // its global rank
  };
  std::optional<Exit> exit;
  // A node of several trainer processes: the report above is their aggregate (the least advanced
  // phase and step, the slowest work), and `ranks` each process's own, as the agent sent it.
  int32_t processes = 1;
  nlohmann::json ranks;  // null for one process
  // On a node of several processes, the one a hang is most likely in: a stopped one, else the one
  // silent longest, as "local rank L (rank R)"; empty for one process.
  std::string quietest_process() const;
};

// A node's trainer process, as its agent last reported it: the newest report, with its ages turned
// into the master's times, and how it exited (kept once seen, for the rest of its restart).
struct Trainer : TrainerReport {
  Time last_progress = 0;
  bool exited = false;
  int32_t exit_code = 0;
  int32_t exit_signal = 0;
  std::string exit_reason;
  Time exited_at = 0;
  // Takes a heartbeat's report, received at `now` (a report of another restart starts afresh).
  // True when it changed what the world's agreement reads (restart, phase, saves, steps in
  // storage, the checkpoint loaded, done, the exit); a report that only moves the step and the
  // progress time returns false, and nothing follows from it until the next tick.
  bool apply(const TrainerReport& r, Time now);
};

struct Node {
  NodeId id = 0;
  std::string name;
  std::string host;  // where other ranks reach it; not in the log: learnt again from requests
  int32_t slot = -1;  // -1: a spare
  int32_t former_slot = -1;  // the slot it held when it was relaunched
  // The replica type it was launched as (its slot's group): it takes only slots of that type.
  // Empty: any (an agent started by hand, or a spare known only from the log).
  std::string kind;
  bool gone = false;  // relaunched or released: this machine is out of the job for good
  Time last_heartbeat = 0;
  Trainer trainer;
  std::vector<std::string> inject;  // faults to hand to the agent with the next heartbeat
  uint16_t check_port = 0;     // its agent's link-probe port (node checks)
  uint16_t rdzv_port = 0;      // a free port its agent offers for the rendezvous store (as rank 0)
  std::string persist_error;   // why its agent's newest persist to storage failed; empty: it did not
  uint16_t replica_port = 0;   // its agent's replica server (checkpoint.replicas)
  std::vector<std::pair<int32_t, int64_t>> held;  // copies of other ranks' checkpoints it holds: (rank, step)
  std::string replica_error;   // why its newest copy to a holder failed
};

class World {
 public:
  World(std::vector<ReplicaGroup> groups, int32_t slots);

  // ---- the fold: each keeps the table in step with one decision or observation of the log
  Node& join(const NodeJoined& joined);            // a new node, in the slot it was given (or a spare)
  void relaunch(const RecoveryDecided& decision);  // the node leaves for good; its slot falls vacant
  void restarted(const RestartJob& restart);       // the layout of the saves of this restart
  // A scale: of the whole world (group empty: slots past the new size give their nodes back to the
  // spares), or of one replica group (the slots are laid out anew, its released nodes leave).
  // Vacant slots of the world then get spares of their type.
  void scale(const ScaleDecided& decision);

  // ---- the table
  Node* node(NodeId id);
  const Node* node(NodeId id) const;
  const Node* named(const std::string& name) const;  // the first node of that name (gone or not); null: none
  Node* live_named(const std::string& name);         // the node of that name still in the job; null: none
  std::map<NodeId, Node>& nodes() { return nodes_; }
  const std::map<NodeId, Node>& nodes() const { return nodes_; }
  NodeId next_id() { return next_node_++; }

  // ---- slots
  int32_t size() const { return size_; }                            // the world: slots 0..size-1 train
  int32_t slot_count() const { return static_cast<int32_t>(slots_.size()); }  // every slot of the layout
  NodeId at(int32_t slot) const { return slots_[static_cast<size_t>(slot)]; }  // -1: vacant
  const Node* holder(int32_t slot) const;  // the node at a slot; null: vacant or out of range
  int32_t memory_permille(int32_t slot) const { return slot_memory_[static_cast<size_t>(slot)]; }
  // The nodes holding slots 0..size-1, by rank; empty while one of them is vacant. Kept between
  // changes of the slots (a heartbeat must not cost O(world)).
  const std::vector<Node*>& ranks();
  // Changes each time a slot changes hands or the world's size changes: what was learnt about
  // `ranks()` before (how far a scan got) holds while it stays the same.
  uint64_t epoch() const { return epoch_; }
  bool ranks_held() const;       // no slot of the world is vacant
  bool every_slot_held() const;  // no slot of the layout is vacant (a shrunk world may miss some)
  std::optional<int32_t> first_vacant() const;  // the lowest slot no node holds
  const std::set<int32_t>& vacant() const { return vacant_; }  // the slots of the layout no node holds
  bool fits(const Node& n, int32_t slot) const;  // n may take slot (it is of the slot's replica type)
  // The slot a joining node takes: `wanted` (the one it was launched for) if still vacant, else the
  // first vacant one of its type; none: it joins as a spare.
  std::optional<int32_t> slot_for(const Node& n, int64_t wanted) const;
  int64_t newest_step() const;  // the highest step any trainer of the job reported
  // A vacant slot reported as waiting for a machine (NoSpareNode): true the first time for a slot.
  bool mark_waiting(int32_t slot) { return waiting_slots_.insert(slot).second; }

  // ---- the layout
  const std::vector<ReplicaGroup>& groups() const { return groups_; }
  const ReplicaGroup& group_of(int32_t slot) const { return replica_group(groups_, slot); }
  // The replica counts the checkpoint of `step` was saved under (from the restarts in the log).
  nlohmann::json layout_of(int64_t step) const;
  bool relaid() const { return relaid_; }  // a replica group was scaled (ranks moved) at some point of the run
  // The count a group an operator grew had before (until it shrinks back to it); none: not grown.
  std::optional<int32_t> grown_from(const std::string& type) const;

 private:
  void relayout(const ScaleDecided& d);
  void place_spares();
  void hold(int32_t slot, NodeId id);  // slot changes hands (-1: falls vacant)
  void slots_changed();                // after a change of many slots or of the world's size


  std::vector<ReplicaGroup> groups_;
  std::map<NodeId, Node> nodes_;
  std::vector<NodeId> slots_;          // slot -> node (-1: vacant)
  std::vector<int32_t> slot_memory_;   // slot -> memory permille for the next node there
  NodeId next_node_ = 0;
  int32_t size_ = 0;
  std::set<int32_t> waiting_slots_;    // vacant slots reported as NoSpareNode
  std::set<int32_t> vacant_;           // slots of the layout no node holds
  std::map<std::string, std::vector<NodeId>> by_name_;  // nodes by name, oldest first
  std::vector<Node*> ranks_;           // ranks() as of epoch_
  uint64_t epoch_ = 1;
  uint64_t ranks_epoch_ = 0;
  // Replica counts of each restart's world, by the step it restored: checkpoints of steps above a
  // key were saved under its layout (until the next key).
  std::map<int64_t, nlohmann::json> layouts_;
  bool relaid_ = false;
  std::map<std::string, int32_t> grown_;
};

}  // namespace goodput::live
