#include "backends/live/agreement.h"

#include <algorithm>
#include <climits>

namespace goodput::live {

namespace {
// The tier that took longer: storage, then a peer's copy, then the node's own memory.
Tier slower_tier(Tier a, Tier b) {
  auto cost = [](Tier t) { return t == Tier::Storage ? 3 : t == Tier::Peer ? 2 : t == Tier::Memory ? 1 : 0; };
  return cost(a) >= cost(b) ? a : b;
}

int phase_rank(const std::string& p) {
  if (p == "starting") return 1;
  if (p == "rendezvous") return 2;
  if (p == "loaded") return 3;
  if (p == "training") return 4;
  return 0;  // none, exited
}
}  // namespace

std::optional<JobFinished> completed(const Ranks& w, int32_t gen, Sweeps& sw) {
  if (!sw.completed.all(w, {sw.epoch, gen, 0, 0},
                        [&](const Trainer& t) { return t.restart == gen && t.done && (!t.exited || t.exit_code == 0); }))
    return std::nullopt;
  int64_t step = 0;
  for (const Node* n : w) step = std::max(step, n->trainer.step);
  return JobFinished{"completed", step};
}

std::optional<CheckpointPersisted> persisted(const Ranks& w, int64_t persisted, int64_t saved, Sweeps& sw) {
  // Every rank must hold some step in range before any step can be common to all.
  const bool each_holds_one = sw.persisted.all(w, {sw.epoch, persisted, saved, 0}, [&](const Trainer& t) {
    return std::any_of(t.storage_steps.begin(), t.storage_steps.end(),
                       [&](int64_t step) { return step > persisted && step <= saved; });
  });
  if (!each_holds_one) return std::nullopt;
  std::optional<int64_t> common;
  for (int64_t step : w.front()->trainer.storage_steps)
    if (step > persisted && step <= saved && (!common || step > *common) && std::all_of(w.begin(), w.end(), [&](const Node* n) {
          const std::vector<int64_t>& held = n->trainer.storage_steps;
          return std::find(held.begin(), held.end(), step) != held.end();
        }))
      common = step;
  if (!common) return std::nullopt;
  return CheckpointPersisted{*common, 1};
}

std::optional<ReplicaStored> replicated(const Ranks& w, const std::vector<ReplicaGroup>& groups,
                                        const ReplicaPlacement& placement, int64_t replicated, int64_t saved, Sweeps& sw) {
  if (placement.replicas <= 0 || saved <= replicated || w.size() < 2) return std::nullopt;
  const bool held = sw.replicated.all_nodes(w, {sw.epoch, replicated, saved, placement.replicas}, [&](const Node& n) {
    const int32_t first = first_process(groups, n.slot);
    const int32_t procs = replica_group(groups, n.slot).nproc_per_node;
    bool all = true;
    placement.for_each_holder(n.slot, [&](int32_t h) {
      const std::vector<std::pair<int32_t, int64_t>>& copies = w[static_cast<size_t>(h)]->held;
      for (int32_t r = first; r < first + procs && all; ++r)
        all = std::binary_search(copies.begin(), copies.end(), std::pair<int32_t, int64_t>{r, saved});
    });
    return all;
  });
  if (!held) return std::nullopt;
  return ReplicaStored{saved, 1};
}

Node* exit_culprit(const Ranks& w, int32_t gen) {
  // A signal over an exit code, an out-of-memory reason over others; and an exit that says a peer
  // went away (gloo's "Connection closed by peer", which aborts the process: SIGABRT) is the
  // collateral of another rank's failure, never its cause.
  auto score = [](const Trainer& x) {
    const std::string& r = x.exit_reason;
    const bool collateral = r.find("closed by peer") != std::string::npos || r.find("reset by peer") != std::string::npos;
    return (collateral ? -4 : 0) + (x.exit_signal != 0 ? 2 : 0) + (r.find("emory") != std::string::npos ? 1 : 0);
  };
  Node* culprit = nullptr;
  for (Node* n : w) {
    const Trainer& t = n->trainer;
    if (t.restart != gen || !t.exited || t.done) continue;
    if (!culprit || score(t) > score(culprit->trainer) ||
        (score(t) == score(culprit->trainer) && t.exited_at < culprit->trainer.exited_at))
      culprit = n;
  }
  return culprit;
}

Node* hang_culprit(const Ranks& w, int32_t gen, Time now, Duration hang_timeout) {
  const bool hung = std::any_of(w.begin(), w.end(), [&](const Node* n) {
    const Trainer& t = n->trainer;
    return t.restart == gen && !t.exited && now - t.last_progress > hang_timeout;
  });
  if (!hung) return nullptr;
  Node* culprit = nullptr;
  for (Node* n : w) {
    const Trainer& t = n->trainer;
    if (t.restart != gen || t.exited) continue;
    if (!culprit || (t.stopped && !culprit->trainer.stopped) ||
        (t.stopped == culprit->trainer.stopped && t.last_progress < culprit->trainer.last_progress))
      culprit = n;
  }
  return culprit;
}

std::optional<EventPayload> phase_reached(Phase phase, const Ranks& w, int32_t gen, Time now, Time run_at,
                                          int32_t world_size, Sweeps& sw) {
  const Sweep::Context context{sw.epoch, gen, static_cast<int64_t>(phase), 0};
  if (phase == Phase::Restart) {
    if (now >= run_at && sw.phase.all(w, context, [&](const Trainer& t) { return t.restart == gen && phase_rank(t.phase) >= 1; }))
      return ProcessesStarted{world_size, gen};
  } else if (phase == Phase::Rendezvous) {
    if (sw.phase.all(w, context, [&](const Trainer& t) { return t.restart == gen && phase_rank(t.phase) >= 2; }))
      return RendezvousComplete{world_size, gen};
  } else if (phase == Phase::CheckpointLoad) {
    if (sw.phase.all(w, context, [&](const Trainer& t) { return t.restart == gen && t.loaded; })) {
      CheckpointLoaded l = *w.front()->trainer.loaded;
      for (const Node* n : w) {
        l.step = std::min(l.step, n->trainer.loaded->step);
        l.tier = slower_tier(l.tier, n->trainer.loaded->tier);
        l.load_time = std::max(l.load_time, n->trainer.loaded->load_time);
      }
      return l;
    }
  }
  return std::nullopt;
}

std::optional<CheckpointSaved> saved(const Ranks& w, int32_t gen, int64_t logged_saves, int64_t logged_blocking,
                                     const CheckpointPlanSet& plan, Sweeps& sw) {
  if (!sw.saved.all(w, {sw.epoch, gen, logged_saves, 0},
                    [&](const Trainer& t) { return t.restart == gen && t.saves > logged_saves && t.saved_step >= 0; }))
    return std::nullopt;
  int64_t saves = INT64_MAX, step = INT64_MAX, blocking = 0;
  for (const Node* n : w) {
    const Trainer& t = n->trainer;
    saves = std::min(saves, t.restart == gen ? t.saves : 0);
    step = std::min(step, t.saved_step);
    blocking = std::max(blocking, t.save_blocking_ns);
  }
  if (saves <= logged_saves || step < 0) return std::nullopt;
  const int64_t count = saves - logged_saves;
  const int64_t per_save = std::max<int64_t>(blocking - logged_blocking, 0) / count;
  const bool persist = plan.tier == Tier::Memory && plan.persist_every > 0 && saves % plan.persist_every == 0;
  return CheckpointSaved{step, plan.tier == Tier::None ? Tier::Memory : plan.tier, per_save, persist, count};
}

}  // namespace goodput::live
