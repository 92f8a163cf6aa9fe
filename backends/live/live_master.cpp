#include "backends/live/live_master.h"

#include <algorithm>
#include <iostream>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "backends/live/agreement.h"
#include "backends/live/master_status.h"
#include "engine/invariant.h"

namespace goodput::live {

using nlohmann::json;

namespace {
// Nodes lost before they joined, in a row, before the job is failed: a node that cannot start
// (a bad image or binary, an impossible resource request) must not be relaunched forever.
constexpr int32_t kMaxLaunchesLost = 5;
}  // namespace

// ---- construction and the log ---------------------------------------------------------------------

namespace {
JobSpec with_replicas(JobSpec spec) {
  if (spec.replicas.empty()) spec.replicas = spec.workers_only();  // a spec built in code, not parsed
  return spec;
}
}  // namespace

LiveMaster::LiveMaster(JobSpec spec, PolicySet policies, EventStore& store, const Clock& clock,
                       NodeProvider* provider, std::string run_id)
    : spec_(with_replicas(std::move(spec))),
      clock_(clock),
      provider_(provider),
      run_id_(std::move(run_id)),
      store_(store),
      master_(std::move(policies), clock, *this, {&store, this}, JobMaster::Options{.flush_before_acting = true}),
      world_(spec_.replicas, spec_.nodes),
      checks_(spec_.node_check),
      stragglers_(spec_.straggler_factor),
      failures_(spec_) {
  ledger_.reset(spec_.data_shards);
  if (store.last_seq() > 0) {
    resumed_ = true;
    folding_ = true;
    store.for_each([&](const Event& e) { append(e); });
    folding_ = false;
    // Spares the log found faulty were replaced by the master that logged it: not again (one that
    // crashed between the verdict and the launch leaves the pool one short).
    checks_.failed_spares(world_);
    master_.resume_from(store);
    if (provider_) provider_->set_layout(world_.groups());  // as scaled in the log
    // Every node we knew gets a full heartbeat timeout to find the new master.
    for (auto& [id, n] : world_.nodes()) n.last_heartbeat = clock_.now();
  } else {
    master_.observe(spec_.job_started());
    // The spares are launched for slots past the world's: they join as spares (slot -1).
    if (provider_)
      for (int32_t i = 0; i < spec_.nodes + spec_.spares; ++i) provider_->launch(i, 1000);
  }
}

void LiveMaster::append(const Event& e) {
  ledger_.apply(e);
  std::visit(
      [&](const auto& p) {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, NodeJoined>) {
          world_.join(p);
          checks_.joined(p);
          launches_lost_ = grow_back_lost_ = 0;
        } else if constexpr (std::is_same_v<T, ShardsAssigned>) {
          last_assigned_[{p.node, p.local_rank}] = p;
        } else if constexpr (std::is_same_v<T, SlowdownObserved>) {
          stragglers_.fold(p);
        } else if constexpr (std::is_same_v<T, NodeChecked> || std::is_same_v<T, CheckRequested>) {
          checks_.fold(p);
          if constexpr (std::is_same_v<T, NodeChecked>)  // a spare found faulty leaves the pool
            if (Node* n = world_.node(p.node); n && n->slot < 0 && p.verdict == "faulty") n->gone = true;
        } else if constexpr (std::is_same_v<T, StallObserved>) {
          failures_.fold(p);
        } else if constexpr (std::is_same_v<T, FailureObserved>) {
          last_failure_ = p;
        } else if constexpr (std::is_same_v<T, RecoveryDecided>) {
          last_recovery_ = Recovery{p, recovery_note(world_, p, last_failure_ ? &*last_failure_ : nullptr)};
          if (!folding_) notes_.push_back("goodput: " + last_recovery_->note);
          if (p.action == RecoveryAction::RelaunchNode || p.action == RecoveryAction::RelaunchWithMoreMemory)
            world_.relaunch(p);
        } else if constexpr (std::is_same_v<T, RestartJob>) {
          restart_ = p;
          world_.restarted(p);
          run_at_ = e.time + p.delay;
          rdzv_port_ = 0;  // execute() picks a free one
          failures_.restarted();
          exited_.clear();
          last_assigned_.clear();
          gen_saves_ = gen_blocking_ns_ = 0;
        } else if constexpr (std::is_same_v<T, CheckpointSaved>) {
          gen_saves_ += std::max<int64_t>(p.count, 1);
          saved_step_ = std::max(saved_step_, p.step);
          gen_blocking_ns_ += p.blocking * std::max<int64_t>(p.count, 1);
        } else if constexpr (std::is_same_v<T, CheckpointPersisted>) {
          persisted_step_ = std::max(persisted_step_, p.step);
        } else if constexpr (std::is_same_v<T, ReplicaStored>) {
          replicated_step_ = std::max(replicated_step_, p.step);
        } else if constexpr (std::is_same_v<T, CheckpointPlanSet>) {
          plan_ = p;
        } else if constexpr (std::is_same_v<T, ScaleDecided>) {
          world_.scale(p);  // part of the fold: a resumed master lays the slots out the same way
        }
      },
      e.payload);
}

