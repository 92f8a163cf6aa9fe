// Over 600 lines, on purpose: the simulator is one state machine. The virtual cluster's machines,
// the job's trainers, the trace's faults and the master's decisions interlock on one event queue,
// and its invariants (a detection only for a trainer still running, a machine in one slot at a
// time, the breakdown checked after every event) hold across all of them; split into files, each
// part would need the others' state. The trace, the Monte Carlo driver and the log replay are
// files of their own (trace.cpp, montecarlo.cpp, from_log.cpp).
#include "sim/simulator.h"

#include <algorithm>
#include <stdexcept>

namespace goodput {

Simulator::Simulator(const Trace& trace, PolicySet policies, SimOptions options, std::vector<EventSink*> sinks)
    : trace_(trace),
      options_(options),
      master_(std::move(policies), clock_, *this, std::move(sinks),
              JobMaster::Options{.flush_before_acting = false, .finish_on_give_up = trace.job.duration <= 0}),
      costs_(CheckpointCosts::from(trace.job_started({}))),
      machines_(static_cast<size_t>(trace.machines())),
      slots_(static_cast<size_t>(trace.cluster.nodes)),
      free_(trace.machines()),
      waiting_(trace.cluster.nodes),
      down_in_job_(trace.machines()),
      warm_(trace.machines()),
      warming_(trace.machines()) {
  const bool generate = options_.resample || (trace.events.empty() && !trace.rates.empty());
  if (generate && trace.rates.empty())
    throw TraceError(trace.path + ": --resample needs 'failure_rates' in the trace header");
  events_ = generate ? generate_failures(trace, options_.seed) : trace.events;
  target_ = trace.cluster.nodes;
  warm_target_ = master_.policies().scaling->warm_spares();
  for (int32_t m = 0; m < trace.machines(); ++m) free_.insert(m);
}

JobState simulate(const Trace& trace, const PolicySet& policies, const SimOptions& options) {
  Simulator sim(trace, policies, options);
  return sim.run();
}

const JobState& Simulator::run() {
  if (trace_.job.duration > 0) queue_.push(trace_.job.duration, Item{ItemKind::Horizon});
  master_.observe(trace_.job_started(master_.policies().name));
  for (int32_t s = 0; s < static_cast<int32_t>(slots_.size()); ++s) {
    slots_[s].waiting = true;
    waiting_.insert(s);
  }
  try_fill();
  while (!finished_ && (!queue_.empty() || next_trace_ < events_.size())) {
    if (master_.state().gave_up()) {
      // Nothing happens to a job that gave up; it is charged until the horizon it was meant to run for.
      end_at_horizon();
      break;
    }
    // The trace's next event goes first on a tie: it was there before anything was scheduled.
    if (next_trace_ < events_.size() && (queue_.empty() || events_[next_trace_].t <= queue_.top().time)) {
      const TraceEvent& e = events_[next_trace_++];
      catch_up(e.t);
      clock_.advance_to(e.t);
      on_trace_event(e);
    } else {
      auto entry = queue_.pop();
      catch_up(entry.time);
      clock_.advance_to(entry.time);
      handle(entry.item);
    }
    check_invariants();
  }
  if (!finished_) {
    // Nothing left to happen and no horizon: the job would wait forever (e.g. no spare ever returns).
    stop_training();
    finished_ = true;
    master_.observe(JobFinished{"stuck", master_.state().steps_done()});
  }
  return master_.state();
}

void Simulator::end_at_horizon() {
  stop_training();
  teardown();
  clock_.advance_to(std::max(clock_.now(), trace_.job.duration));
  finished_ = true;
  master_.observe(JobFinished{master_.state().gave_up() ? "gave-up" : "horizon", seg_work_ / trace_.job.step_time});
}

void Simulator::teardown() {
  processes_up_ = false;
  ++incarnation_;
}

void Simulator::detect_later(FailureObserved f, Duration latency) {
  detections_.push_back(std::move(f));
  detected_.push_back(false);
  detection_incarnation_.push_back(incarnation_);
  queue_.push(clock_.now() + latency, Item{ItemKind::Detect, static_cast<int32_t>(detections_.size() - 1)});
}

// A fault is noticed unless what it broke is already gone: a crash or hang of trainers that were
// torn down since (a restart for another failure replaced them), or a lost machine that already
// left its slot.
void Simulator::deliver_detection(size_t i) {
  if (detected_[i]) return;
  detected_[i] = true;
  const FailureObserved& f = detections_[i];
  if (f.kind == FailureKind::ProcessExit || f.kind == FailureKind::Hang) {
    if (detection_incarnation_[i] != incarnation_) return;
  } else {
    const int32_t s = machines_[f.node].slot;
    if (s < 0 || static_cast<size_t>(s) >= slots_.size() || slots_[s].machine != f.node) return;
  }
  master_.observe(f);
}

void Simulator::check_invariants() const {
  const JobState& s = master_.state();
  if (s.productive() + s.losses_total() != s.wall())
    throw std::logic_error("goodput breakdown does not sum to wall time at seq " + std::to_string(s.last_seq()) +
                           " (trace " + trace_.path + ", seed " + std::to_string(options_.seed) + ")");
  if (s.productive() < 0)
    throw std::logic_error("negative productive time (seed " + std::to_string(options_.seed) + ")");
}

// ---- the training job ----------------------------------------------------------------------------

int32_t Simulator::slowdown_max() const {
  int32_t m = 1000;
  if (slowed_ == 0) return m;
  for (const Slot& s : slots_)
    if (s.machine >= 0 && machines_[s.machine].state == MachineState::InJob)
      m = std::max(m, machines_[s.machine].slowdown_permille);
  return m;
}

int64_t Simulator::work_now() const {
  if (!training_) return seg_work_;
  const Duration dt = std::max<Duration>(0, clock_.now() - seg_time_ - saves_done_ * costs_.save(plan_.tier));
  int64_t w = seg_work_ + (world_ >= target_ && slowdown_ == 1000
                               ? dt
                               : static_cast<int64_t>(static_cast<__int128>(dt) * world_ * 1000 /
                                                      (static_cast<__int128>(target_) * slowdown_)));
  if (next_checkpoint_step_ > 0) w = std::min(w, next_checkpoint_step_ * trace_.job.step_time);  // blocked in a save
  return w;
}

Duration Simulator::wall_for(int64_t work) const {
  if (world_ >= target_ && slowdown_ == 1000) return work;  // full speed: no 128-bit division
  const __int128 num = static_cast<__int128>(work) * target_ * slowdown_;
  const __int128 den = static_cast<__int128>(std::max(world_, 1)) * 1000;
  return static_cast<Duration>((num + den - 1) / den);
}

void Simulator::stop_training() {
  if (!training_) return;
  seg_work_ = work_now();
  seg_time_ = clock_.now();
  training_ = false;
  ++train_gen_;
}

// Progress stops now (a fault, or a planned replacement); the failures that follow carry this time.
void Simulator::stall() {
  stalled_since_ = clock_.now();
  stalled_ = true;
}

// Training goes on from now at the current speed and plan.
void Simulator::reanchor() {
  if (!training_) return;
  stop_training();
  training_ = true;
  slowdown_ = slowdown_max();
  schedule_training();
}

void Simulator::set_speed(int32_t m, int32_t slowdown_permille) {
  Machine& mach = machines_[m];
  slowed_ += (slowdown_permille > 1000) - (mach.slowdown_permille > 1000);
  mach.slowdown_permille = slowdown_permille;
  if (mach.state != MachineState::InJob) return;
  reanchor();
  master_.observe(SlowdownObserved{m, slowdown_permille});
}

void Simulator::start_training(int64_t step) {
  seg_work_ = step * trace_.job.step_time;
  seg_time_ = clock_.now();
  training_ = true;
  stalled_ = false;
  paused_ = false;
  slowdown_ = slowdown_max();
  schedule_training();
}

// Schedules the next checkpoint and the job's completion from the current anchor.
void Simulator::schedule_training() {
  ++train_gen_;
  saves_done_ = 0;
  first_checkpoint_step_ = next_checkpoint_step_ = 0;
  const Duration step = trace_.job.step_time;
  const int64_t k = plan_.every_steps;
  if (k > 0) first_checkpoint_step_ = next_checkpoint_step_ = (seg_work_ / step / k + 1) * k;
  if (trace_.job.total_steps > 0) {
    const int64_t total = trace_.job.total_steps;
    const int64_t left = std::max<int64_t>(0, total * step - seg_work_);
    // Saves due before the last step delay the end; one due at the last step is not taken.
    const int64_t saves = k > 0 && first_checkpoint_step_ < total ? (total - 1 - first_checkpoint_step_) / k + 1 : 0;
    queue_.push(seg_time_ + wall_for(left) + saves * costs_.save(plan_.tier), Item{ItemKind::Completed, 0, 0, train_gen_});
  }
}

Time Simulator::save_done_at(int64_t j) const {
  const int64_t step = first_checkpoint_step_ + (j - 1) * plan_.every_steps;
  return seg_time_ + wall_for(step * trace_.job.step_time - seg_work_) + j * costs_.save(plan_.tier);
}

void Simulator::observe_at(Time t, EventPayload observation) {
  clock_.advance_to(std::max(t, clock_.now()));
  master_.observe(std::move(observation));
}

Duration Simulator::replicate_cost() const {
  return costs_.replicate(ReplicaPlacement::from(plan_, target_).copies_sent());
}

Simulator::CopiesDone Simulator::advance_copy(BackgroundCopy& c, int32_t every, Duration cost, int64_t count, Time t) {
  CopiesDone d;
  const int64_t k = plan_.every_steps;
  const int64_t last_step = first_checkpoint_step_ + (saves_done_ + count - 1) * k;
  const Time last_at = save_done_at(saves_done_ + count);
  auto finish_running = [&](Time by) {
    if (c.running && c.done_at <= by) {
      c.running = false;
      ++d.count;
      d.newest = c.step;
      d.newest_at = c.done_at;
    }
  };
  const int64_t first = memory_saves_ % every == 0 ? every : every - memory_saves_ % every;  // 1-based in batch
  const Duration spacing = plan_.every_steps * trace_.job.step_time + costs_.save(plan_.tier);
  int64_t i = first;
  // Closed form once a copy can never overlap the next candidate; step by step before that.
  while (i <= count) {
    const Time at = save_done_at(saves_done_ + i);
    finish_running(at);
    bool started = false;
    if (!c.running) {
      c.running = started = true;
      c.step = first_checkpoint_step_ + (saves_done_ + i - 1) * k;
      c.done_at = at + cost;
    }
    if (!started || cost > every * spacing) {
      i += every;
      continue;
    }
    // From here every candidate starts a copy that ends before the next one: jump to the last.
    const int64_t last = i + (count - i) / every * every;
    if (last > i) {
      finish_running(save_done_at(saves_done_ + last));  // the one started at i
      const int64_t between = (last - i) / every - 1;    // started and finished in between
      if (between > 0) {
        d.count += between;
        d.newest = first_checkpoint_step_ + (saves_done_ + last - every - 1) * k;
        d.newest_at = save_done_at(saves_done_ + last - every) + cost;
      }
      c.running = true;
      c.step = first_checkpoint_step_ + (saves_done_ + last - 1) * k;
      c.done_at = save_done_at(saves_done_ + last) + cost;
    }
    break;
  }
  d.last_started = c.running && c.step == last_step && c.done_at > last_at;
  finish_running(t);
  return d;
}

void Simulator::catch_up(Time t) {
  // Copies reported in the order they finished (the clock only moves forward).
  auto report = [&](const CopiesDone& persisted, const CopiesDone& replicated, Time not_before) {
    const bool replica_first = replicated.count > 0 && (persisted.count == 0 || replicated.newest_at < persisted.newest_at);
    if (replica_first) observe_at(std::max(replicated.newest_at, not_before), ReplicaStored{replicated.newest, replicated.count});
    if (persisted.count > 0)
      observe_at(std::max(persisted.newest_at, not_before), CheckpointPersisted{persisted.newest, persisted.count});
    if (replicated.count > 0 && !replica_first)
      observe_at(std::max(replicated.newest_at, not_before), ReplicaStored{replicated.newest, replicated.count});
  };
  if (training_ && first_checkpoint_step_ > 0 && save_done_at(saves_done_ + 1) <= t) {
    // Saves completed by t: n with save_done_at(n) <= t < save_done_at(n + 1). Estimate, then settle.
    const Duration per = std::max<Duration>(1, save_done_at(saves_done_ + 2) - save_done_at(saves_done_ + 1));
    int64_t n = saves_done_ + 1 + (t - save_done_at(saves_done_ + 1)) / per;
    while (n > saves_done_ + 1 && save_done_at(n) > t) --n;
    while (save_done_at(n + 1) <= t) ++n;
    const int64_t k = plan_.every_steps;
    const int64_t count = n - saves_done_;
    const int64_t last_step = first_checkpoint_step_ + (n - 1) * k;
    const Time last_at = save_done_at(n);
    const bool memory = plan_.tier == Tier::Memory;
    const int32_t p = memory ? plan_.persist_every : 0;
    CopiesDone persisted, replicated;
    if (memory && plan_.replicas > 0) replicated = advance_copy(replica_, 1, replicate_cost(), count, t);
    if (p > 0) {
      persisted = advance_copy(persist_, p, costs_.persist(), count, t);
      memory_saves_ += count;
    }
    saves_done_ = n;
    next_checkpoint_step_ = last_step + k;
    observe_at(last_at, CheckpointSaved{last_step, plan_.tier, costs_.save(plan_.tier), persisted.last_started, count,
                                        replicated.last_started});
    report(persisted, replicated, last_at);
    return;
  }
  CopiesDone persisted, replicated;
  for (auto [c, d] : {std::pair{&persist_, &persisted}, std::pair{&replica_, &replicated}}) {
    if (c->running && c->done_at <= t) {
      c->running = false;
      *d = CopiesDone{1, c->step, c->done_at, false};
    }
  }
  report(persisted, replicated, 0);
}

// ---- the cluster ---------------------------------------------------------------------------------

void Simulator::try_fill() {
  std::vector<Item> placed;
  bool spares_taken = false;
  for (int32_t s = waiting_.next(); s >= 0; s = waiting_.next(s + 1)) {
    Slot& slot = slots_[s];
    // A warm spare first (it only has to take the slot); else a free machine to place; else a
    // spare still warming (ready, then it takes the slot); else there is none.
    int32_t m = -1;
    bool placing = false;  // a free machine, placed with the others placed now
    Duration delay = trace_.job.spare_activation;
    if (!warm_.empty()) {
      m = warm_.next();
      warm_.erase(m);
      spares_taken = true;
    } else if (!free_.empty()) {
      m = free_.next();
      free_.erase(m);
      placing = true;
    } else if (!warming_.empty()) {
      m = warming_.next();
      warming_.erase(m);
      delay = std::max<Duration>(0, machines_[m].ready_at - clock_.now()) + trace_.job.spare_activation;
    } else {
      if (!slot.reported) {
        slot.reported = true;
        queue_.push(clock_.now(), Item{ItemKind::NoSpare, s});
      }
      continue;
    }
    waiting_.erase(s);
    Machine& mach = machines_[m];
    mach.state = MachineState::Joining;
    mach.slot = s;
    ++mach.gen;
    slot.waiting = false;
    slot.reported = false;
    if (placing) placed.push_back(Item{ItemKind::Joined, s, m, mach.gen});
    else queue_.push(clock_.now() + delay, Item{ItemKind::Joined, s, m, mach.gen});
  }
  // Nodes placed together come up together: one queue entry for all of them (a job's start places
  // thousands at once).
  if (placed.size() == 1) {
    queue_.push(clock_.now() + trace_.job.node_scheduling, placed.front());
  } else if (!placed.empty()) {
    join_batches_.push_back(std::move(placed));
    queue_.push(clock_.now() + trace_.job.node_scheduling,
                Item{ItemKind::JoinedBatch, static_cast<int32_t>(join_batches_.size() - 1)});
  }
  refill_spares();
  if (spares_taken) queue_.push(clock_.now(), Item{ItemKind::SparesChanged});
}

void Simulator::refill_spares() {
  while (warm_.size() + warming_.size() < warm_target_ && !free_.empty()) {
    const int32_t m = free_.next();
    free_.erase(m);
    Machine& mach = machines_[m];
    mach.state = MachineState::Warming;
    ++mach.gen;
    mach.ready_at = clock_.now() + trace_.job.node_scheduling;
    warming_.insert(m);
    queue_.push(mach.ready_at, Item{ItemKind::SpareReady, m, 0, mach.gen});
  }
}

void Simulator::machine_down(int32_t m, Duration repair) {
  Machine& mach = machines_[m];
  if (mach.state == MachineState::Free) free_.erase(m);
  if (mach.state == MachineState::Warming) warming_.erase(m);
  if (mach.state == MachineState::Warm) {
    warm_.erase(m);
    queue_.push(clock_.now(), Item{ItemKind::SparesChanged});
  }
  if (mach.slot >= 0 && slots_[mach.slot].machine == m) down_in_job_.insert(m);
  mach.state = MachineState::Down;
  ++mach.gen;
  slowed_ -= mach.slowdown_permille > 1000;
  mach.slowdown_permille = 1000;
  queue_.push(clock_.now() + (repair > 0 ? repair : trace_.cluster.repair_time), Item{ItemKind::Repaired, m, 0, mach.gen});
}

void Simulator::let_go(int32_t m) {
  down_in_job_.erase(m);
  Machine& mach = machines_[m];
  if (mach.state != MachineState::Down) {  // back to the pool; a machine that is down goes on to its repair
    mach.state = MachineState::Free;
    slowed_ -= mach.slowdown_permille > 1000;
    mach.slowdown_permille = 1000;
    free_.insert(m);
  }
  mach.slot = -1;
}

void Simulator::release_slot(int32_t s) {
  Slot& slot = slots_[s];
  if (slot.machine >= 0) {
    let_go(slot.machine);
    slot.machine = -1;
  }
  slot.waiting = true;
  slot.reported = false;
  waiting_.insert(s);
}

void Simulator::resize_world(int32_t delta) {
  // The job stops (ranks move); the restart that follows waits for the new slots' machines.
  stop_training();
  paused_ = false;
  teardown();
  ++restart_gen_;
  const int32_t n = static_cast<int32_t>(slots_.size());
  const int32_t size = std::max(1, n + delta);
  target_ = size;
  for (int32_t m = 0; m < static_cast<int32_t>(machines_.size()) && size < n; ++m) {
    Machine& mach = machines_[m];
    if (mach.slot >= size) let_go(m);  // in a released slot: a join on its way finds it free and is off
  }
  for (int32_t s = size; s < n; ++s) {
    waiting_.erase(s);
    std::erase(short_of_memory_, s);
  }
  slots_.resize(static_cast<size_t>(size));
  waiting_.reserve(size);
  for (int32_t s = n; s < size; ++s) {
    slots_[s].waiting = true;
    waiting_.insert(s);
  }
  // The master lays its slots out anew and forgets which had no machine: report them again.
  for (int32_t s = waiting_.next(); s >= 0; s = waiting_.next(s + 1)) slots_[s].reported = false;
  try_fill();
}

void Simulator::on_trace_event(const TraceEvent& e) {
  if (e.type == TraceEventType::Scale) {
    // An operator's request, as the live master makes it: a smaller world gives up its highest slots.
    const int32_t n = static_cast<int32_t>(slots_.size());
    const int64_t target = int64_t{n} + e.to - e.from;
    if (e.to == e.from || target < 1 || target > 1'000'000) return;
    ScaleRequested r{e.group, e.from, e.to, {}, e.reason.empty() ? "requested by an operator" : e.reason};
    for (int32_t s = n - 1; s >= target; --s)
      if (slots_[s].machine >= 0) r.release.push_back(slots_[s].machine);
    master_.observe(std::move(r));
    return;
  }
  int32_t m = e.node;
  if (e.rank >= 0) {
    if (static_cast<size_t>(e.rank) >= slots_.size()) return;  // the world shrank below that rank
    m = slots_[e.rank].machine;
    if (m < 0) return;  // nobody holds that rank right now (elastic world, or a slot waiting)
  }
  Machine& mach = machines_[m];
  const bool machine_fault = e.type == TraceEventType::NodeFailure || e.type == TraceEventType::Maintenance;
  // A process can only crash or hang while it exists.
  if ((e.type == TraceEventType::ProcessCrash || e.type == TraceEventType::Hang) &&
      (mach.state != MachineState::InJob || !processes_up_))
    return;
  switch (e.type) {
    case TraceEventType::NodeReturn:
      if (mach.state == MachineState::Down) queue_.push(clock_.now(), Item{ItemKind::Repaired, m, 0, mach.gen});
      return;
    case TraceEventType::Pause:
      // Only a running job can pause; one paused longer than the hang timeout is taken for a hang.
      if (mach.state != MachineState::InJob || !training_) return;
      if (e.duration >= trace_.job.hang_timeout) break;
      stall();
      stop_training();
      paused_ = true;
      pause_reason_ = e.reason.empty() ? "paused for " + format_duration(e.duration) : e.reason;
      queue_.push(clock_.now() + e.duration, Item{ItemKind::PauseEnd, m, 0, ++pause_gen_});
      return;
    case TraceEventType::Slowdown:
      if (mach.state == MachineState::Down) return;
      ++mach.slowdown_gen;
      if (e.duration > 0) queue_.push(clock_.now() + e.duration, Item{ItemKind::SlowdownEnd, m, 0, mach.slowdown_gen});
      set_speed(m, e.slowdown_permille);
      return;
    default: break;
  }
  switch (mach.state) {
    case MachineState::Down: return;  // already down: nothing more to break
    case MachineState::Free:
      if (machine_fault) machine_down(m, e.duration);
      return;
    case MachineState::Warming:
    case MachineState::Warm:  // a spare lost: another free machine takes its place in the pool
      if (machine_fault) {
        machine_down(m, e.duration);
        refill_spares();
      }
      return;
    case MachineState::Joining:
      if (machine_fault) {
        const int32_t s = mach.slot;
        machine_down(m, e.duration);
        mach.slot = -1;
        slots_[s].waiting = true;
        waiting_.insert(s);
        try_fill();
      }
      return;
    case MachineState::InJob: fault(m, e); return;
  }
}

void Simulator::fault(int32_t m, const TraceEvent& e) {
  if (e.memory_needed_permille > 0 && machines_[m].slot >= 0) {
    Slot& slot = slots_[machines_[m].slot];
    slot.memory_needed_permille = std::max(slot.memory_needed_permille, e.memory_needed_permille);
    slot.oom_after = e.duration > 0 ? e.duration : 10 * kMinute;
    slot.oom_reason = e.reason.empty() ? "OOMKilled" : e.reason;
    if (std::find(short_of_memory_.begin(), short_of_memory_.end(), machines_[m].slot) == short_of_memory_.end())
      short_of_memory_.push_back(machines_[m].slot);
  }
  if (training_ || !stalled_) stall();
  stop_training();
  paused_ = false;
  ++restart_gen_;  // a restart in progress cannot complete without this node
  FailureObserved f;
  f.node = m;
  f.reason = e.reason;
  f.stalled_since = stalled_since_;
  Duration latency = trace_.job.exit_detection;
  switch (e.type) {
    case TraceEventType::ProcessCrash:
      f.kind = FailureKind::ProcessExit;
      f.exit_code = e.exit_code;
      f.signal = e.signal;
      break;
    case TraceEventType::Pause:  // longer than the hang timeout: nobody can tell it from a hang
      if (f.reason.empty()) f.reason = "no progress (a pause of " + format_duration(e.duration) + ")";
      [[fallthrough]];
    case TraceEventType::Hang:
      f.kind = FailureKind::Hang;
      f.exit_code = 0;
      latency = trace_.job.hang_timeout;
      break;
    case TraceEventType::Maintenance:
      f.kind = FailureKind::Maintenance;
      f.exit_code = 0;
      latency = 0;  // planned: the drain is announced
      break;
    default:
      f.kind = FailureKind::NodeLost;
      f.exit_code = 0;
      latency = trace_.job.heartbeat_timeout;
      break;
  }
  if (f.kind == FailureKind::NodeLost || f.kind == FailureKind::Maintenance) {
    persist_.running = replica_.running = false;  // the node's part of a copy under way is gone
    machine_down(m, e.duration);  // it keeps its slot until the master relaunches it
  }
  detect_later(std::move(f), latency);
}

// ---- the loop ------------------------------------------------------------------------------------

void Simulator::handle(const Item& item) {
  switch (item.kind) {
    case ItemKind::Detect: deliver_detection(static_cast<size_t>(item.a)); return;
    case ItemKind::NoSpare: {
      Slot& s = slots_[item.a];
      if (s.waiting && free_.empty()) master_.observe(NoSpareNode{item.a});
      else s.reported = false;
      return;
    }
    case ItemKind::Joined: {
      Machine& mach = machines_[item.b];
      if (mach.gen != item.gen || mach.state != MachineState::Joining) return;
      mach.state = MachineState::InJob;
      slots_[item.a].machine = item.b;
      master_.observe(NodeJoined{item.b, item.a, trace_.machine_name(item.b), ""});
      return;
    }
    case ItemKind::JoinedBatch: {
      const std::vector<Item> batch = std::move(join_batches_[static_cast<size_t>(item.a)]);
      for (const Item& j : batch) {
        if (finished_) return;
        handle(j);
      }
      return;
    }
    case ItemKind::Repaired: {
      Machine& mach = machines_[item.a];
      if (mach.gen != item.gen || mach.state != MachineState::Down) return;
      ++mach.gen;
      down_in_job_.erase(item.a);
      if (mach.slot >= 0 && slots_[mach.slot].machine == item.a) {
        // Back before the master relaunched it: it serves its slot again.
        mach.state = MachineState::InJob;
      } else {
        mach.state = MachineState::Free;
        mach.slot = -1;
        free_.insert(item.a);
      }
      master_.observe(NodeReturned{item.a});
      try_fill();
      return;
    }
    case ItemKind::SpareReady: {
      Machine& mach = machines_[item.a];
      if (mach.gen != item.gen || mach.state != MachineState::Warming) return;
      mach.state = MachineState::Warm;
      warming_.erase(item.a);
      warm_.insert(item.a);
      queue_.push(clock_.now(), Item{ItemKind::SparesChanged});
      try_fill();
      return;
    }
    case ItemKind::SparesChanged:
      if (warm_.size() == spares_reported_) return;
      spares_reported_ = warm_.size();
      master_.observe(SparesHeld{spares_reported_});
      return;
    case ItemKind::PauseEnd:
      if (!paused_ || item.gen != pause_gen_) return;
      // The job goes on by itself from where it stopped; what the pause cost is a stall.
      paused_ = false;
      stalled_ = false;
      training_ = true;
      seg_time_ = clock_.now();
      slowdown_ = slowdown_max();
      schedule_training();
      master_.observe(StallObserved{item.a, stalled_since_, true, pause_reason_});
      return;
    case ItemKind::SlowdownEnd: {
      Machine& mach = machines_[item.a];
      if (mach.slowdown_gen != item.gen || mach.state == MachineState::Down) return;
      set_speed(item.a, 1000);
      return;
    }
    case ItemKind::ProcessesUp:
      if (item.gen != restart_gen_) return;
      processes_up_ = true;
      master_.observe(ProcessesStarted{restart_.world_size, restart_.restart});
      queue_.push(clock_.now() + trace_.job.rendezvous_of(restart_.restart),
                  Item{ItemKind::RendezvousDone, 0, 0, restart_gen_});
      return;
    case ItemKind::RendezvousDone:
      if (item.gen != restart_gen_) return;
      master_.observe(RendezvousComplete{restart_.world_size, restart_.restart});
      queue_.push(clock_.now() + costs_.load(restart_.restore_tier), Item{ItemKind::LoadDone, 0, 0, restart_gen_});
      return;
    case ItemKind::LoadDone:
      if (item.gen != restart_gen_) return;
      world_ = restart_.world_size;
      start_training(restart_.restore_step);
      // A process still short of memory runs out of it again, at the same point of its work.
      for (int32_t s : short_of_memory_)
        if (slots_[s].memory_permille < slots_[s].memory_needed_permille && slots_[s].machine >= 0)
          queue_.push(clock_.now() + slots_[s].oom_after, Item{ItemKind::OomAgain, s, 0, restart_gen_});
      master_.observe(CheckpointLoaded{restart_.restore_step, restart_.restore_tier, costs_.load(restart_.restore_tier)});
      return;
    case ItemKind::OomAgain: {
      const Slot& slot = slots_[item.a];
      if (item.gen != restart_gen_ || !training_ || slot.machine < 0 || slot.memory_permille >= slot.memory_needed_permille)
        return;
      TraceEvent again;
      again.type = TraceEventType::ProcessCrash;
      again.exit_code = 137;
      again.signal = 9;
      again.reason = slot.oom_reason;
      fault(slot.machine, again);
      return;
    }
    case ItemKind::Completed:
      if (item.gen != train_gen_ || !training_) return;
      stop_training();
      teardown();
      finished_ = true;
      master_.observe(JobFinished{"completed", trace_.job.total_steps});
      return;
    case ItemKind::Horizon:
      // Faults that happened but are not noticed yet happened all the same: the job stopped
      // then, and what it trained since its restore point is lost.
      for (size_t i = 0; i < detections_.size() && !master_.state().finished(); ++i) deliver_detection(i);
      if (!master_.state().finished()) end_at_horizon();
      finished_ = true;
      return;
  }
}

// ---- decisions -----------------------------------------------------------------------------------

void Simulator::execute(const Event& d) {
  std::visit(
      [&](const auto& p) {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, RecoveryDecided>) {
          if (p.action != RecoveryAction::RelaunchNode && p.action != RecoveryAction::RelaunchWithMoreMemory) return;
          const int32_t s = machines_[p.node].slot;
          if (s < 0 || slots_[s].machine != p.node) return;  // already out of the job
          paused_ = false;
          teardown();
          if (training_) {  // a planned replacement: the job stops now and restarts with the new node
            stall();
            stop_training();
            persist_.running = replica_.running = false;
          }
          ++restart_gen_;  // a restart under way cannot complete without this node either
          if (p.action == RecoveryAction::RelaunchWithMoreMemory)
            slots_[s].memory_permille =
                static_cast<int32_t>(static_cast<int64_t>(slots_[s].memory_permille) * p.memory_permille / 1000);
          // A node relaunched elsewhere leaves its machine behind for a health check and repair;
          // one relaunched for memory leaves a healthy machine that may serve again, and one given
          // up on for repeated software errors is back after a node check finds nothing wrong.
          if (p.action == RecoveryAction::RelaunchNode && machines_[p.node].state != MachineState::Down) {
            const bool software = p.diagnosis == Diagnosis::SoftwareError || p.diagnosis == Diagnosis::Unknown;
            machine_down(p.node, software ? std::max<Duration>(trace_.cluster.check_time, 1) : 0);
          }
          release_slot(s);
          try_fill();
        } else if constexpr (std::is_same_v<T, ScaleDecided>) {
          if (!p.group.empty()) resize_world(p.to - p.from);
        } else if constexpr (std::is_same_v<T, CheckpointPlanSet>) {
          plan_ = p;
          reanchor();
        } else if constexpr (std::is_same_v<T, RestartJob>) {
          stop_training();
          paused_ = false;
          teardown();
          ++restart_gen_;
          restart_ = p;
          // Trainers going back to an older state than memory's: copies still on their way are of a
          // history thrown away.
          if (p.restore_tier != Tier::Memory && p.restore_tier != Tier::Peer) replica_.running = false;
          // A machine that is down cannot start its trainer: the restart fails and is noticed.
          if (!down_in_job_.empty()) {
            const int32_t m = down_in_job_.next();
            detect_later(FailureObserved{m, FailureKind::NodeLost, 0, 0, "node unreachable during restart", clock_.now()},
                         trace_.job.heartbeat_timeout);
            return;
          }
          queue_.push(clock_.now() + p.delay + trace_.job.process_start_of(p.restart, p.warm),
                      Item{ItemKind::ProcessesUp, 0, 0, restart_gen_});
        } else if constexpr (std::is_same_v<T, JobFinished>) {
          stop_training();
          teardown();
          finished_ = true;
        }
      },
      d.payload);
}

}  // namespace goodput
