// The simulator is a Backend: a virtual cluster and training job driven by a trace, on a virtual
// clock. It reports what happens to the JobMaster as observations and carries out the master's
// decisions, exactly as a live backend would, so the policies cannot tell the difference.
#pragma once

#include <vector>

#include "engine/clock.h"
#include "engine/event_queue.h"
#include "engine/job_master.h"
#include "sim/index_set.h"
#include "sim/trace.h"

namespace goodput {

struct SimOptions {
  uint64_t seed = 1;
  // Draw failures from the trace's rates with the seed even when it lists events of its own.
  bool resample = false;
};

class Simulator final : public Backend {
 public:
  Simulator(const Trace& trace, PolicySet policies, SimOptions options, std::vector<EventSink*> sinks = {});
  // Runs the job to its end (horizon, step target, or giving up) and returns the final state.
  // Throws std::logic_error if an invariant breaks (a bug), naming the seed that reproduces it.
  const JobState& run();
  const JobState& state() const { return master_.state(); }
  // The failures this run replays (the trace's own, or drawn from its rates).
  const std::vector<TraceEvent>& failures() const { return events_; }

  void execute(const Event& decision) override;

 private:
  enum class ItemKind : uint8_t {
    Detect, Joined, JoinedBatch, OomAgain, Repaired, ProcessesUp, RendezvousDone, LoadDone, SlowdownEnd, Completed, Horizon,
    NoSpare, PauseEnd, SpareReady, SparesChanged
  };
  struct Item {
    ItemKind kind;
    int32_t a = 0;
    int32_t b = 0;
    uint64_t gen = 0;
  };
  // Warming and Warm: a warm spare (scaling.warm_spares) being placed and checked, and ready.
  enum class MachineState : uint8_t { Free, Joining, InJob, Down, Warming, Warm };
  struct Machine {
    MachineState state = MachineState::Free;
    Time ready_at = 0;  // Warming: when it is ready
    int32_t slot = -1;
    uint64_t gen = 0;  // bumped when a pending join or repair is cancelled
    int32_t slowdown_permille = 1000;
    uint64_t slowdown_gen = 0;
  };
  struct Slot {
    int32_t machine = -1;
    bool waiting = false;   // needs a machine
    bool reported = false;  // NoSpareNode already observed for this wait
    int32_t memory_permille = 1000;   // memory limit relative to the job's start
    int32_t memory_needed_permille = 0;  // the rank's process runs out of memory below this
    Duration oom_after = 10 * kMinute;
    std::string oom_reason;
  };

  void handle(const Item& item);
  void on_trace_event(const TraceEvent& e);
  void fault(int32_t m, const TraceEvent& e);
  void machine_down(int32_t m, Duration repair);
  void let_go(int32_t machine);  // out of its slot: free again, or down until its repair
  void release_slot(int32_t slot);
  void resize_world(int32_t delta);  // an operator's scale: slots added at the end or taken from it
  void try_fill();
  void refill_spares();  // free machines start warming until the pool is full
  void stop_training();
  void start_training(int64_t step);
  void schedule_training();
  void reanchor();
  void stall();
  void set_speed(int32_t machine, int32_t slowdown_permille);
  // Periodic saves are not queued one by one: before anything else happens at time t, the saves
  // and persists that completed by t are worked out in closed form and reported together.
  void catch_up(Time t);
  Time save_done_at(int64_t j) const;  // completion of the j-th save after the anchor (j >= 1)
  void observe_at(Time t, EventPayload observation);
  int64_t work_now() const;
  Duration wall_for(int64_t work) const;
  int32_t slowdown_max() const;
  void check_invariants() const;
  void detect_later(FailureObserved f, Duration latency);
  void deliver_detection(size_t i);
  void teardown();  // the trainer processes are stopped (to restart, or for good)
  void end_at_horizon();

  const Trace& trace_;
  SimOptions options_;
  VirtualClock clock_;
  JobMaster master_;
  CheckpointCosts costs_;
  EventQueue<Item> queue_;
  std::vector<TraceEvent> events_;
  std::vector<FailureObserved> detections_;
  std::vector<bool> detected_;  // per detection: delivered to the master
  std::vector<uint64_t> detection_incarnation_;  // per detection: the trainers' incarnation at the fault
  std::vector<std::vector<Item>> join_batches_;
  std::vector<Machine> machines_;
  std::vector<Slot> slots_;
  IndexSet free_;         // machines free to be placed, lowest first
  IndexSet waiting_;      // slots that need a machine
  IndexSet down_in_job_;  // machines that are down but still hold their slot
  IndexSet warm_;         // warm spares ready to take a slot
  IndexSet warming_;      // warm spares on their way
  int32_t warm_target_ = 0;      // the policy's scaling.warm_spares
  int32_t spares_reported_ = 0;  // the pool as the master last heard of it
  std::vector<int32_t> short_of_memory_;  // slots whose process will run out of memory again
  size_t next_trace_ = 0;  // trace events are sorted: read in order, not queued
  int32_t slowed_ = 0;         // machines running slow (most runs have none)
  bool finished_ = false;

  // The training job, ground truth.
  bool training_ = false;
  bool processes_up_ = false;  // trainer processes exist (from their start to their teardown)
  uint64_t incarnation_ = 0;   // bumped at each teardown of the trainers
  bool stalled_ = false;
  Time stalled_since_ = 0;
  bool paused_ = false;     // in a pause that will pass by itself (a restart or a failure ends it sooner)
  uint64_t pause_gen_ = 0;
  std::string pause_reason_;
  Time seg_time_ = 0;
  int64_t seg_work_ = 0;  // ns of full-speed work done at seg_time_ (step = work / step_time)
  int32_t world_ = 0;
  int32_t target_ = 0;  // the full world: the trace's nodes, changed by scale requests
  int32_t slowdown_ = 1000;
  uint64_t train_gen_ = 0;
  uint64_t restart_gen_ = 0;
  // A copy of memory saves made in the background while training goes on: to storage (persist)
  // or to peers' memory (replicas). One at a time; a save that finds one under way is not copied.
  struct BackgroundCopy {
    bool running = false;
    int64_t step = 0;
    Time done_at = 0;
  };
  struct CopiesDone {
    int64_t count = 0;     // finished by t
    int64_t newest = 0;    // the newest finished one's step
    Time newest_at = 0;    // and when it finished
    bool last_started = false;  // the batch's newest save started one
  };
  // Every `every`-th memory save of the `count` that completed by t starts a copy taking `cost`.
  CopiesDone advance_copy(BackgroundCopy& c, int32_t every, Duration cost, int64_t count, Time t);
  Duration replicate_cost() const;
  BackgroundCopy persist_;
  BackgroundCopy replica_;
  int64_t first_checkpoint_step_ = 0;  // first save after the anchor (0: no plan)
  int64_t saves_done_ = 0;             // saves completed since the anchor
  int64_t next_checkpoint_step_ = 0;   // the save in progress or next
  int64_t memory_saves_ = 0;           // all memory saves, for persist_every
  CheckpointPlanSet plan_;
  RestartJob restart_;
};

// A run for Monte Carlo and compare: no log kept, only the final state.
JobState simulate(const Trace& trace, const PolicySet& policies, const SimOptions& options);

}  // namespace goodput