bool LiveMaster::undo_growth(int32_t slot, const std::string& why) {
  const ReplicaGroup& g = world_.group_of(slot);
  const std::optional<int32_t> before = world_.grown_from(g.type);
  if (!before || slot - g.first_slot < *before) return false;  // not a slot the growth added
  ScaleRequested r{g.type, g.count, *before, {},
                   "no machine came for the " + g.type + " group's new slot " + std::to_string(slot) + " in " +
                       std::to_string(kMaxLaunchesLost + 1) + " tries (" + why + "): back to " + std::to_string(*before)};
  for (int32_t i = g.count - 1; i >= *before; --i)  // the new slots' nodes that did come go too
    if (const NodeId id = world_.at(g.first_slot + i); id >= 0) r.release.push_back(id);
  launches_lost_ = 0;
  observe(std::move(r));
  return true;
}

void LiveMaster::execute(const Event& d) {
  if (std::holds_alternative<RestartJob>(d.payload)) {
    rdzv_port_ = pick_port();
    if (provider_)
      for (int32_t s = 0; s < world_.size(); ++s)
        if (const Node* n = world_.holder(s)) provider_->ranked(n->name, s);
  }
  if (const auto* sc = std::get_if<ScaleDecided>(&d.payload); sc && !sc->group.empty() && provider_) {
    // append() already laid the slots out anew: let the released machines go, fill the new slots.
    provider_->set_layout(world_.groups());
    for (NodeId id : sc->released)
      if (const Node* n = world_.node(id)) provider_->terminate(n->name);
    for (int32_t s = 0; s < world_.size(); ++s)
      if (world_.at(s) < 0) provider_->launch(s, world_.memory_permille(s));
    return;
  }
  if (const auto* r = std::get_if<RecoveryDecided>(&d.payload)) {
    if (r->action != RecoveryAction::RelaunchNode && r->action != RecoveryAction::RelaunchWithMoreMemory) return;
    const Node* n = world_.node(r->node);
    if (provider_ && n) {
      if (r->diagnosis == Diagnosis::HardwareError) provider_->exclude(n->name);  // elsewhere, not there again
      provider_->terminate(n->name);
      // The slot it held (append already vacated it) gets a fresh machine, with that slot's memory.
      provider_->launch(n->former_slot, n->former_slot >= 0 ? world_.memory_permille(n->former_slot) : 1000);
    }
  }
}

void LiveMaster::observe(EventPayload p) {
  if (master_.state().finished()) return;
  if (std::holds_alternative<JobFinished>(p)) log_refusals(true);  // the log's last word on them
  master_.observe(std::move(p));
}

void LiveMaster::refused_token(const std::string& peer_address) {
  ++unauthorized_;
  refused_peer_ = peer_address.substr(0, 100);
  log_refusals(false);
}

void LiveMaster::log_refusals(bool now) {
  const int64_t pending = unauthorized_ - unauthorized_logged_;
  if (pending <= 0 || finished()) return;
  if (!now && refusals_logged_at_ && clock_.now() - *refusals_logged_at_ < kMinute) return;
  unauthorized_logged_ = unauthorized_;
  refusals_logged_at_ = clock_.now();
  master_.observe(ApiRefused{refused_peer_, pending, "missing or wrong bearer token"});
}

uint16_t LiveMaster::pick_port() const {
  // The port torch.distributed's store listens on, on rank 0's machine: the one rank 0's agent
  // found free there (it offers a new one after each use). An agent that offers none (an older
  // one) gets a port free on the master's machine, right where every rank runs here.
  if (world_.size() > 0)
    if (const Node* rank0 = world_.holder(0); rank0 && rank0->rdzv_port > 0) return rank0->rdzv_port;
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::tcp::v4(), 0});
  return a.local_endpoint().port();
}

// ---- the agent protocol ----------------------------------------------------------------------------

json LiveMaster::register_node(const RegisterRequest& req) {
  if (finished()) return json{{"action", "exit"}};
  if (const Node* known = world_.live_named(req.name)) {  // a retry, or a master restart
    json out = assignment(*known);
    advance();
    return out;
  }
  Node n;
  n.id = world_.next_id();
  n.name = req.name;
  n.host = req.host;
  n.check_port = req.check_port;
  n.rdzv_port = req.rdzv_port;
  n.replica_port = req.replica_port;
  n.last_heartbeat = clock_.now();
  // The slot it was launched for if that is still vacant (so a pod labelled rank 3 is rank 3),
  // else the first vacant one of its replica type. None: it joins as a spare (an elastic policy
  // may grow the world to take it). Its type: the slot it was launched for says (with one group,
  // any slot will do).
  if (req.slot >= 0 && req.slot < world_.slot_count() && world_.groups().size() > 1)
    n.kind = world_.group_of(static_cast<int32_t>(req.slot)).type;
  const NodeId id = n.id;
  const std::optional<int32_t> slot = world_.slot_for(n, req.slot);
  world_.nodes()[id] = std::move(n);
  const std::string kind = world_.node(id)->kind;
  observe(NodeJoined{id, slot.value_or(-1), req.name, kind});  // the fold records the slot
  json out = assignment(*world_.node(id));
  advance();
  return out;
}

json LiveMaster::assignment(const Node& n) const {
  json out{{"node", n.id}, {"slot", n.slot}, {"heartbeat_interval_ms", spec_.heartbeat_interval / kMillisecond}};
  const JobState& s = master_.state();
  // The collective probe's program: any node checked may be asked to host a pair's rank 0.
  auto with_collective = [&] {
    if (spec_.node_check.collective.empty()) return;
    json env = json::array();
    for (const auto& [k, v] : spec_.env) env.push_back(k + "=" + v);
    out["check_collective"] = {{"argv", spec_.node_check.collective}, {"env", env}};
  };
  if (s.finished() || n.gone) {
    out["action"] = "exit";
  } else if (n.slot >= 0 && n.slot < world_.size() && checks_.pending(world_)) {
    // Nobody trains until every node of the world has passed its check.
    out["action"] = "stop";
    with_collective();
    if (json c = checks_.order(n, world_); !c.is_null()) {
      out["action"] = "check";
      out["check"] = std::move(c);
    }
  } else if (json c = n.slot < 0 ? checks_.order(n, world_) : json(); !c.is_null()) {
    // A spare is checked while the world trains, to be known good when it takes a slot.
    out["action"] = "check";
    out["check"] = std::move(c);
    with_collective();
  } else if (n.slot < 0 || n.slot >= world_.size() || s.restart_jobs() == 0 || s.phase() == Phase::Scheduling ||
             s.phase() == Phase::WaitingForCapacity || s.needs_restart() || clock_.now() < run_at_ || !world_.ranks_held()) {
    // A spare, or the world is between restarts or misses a rank (a parameter server's slot that
    // no worker may take): no trainer should run.
    out["action"] = "stop";
  } else {
    out.update(run_order(n));
  }
  if (!n.inject.empty()) out["inject"] = n.inject;
  return out;
}

json LiveMaster::run_order(const Node& n) const {
  // The restart ordered is the newest one the log holds.
  GOODPUT_INVARIANT(restart_.restart + 1 == master_.state().restart_jobs(),
                    "ordering restart " + std::to_string(restart_.restart) + ", the log has " +
                        std::to_string(master_.state().restart_jobs()) + " restarts");
  json out;
  out["action"] = "run";
  out["restart"] = restart_.restart;
  out["rank"] = n.slot;  // the node's rank (torchrun's GROUP_RANK); its processes' ranks follow
  out["world_size"] = restart_.world_size;
  const ReplicaGroup& g = world_.group_of(n.slot);
  const auto& groups = world_.groups();
  if (const int32_t world_processes = first_process(groups, restart_.world_size); world_processes != restart_.world_size) {
    // Several trainers per node: their global ranks start at rank_base; roles as torchrun lays them.
    out["nproc"] = g.nproc_per_node;
    out["rank_base"] = first_process(groups, n.slot);
    out["process_world_size"] = world_processes;
  }
  if (groups.size() > 1 || spec_.role != "default") {
    out["role"] = groups.size() > 1 ? g.type : spec_.role;
    out["role_rank_base"] = (n.slot - g.first_slot) * g.nproc_per_node;
    out["role_world_size"] = process_counts(groups, replica_counts(groups, restart_.world_size)).value(g.type, 0);
  }
  // torch.distributed's store runs on rank 0: its host, as its agent reported it.
  const Node* rank0 = world_.holder(0);
  out["master_addr"] = rank0 && !rank0->host.empty() ? rank0->host : std::string("127.0.0.1");
  out["master_port"] = rdzv_port_;
  out["restore_step"] = restart_.restore_step;
  out["restore_tier"] = std::string(to_string(restart_.restore_tier));
  out["checkpoint_every_steps"] = plan_.every_steps;
  out["checkpoint_tier"] = std::string(to_string(plan_.tier));
  out["persist_every"] = plan_.persist_every;
  out["total_steps"] = spec_.total_steps;
  if (!spec_.trainer_reports) out["plain"] = true;
  // Warm starts: each agent keeps an interpreter with these imported ready for the next restart.
  if (spec_.warm_start) out["warm_preload"] = spec_.preload;
  out["dump_stacks"] = last_failure_ && last_failure_->kind == FailureKind::Hang;  // the old trainers' stacks say where they hung
  out["job"] = spec_.job;
  out["run_id"] = run_id_;
  // Its replica group's program; every rank learns its part and the world's shape.
  out["command"] = g.command;
  json env = g.env;
  env["GOODPUT_REPLICA_TYPE"] = g.type;
  // The index of the node's first process among its type's (the agent adds the local rank).
  env["GOODPUT_REPLICA_INDEX"] = std::to_string((n.slot - g.first_slot) * g.nproc_per_node);
  env["GOODPUT_REPLICAS"] = process_counts(groups, replica_counts(groups, restart_.world_size)).dump();
  // Once a group was scaled, storage holds checkpoints of more than one layout: a restore from
  // it loads exactly the step the master chose, each rank finding its part's state by the ranks
  // of the layout that step was saved under.
  if (world_.relaid() && restart_.restore_tier == Tier::Storage)
    if (const json saved = world_.layout_of(restart_.restore_step); saved.is_object())
      env["GOODPUT_RESTORE_REPLICAS"] = process_counts(groups, saved).dump();
  out["env"] = env;
  out["storage_dir"] = spec_.storage_dir;
  // Copies in peers' memory (checkpoint.replicas): where this node's go after each save, and, for
  // a restart from them, where its ranks' copies are.
  if (const ReplicaPlacement placement = ReplicaPlacement::from(plan_, restart_.world_size); placement.replicas > 0) {
    json holders = json::array();
    placement.for_each_holder(n.slot, [&](int32_t h) {
      if (const Node* holder = world_.holder(h); holder && holder->replica_port > 0 && !holder->gone)
        holders.push_back({{"name", holder->name}, {"host", holder->host.empty() ? "127.0.0.1" : holder->host},
                           {"port", holder->replica_port}});
    });
    out["replicate"] = {{"key", spec_.job + "-" + run_id_}, {"holders", holders},
                        {"bytes_per_s", spec_.replica_mb_per_s * 1e6}};
  }
  out["checkpoint_bytes"] = spec_.checkpoint_bytes_per_node;
  out["memory_limit_mb"] = spec_.memory_limit_mb;
  return out;
}

json LiveMaster::heartbeat(const AgentReport& r) {
  Node* n = world_.node(r.node);
  if (!n) throw ApiError(404, "unknown node: register again");
  // Hosts are not in the log: a master resumed from it learns them from the next heartbeats.
  if (n->host.empty()) n->host = r.host;
  if (r.check_port > 0) n->check_port = r.check_port;
  if (r.rdzv_port > 0) n->rdzv_port = r.rdzv_port;
  n->persist_error = r.persist_error;
  n->replica_error = r.replica_error;
  if (r.replica_port > 0) n->replica_port = r.replica_port;
  const bool held_changed = r.held != n->held;
  if (held_changed) n->held = r.held;
  // A relaunched node could not fetch its ranks' copies: its trainers restore from storage.
  if (!r.fetch_error.empty() && !finished()) observe(StatusObserved{"replica", n->name, r.fetch_error});
  if (r.check) checks_.report(n->id, r.check->first, r.check->second);
  const Time now = clock_.now();
  n->last_heartbeat = now;
  if (r.leaving) {
    // The agent was stopped on purpose and is going: not a fault of its machine.
    if (!n->gone && n->slot >= 0 && !finished())
      observe(FailureObserved{n->id, FailureKind::Maintenance, 0, 0,
                              "agent leaving (" + *r.leaving + "): stopped by an operator or the cluster", now});
    advance();
    return json{{"action", "exit"}};
  }
  // A report that only moves the step changes no agreement: nothing to ask the world (the tick
  // weighs what time changes). Per heartbeat the master does O(1) work, whatever the world's size.
  if (r.trainer && n->trainer.apply(*r.trainer, now)) {
    if (n->trainer.exited && !n->trainer.done && n->trainer.restart == restart_.restart) exited_.insert(n->id);
    advance();
  } else if (held_changed) {
    advance();
  }
  if (rdzv_port_ == 0) rdzv_port_ = pick_port();  // a resumed master: the old one's port died with it
  json out = assignment(*n);
  n->inject.clear();
  return out;
}

json LiveMaster::next_shard(NodeId node, int32_t restart, int64_t request, int32_t local_rank) {
  const Node* n = world_.node(node);
  if (!n || n->gone || n->slot < 0) throw ApiError(409, "node holds no slot");
  const Phase phase = master_.state().phase();
  if (restart != restart_.restart || (phase != Phase::Training && phase != Phase::CheckpointLoad))
    throw ApiError(409, "not training in the current restart");
  if (ledger_.total() == 0) throw ApiError(404, "this job has no data-shard service (data_shards is 0)");
  // Until the log has the step the world loaded, the ledger still counts as done the work of the
  // history given up after it: the queue may look empty, and a shard handed out now might never
  // be trained. A rank that loaded first asks again (goodput.live waits for as long as it takes).
  if (phase == Phase::CheckpointLoad) throw ApiError(409, "the world is still loading its checkpoint: ask again");
  json out;
  const auto it = last_assigned_.find({n->id, local_rank});
  // A request older than the last one answered is a stale copy the network delivered late (its
  // trainer asked again and moved on): a new shard for it would stay with nobody.
  if (request >= 0 && it != last_assigned_.end() && request < it->second.request)
    throw ApiError(409, "request " + std::to_string(request) + " is older than the last one answered (" +
                            std::to_string(it->second.request) + ")");
  // A retry (the answer was lost, or the master restarted) gets the same shard again.
  if (request >= 0 && it != last_assigned_.end() && it->second.request == request && !it->second.shards.empty()) {
    out = json{{"shard", it->second.shards.front()}, {"of", ledger_.total()}};
  } else if (const auto next = ledger_.next_queued(); !next) {
    out = json{{"shard", nullptr}, {"remaining", ledger_.total() - ledger_.done()}};
  } else {
    master_.log(ShardsAssigned{n->id, request, {*next}, local_rank});  // durable before the trainer hears of it
    out = json{{"shard", *next}, {"of", ledger_.total()}};
  }
  advance();
  return out;
}

json LiveMaster::complete_shards(NodeId node, int64_t step, const std::vector<int64_t>& done) {
  const Node* n = world_.node(node);
  if (!n || n->gone) throw ApiError(409, "unknown node");
  // A late retry, or a duplicate the network delivered after the end: nothing is logged any more.
  if (finished()) throw ApiError(409, "the job has finished");
  // Idempotent: a retry of a completion the log already holds is acknowledged again.
  std::vector<int64_t> shards;
  for (int64_t s : done) {
    if (ledger_.done_by(s, n->id)) continue;
    if (!ledger_.assigned_to(s, n->id)) throw ApiError(409, "shard " + std::to_string(s) + " is not assigned to this node");
    shards.push_back(s);
  }
  if (!shards.empty()) master_.log(ShardsCompleted{n->id, step, shards});
  advance();
  return json{{"done", ledger_.done()}, {"of", ledger_.total()}};
}

// ---- an operator's requests ------------------------------------------------------------------------

json LiveMaster::inject(const std::string& fault, int32_t slot, int32_t local_rank) {
  if (fault != "kill-process" && fault != "kill-node" && fault != "hang" && fault != "oom" && fault != "corrupt-replica")
    throw std::invalid_argument("fault must be kill-process, kill-node, hang, oom or corrupt-replica, not '" + fault + "'");
  if (slot < 0 || slot >= world_.size() || world_.at(slot) < 0)
    throw std::invalid_argument("no node holds slot " + std::to_string(slot));
  if (local_rank < 0 || local_rank >= world_.group_of(slot).nproc_per_node)
    throw std::invalid_argument("slot " + std::to_string(slot) + "'s node runs " +
                                std::to_string(world_.group_of(slot).nproc_per_node) + " trainer processes: no local rank " +
                                std::to_string(local_rank));
  Node& n = *world_.node(world_.at(slot));
  // To the agent: "kill-process" hits local rank 0, "kill-process@2" local rank 2.
  n.inject.push_back(local_rank > 0 ? fault + "@" + std::to_string(local_rank) : fault);
  json out{{"node", n.id}, {"name", n.name}, {"slot", slot}, {"fault", fault}};
  if (local_rank > 0) out["local_rank"] = local_rank;
  return out;
}

json LiveMaster::request_scale(const std::string& group, int32_t count, const std::string& reason) {
  if (finished()) throw std::invalid_argument("the job has finished");
  if (group != "ps" && group != "worker")
    throw std::invalid_argument("only the \"ps\" and \"worker\" groups can be scaled, not '" + group + "'");
  const auto& groups = world_.groups();
  const auto g = std::find_if(groups.begin(), groups.end(), [&](const ReplicaGroup& x) { return x.type == group; });
  if (g == groups.end()) throw std::invalid_argument("the job has no '" + group + "' group");
  if (count < 1) throw std::invalid_argument("a '" + group + "' group needs at least one node");
  if (master_.state().restart_jobs() == 0 || world_.size() < world_.slot_count() || !world_.every_slot_held())
    throw std::invalid_argument("the world is not complete (a node is being placed or replaced); ask again when it is");
  if (checks_.in_round() || checks_.pending(world_) || checks_.waiting())
    throw std::invalid_argument("a node check is in progress or waiting; ask again when it ends");
  if (count == g->count) return json{{"group", group}, {"count", count}, {"changed", false}};
  ScaleRequested r{group, g->count, count, {}, reason.empty() ? "requested by an operator" : reason};
  json released = json::array();
  for (int32_t i = g->count - 1; i >= count; --i) {  // the group's highest slots go
    const NodeId id = world_.at(g->first_slot + i);
    r.release.push_back(id);
    released.push_back({{"slot", g->first_slot + i}, {"node", id}, {"name", world_.node(id)->name}});
  }
  const int32_t from = g->count;
  observe(std::move(r));
  // What the restart goes back to: the newest checkpoint in storage, or the start when there is none.
  const CheckpointRef& stored = master_.state().checkpoints().newest_in_storage();
  json out{{"group", group}, {"from", from}, {"count", count}, {"released", released},
           {"restore_step", stored.valid ? stored.step : 0}};
  if (!stored.valid) out["warning"] = "no checkpoint has reached storage yet: the job starts over";
  advance();
  return out;
}

json LiveMaster::request_check(const std::vector<int32_t>& slots, const std::string& fault, const std::string& reason,
                               bool now) {
  if (finished()) throw std::invalid_argument("the job has finished");
  if (!fault.empty() && !valid_check_fault(fault))
    throw std::invalid_argument("fault must be corrupt, link-down or slow:F (F from 1 to 1000), not '" + fault + "'");
  if (checks_.in_round() || checks_.pending(world_)) throw std::invalid_argument("a node check is in progress; ask again when it ends");
  if (checks_.waiting()) throw std::invalid_argument("a node check is waiting for the next checkpoint; ask again when it ends");
  std::vector<int32_t> wanted = slots;
  if (wanted.empty())
    for (int32_t s = 0; s < world_.size(); ++s) wanted.push_back(s);
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  CheckRequested r{{}, fault, reason.empty() ? "requested by an operator" : reason};
  json names = json::array();
  for (int32_t s : wanted) {
    if (s < 0 || s >= world_.size() || world_.at(s) < 0) throw std::invalid_argument("no node holds slot " + std::to_string(s));
    r.nodes.push_back(world_.at(s));
    names.push_back({{"slot", s}, {"node", world_.at(s)}, {"name", world_.holder(s)->name}});
  }
  json out{{"checking", names}, {"when", "now"}};
  if (!now && plan_.every_steps > 0 && master_.state().phase() == Phase::Training) {
    r.waiting = true;
    r.after_step = saved_step_;
    out["when"] = "after the next checkpoint";
  }
  observe(std::move(r));  // one that waits is kept by the checks' fold
  advance();
  return out;
}

void LiveMaster::start_waiting_check() {
  // After the checkpoint it waited for (or at once if the job stopped training meanwhile: it
  // restarts anyway), for the nodes that still hold their slots.
  if (!checks_.waiting() || finished()) return;
  if (master_.state().phase() == Phase::Training && saved_step_ <= checks_.waiting()->after_step) return;
  CheckRequested r = *checks_.waiting();
  r.waiting = false;  // this one starts it
  r.after_step = 0;
  std::erase_if(r.nodes, [&](NodeId id) { const Node* n = world_.node(id); return !n || n->gone || n->slot < 0; });
  checks_.drop_waiting();
  if (!r.nodes.empty()) observe(std::move(r));
}

void LiveMaster::stop() { observe(JobFinished{"stopped", newest_step()}); }

// ---- turning reports into observations ------------------------------------------------------------

void LiveMaster::tick() {
  if (finished()) return;
  // What a tick finds (a zone's nodes lost at once) is committed once and then acted on.
  JobMaster::Burst burst(master_);
  const Time now = clock_.now();
  if (provider_) {
    for (StatusObserved& s : provider_->status_changes()) observe(std::move(s));
    for (const LostNode& lost : provider_->lost()) on_lost(lost, now);
    if (grow_back_at_ && now >= *grow_back_at_ && !finished()) {
      grow_back_at_.reset();
      // Still a slot outside the world (a world slot that fell vacant meanwhile has its own launch).
      if (const auto s = world_.first_vacant(); s && *s >= world_.size()) machines().launch(*s, world_.memory_permille(*s));
    }
  }
  if (provider_ && !finished()) ask_again_for_vacant_slots(now);
  for (auto& [id, n] : world_.nodes())
    if (!n.gone && n.slot >= 0 && n.slot < world_.size() && now - n.last_heartbeat > spec_.heartbeat_timeout && !finished())
      observe(FailureObserved{id, FailureKind::NodeLost, 0, 0,
                              "no heartbeat for " + format_duration(now - n.last_heartbeat), n.last_heartbeat});
  start_waiting_check();
  run_checks();
  log_refusals(false);
  // Straggler statistics move slowly: weigh them on the tick, not on every heartbeat.
  ticking_ = true;
  advance();
  ticking_ = false;
}

void LiveMaster::ask_again_for_vacant_slots(Time now) {
  std::erase_if(vacant_since_, [&](const auto& v) { return !world_.vacant().contains(v.first); });
  for (int32_t s : world_.vacant()) {
    if (s >= world_.size()) break;  // outside a shrunk world: grow_back_at_ asks
    const auto [it, fresh] = vacant_since_.try_emplace(s, now);
    if (fresh || now - it->second < spec_.join_timeout) continue;
    it->second = now;
    notes_.push_back("goodput: no node has taken slot " + std::to_string(s) + " for " + format_duration(spec_.join_timeout) +
                     " (join_timeout): asking for another machine");
    machines().launch(s, world_.memory_permille(s));
  }
}

NodeProvider& LiveMaster::machines() {
  // Outside execute() (which JobMaster calls once the decisions are committed), an observation of
  // this tick may still be in the open transaction: commit it before the world changes.
  store_.flush();
  return *provider_;
}

void LiveMaster::on_lost(const LostNode& lost, Time now) {
  if (finished()) return;
  if (const Node* n = world_.named(lost.name)) {
    if (!n->gone && n->slot >= 0) observe(FailureObserved{n->id, FailureKind::NodeLost, 0, 0, lost.reason, now});
    return;
  }
  // A node that never joined: its machine never came (a Ray job stuck PENDING or refused, an
  // agent that died at start). The vacant slot waits for a spare (NoSpareNode, once per slot: an
  // elastic policy may shrink the world), and the provider is asked for another machine.
  std::cerr << "goodput: node " << lost.name << " was lost before it joined: " << lost.reason << "\n";
  if (lost.fatal) {
    observe(JobFinished{"failed: " + lost.reason, newest_step()});
    return;
  }
  const std::optional<int32_t> vacant = world_.first_vacant();
  if (!vacant) return;  // nobody is waiting for this node
  if (*vacant >= world_.size()) {
    // Only a chance to grow back (the world shrank without this slot and trains meanwhile): ask
    // again, never failing the job for it, but later each time (1 s, 2 s, ... up to 256 s), so a
    // node that dies as it starts does not become a loop of launches. tick() asks.
    grow_back_at_ = now + (kSecond << std::min(grow_back_lost_++, 8));
    return;
  }
  // Nodes that keep failing before they join while the world waits for them fail the job (a
  // broken image or agent would loop for ever), unless the slot is one an operator's scale added:
  // then the scale is undone and the job goes on as it was.
  if (++launches_lost_ > kMaxLaunchesLost) {
    if (!undo_growth(*vacant, lost.reason))
      observe(JobFinished{"failed: nodes keep failing before they join: " + lost.reason, newest_step()});
    return;
  }
  for (int32_t s = 0; s < world_.size(); ++s)
    if (world_.at(s) < 0 && world_.mark_waiting(s)) {
      observe(NoSpareNode{s, world_.group_of(s).type != "worker"});
      break;
    }
  machines().launch(*vacant, world_.memory_permille(*vacant));
}

void LiveMaster::advance() {
  if (in_advance_) return;
  in_advance_ = true;
  struct Guard {
    bool& b;
    ~Guard() { b = false; }
  } guard{in_advance_};
  for (int round = 0; round < 8 && !finished(); ++round) {
    const JobState& s = master_.state();
    const Phase phase = s.phase();
    const Time now = clock_.now();
    const std::vector<Node*>& w = world_.ranks();
    if (w.empty() || s.restart_jobs() == 0) return;
    const int32_t gen = restart_.restart;
    if (phase != Phase::Restart && phase != Phase::Rendezvous && phase != Phase::CheckpointLoad && phase != Phase::Training)
      return;
    sweeps_.epoch = static_cast<int64_t>(world_.epoch());
    if (auto f = completed(w, gen, sweeps_)) {
      observe(std::move(*f));
      return;
    }
    if (auto p = persisted(w, persisted_step_, saved_step_, sweeps_)) {
      observe(*p);
      continue;
    }
    if (auto r = replicated(w, world_.groups(), ReplicaPlacement::from(plan_, world_.size()), replicated_step_, saved_step_,
                            sweeps_)) {
      observe(*r);  // logged before any restart relies on these copies
      continue;
    }
    Ranks exits;  // the ranks whose trainers reported an exit in this restart, by rank
    for (NodeId id : exited_)
      if (Node* n = world_.node(id); n && !n->gone && n->slot >= 0 && n->slot < world_.size()) exits.push_back(n);
    std::sort(exits.begin(), exits.end(), [](const Node* a, const Node* b) { return a->slot < b->slot; });
    FailureWatch::Notice noticed = failures_.notice(w, exits, gen, phase, now, ticking_);
    if (noticed.kind == FailureWatch::Notice::Kind::Wait) return;  // tick() comes back
    if (noticed.kind == FailureWatch::Notice::Kind::Observe) {
      if (noticed.dump_stacks)
        for (Node* n : w) n->inject.push_back("dump-stacks");
      observe(std::move(*noticed.event));
      continue;
    }
    if (auto e = phase_reached(phase, w, gen, now, run_at_, restart_.world_size, sweeps_)) {
      observe(std::move(*e));
      continue;
    }
    if (phase == Phase::Training) {
      if (ticking_)
        if (auto slow = stragglers_.judge(w)) {
          observe(*slow);
          continue;
        }
      if (auto c = saved(w, gen, gen_saves_, gen_blocking_ns_, plan_, sweeps_)) {
        observe(*c);
        start_waiting_check();  // the moment an operator's check waited for: nothing to recompute
        continue;
      }
    }
    return;
  }
}

// ---- pre-flight node check (node_checks.h says how rounds go) --------------------------------------

void LiveMaster::run_checks() {
  if (!checks_.on() || finished()) return;
  const Time now = clock_.now();
  if (checks_.in_round()) {
    if (!checks_.round_over(world_, now)) return;
    for (NodeChecked& c : checks_.judge(world_)) observe(std::move(c));  // the evidence, before anything is decided
    if (!finished() && checks_.start_second_round(world_, now)) return;
    act_on_checks();
    return;
  }
  act_on_checks();
  checks_.start_first_round(world_, now);
}

void LiveMaster::act_on_checks() {
  // A spare found faulty has left the pool (the fold marked it gone): its machine goes back and
  // another spare is asked for in its stead. Nothing is decided for the world, which trains on.
  for (NodeId id : checks_.failed_spares(world_)) {
    if (finished() || !provider_) break;
    const Node* n = world_.node(id);
    notes_.push_back("goodput: spare " + n->name + " failed its node check: replaced");
    machines().terminate(n->name);
    machines().launch(world_.slot_count(), 1000);
  }
  // Verdicts become observations for the policies: a faulty node is a failure ("node check failed"
  // reads as a hardware error), a straggler a slowdown with its measured ratio. Each once; a
  // master resumed from its log acts on a verdict the old one logged but did not act on.
  while (!finished()) {
    const auto v = checks_.next_to_act(world_);
    if (!v) return;
    if (v->verdict == "passed") {
      // Checked again on request and found well: a slowdown reported for it before is over.
      if (stragglers_.reported(v->node) > 1000) observe(SlowdownObserved{v->node, 1000});
    } else if (v->verdict == "faulty") {
      observe(FailureObserved{v->node, FailureKind::NodeLost, 0, 0, "node check failed: " + v->detail, clock_.now()});
    } else if (v->slowdown_permille > 1000) {
      observe(SlowdownObserved{v->node, v->slowdown_permille});
    }
  }
}

}  // namespace goodput::live
