#include "backends/live/world.h"

#include <algorithm>
#include <tuple>

#include "engine/invariant.h"

namespace goodput::live {

World::World(std::vector<ReplicaGroup> groups, int32_t slots)
    : groups_(std::move(groups)),
      slots_(static_cast<size_t>(slots), -1),
      slot_memory_(static_cast<size_t>(slots), 1000),
      size_(slots) {
  for (int32_t s = 0; s < slots; ++s) vacant_.insert(s);
}

void World::hold(int32_t slot, NodeId id) {
  GOODPUT_INVARIANT(slot >= 0 && slot < slot_count(), "slot " + std::to_string(slot) + " of " + std::to_string(slot_count()));
  GOODPUT_INVARIANT(id < 0 || nodes_.contains(id), "node " + std::to_string(id) + " is not in the table");
  slots_[static_cast<size_t>(slot)] = id;
  if (id < 0) vacant_.insert(slot);
  else vacant_.erase(slot);
  if (slot < size_) ++epoch_;
}

void World::slots_changed() {
  vacant_.clear();
  for (int32_t s = 0; s < slot_count(); ++s)
    if (slots_[static_cast<size_t>(s)] < 0) vacant_.insert(s);
  ++epoch_;
}

std::string TrainerReport::quietest_process() const {
  if (processes <= 1 || !ranks.is_array()) return "";
  const nlohmann::json* pick = nullptr;
  auto rank_of = [](const nlohmann::json& p) {
    return std::make_pair(p.value("stopped", false), p.value("progress_age_ms", int64_t{0}));
  };
  for (const nlohmann::json& p : ranks)
    if (!pick || rank_of(p) > rank_of(*pick)) pick = &p;
  if (!pick) return "";
  return "local rank " + std::to_string(pick->value("local_rank", -1)) + " (rank " + std::to_string(pick->value("rank", -1)) + ")";
}

bool Trainer::apply(const TrainerReport& t, Time now) {
  using Agreed = std::tuple<int32_t, std::string, bool, bool, int64_t, int64_t, int64_t, std::vector<int64_t>, bool>;
  auto agreed = [](const Trainer& x) {
    return Agreed{x.restart, x.phase,           x.done,       x.exited, x.saves, x.save_blocking_ns,
                  x.saved_step, x.storage_steps, x.loaded.has_value()};
  };
  const Agreed was = agreed(*this);
  if (t.restart != restart) *this = Trainer{};
  std::optional<CheckpointLoaded> was_loaded = std::move(loaded);
  static_cast<TrainerReport&>(*this) = t;
  if (!loaded) loaded = std::move(was_loaded);  // said once per restart
  last_progress = now - t.progress_age_ms * kMillisecond;
  if (t.exit) {
    if (!exited) exited_at = now - t.exit->age_ms * kMillisecond;
    exited = true;
    done = done || t.exit->done;
    exit_code = t.exit->code;
    exit_signal = t.exit->signal;
    exit_reason = t.exit->reason;
    phase = "exited";
  }
  return agreed(*this) != was;
}

Node& World::join(const NodeJoined& p) {
  Node& n = nodes_[p.node];
  n.id = p.node;
  n.name = p.name;
  n.slot = p.slot;
  n.kind = p.replica_type;
  if (std::vector<NodeId>& ids = by_name_[p.name]; std::find(ids.begin(), ids.end(), p.node) == ids.end()) {
    ids.push_back(p.node);
    std::sort(ids.begin(), ids.end());
  }
  if (p.slot >= 0 && static_cast<size_t>(p.slot) < slots_.size()) {
    // One node per slot: a node joins only a slot that is vacant (or already its own).
    GOODPUT_INVARIANT(slots_[static_cast<size_t>(p.slot)] < 0 || slots_[static_cast<size_t>(p.slot)] == p.node,
                      "node " + std::to_string(p.node) + " joins slot " + std::to_string(p.slot) + ", held by node " +
                          std::to_string(slots_[static_cast<size_t>(p.slot)]));
    hold(p.slot, p.node);
  }
  waiting_slots_.erase(p.slot);
  next_node_ = std::max(next_node_, p.node + 1);
  return n;
}

void World::relaunch(const RecoveryDecided& p) {
  Node& n = nodes_[p.node];
  n.gone = true;
  if (n.slot >= 0 && static_cast<size_t>(n.slot) < slots_.size()) {
    if (p.action == RecoveryAction::RelaunchWithMoreMemory)
      slot_memory_[n.slot] = static_cast<int32_t>(int64_t{slot_memory_[n.slot]} * p.memory_permille / 1000);
    hold(n.slot, -1);
  }
  n.former_slot = n.slot;
  n.slot = -1;
  place_spares();  // a warm spare takes the slot now; the node launched for it joins as a spare
}

void World::restarted(const RestartJob& p) {
  // Its saves (steps above the one it restores) are laid out as its world is.
  const nlohmann::json layout = replica_counts(groups_, p.world_size);
  if (layout != layout_of(p.restore_step + 1)) {
    layouts_.erase(layouts_.lower_bound(p.restore_step), layouts_.end());
    layouts_[p.restore_step] = layout;
  }
}

void World::scale(const ScaleDecided& p) {
  if (!p.group.empty()) {
    relayout(p);
    return;
  }
  size_ = std::clamp(p.to, 0, slot_count());
  for (int32_t s = size_; s < slot_count(); ++s)
    if (slots_[s] >= 0) {
      nodes_[slots_[s]].slot = -1;  // back to the spares
      slots_[s] = -1;
    }
  slots_changed();
  place_spares();
}

void World::relayout(const ScaleDecided& d) {
  std::vector<ReplicaGroup> groups = groups_;
  const auto g = std::find_if(groups.begin(), groups.end(), [&](const ReplicaGroup& x) { return x.type == d.group; });
  if (g == groups.end()) return;  // a log from a job with other groups: nothing to move
  const int32_t before = g->count;
  g->count = static_cast<int32_t>(std::clamp<int64_t>(int64_t{g->count} + d.to - d.from, 0, 1 << 20));
  if (g->count > before) grown_.try_emplace(g->type, before);  // the count the growth may go back to
  else if (const auto it = grown_.find(g->type); it != grown_.end() && g->count <= it->second) grown_.erase(it);
  int32_t first = 0;
  for (ReplicaGroup& x : groups) {
    x.first_slot = first;
    first += x.count;
  }
  std::vector<NodeId> slots(static_cast<size_t>(first), -1);
  std::vector<int32_t> memory(static_cast<size_t>(first), 1000);
  std::set<int32_t> waiting;
  for (int32_t s = 0; s < slot_count(); ++s) {
    const ReplicaGroup& old = replica_group(groups_, s);
    const ReplicaGroup& now = *std::find_if(groups.begin(), groups.end(), [&](const ReplicaGroup& x) { return x.type == old.type; });
    const int32_t index = s - old.first_slot;
    if (index >= now.count) continue;  // released (below) or a vacant slot that is no more
    const int32_t moved = now.first_slot + index;
    slots[moved] = slots_[s];
    memory[moved] = slot_memory_[s];
    if (slots_[s] >= 0) nodes_[slots_[s]].slot = moved;
    if (waiting_slots_.contains(s)) waiting.insert(moved);
  }
  for (NodeId id : d.released)
    if (Node* n = node(id)) {
      n->gone = true;  // out of the job: its agent is told to exit, its machine is let go
      n->former_slot = -1;
      n->slot = -1;
    }
  groups_ = std::move(groups);
  relaid_ = true;
  slots_ = std::move(slots);
  slot_memory_ = std::move(memory);
  waiting_slots_ = std::move(waiting);
  size_ = std::clamp(d.to, 0, slot_count());
  slots_changed();
  place_spares();
}

void World::place_spares() {
  const std::vector<int32_t> vacant(vacant_.begin(), vacant_.lower_bound(size_));
  for (int32_t s : vacant)
    for (auto& [id, n] : nodes_)
      if (!n.gone && n.slot < 0 && fits(n, s)) {
        n.slot = s;
        hold(s, id);
        break;
      }
}

Node* World::node(NodeId id) {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

const Node* World::node(NodeId id) const {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

const Node* World::named(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() || it->second.empty() ? nullptr : node(it->second.front());
}

Node* World::live_named(const std::string& name) {
  const auto it = by_name_.find(name);
  if (it == by_name_.end()) return nullptr;
  for (NodeId id : it->second)
    if (Node* n = node(id); n && !n->gone) return n;
  return nullptr;
}

const Node* World::holder(int32_t slot) const {
  if (slot < 0 || slot >= slot_count() || slots_[slot] < 0) return nullptr;
  return node(slots_[slot]);
}

const std::vector<Node*>& World::ranks() {
  if (ranks_epoch_ != epoch_) {
    ranks_epoch_ = epoch_;
    ranks_.clear();
    if (ranks_held())
      for (int32_t s = 0; s < size_; ++s) ranks_.push_back(&nodes_[slots_[s]]);
  }
  return ranks_;
}

bool World::ranks_held() const { return vacant_.empty() || *vacant_.begin() >= size_; }

bool World::every_slot_held() const { return vacant_.empty(); }

std::optional<int32_t> World::first_vacant() const {
  if (vacant_.empty()) return std::nullopt;
  return *vacant_.begin();
}

std::optional<int32_t> World::slot_for(const Node& n, int64_t wanted) const {
  if (wanted >= 0 && wanted < size_ && slots_[static_cast<size_t>(wanted)] < 0) return static_cast<int32_t>(wanted);
  for (auto it = vacant_.begin(); it != vacant_.end() && *it < size_; ++it)
    if (fits(n, *it)) return *it;
  return std::nullopt;
}

int64_t World::newest_step() const {
  int64_t step = 0;
  for (const auto& [id, n] : nodes_)
    if (!n.gone) step = std::max(step, n.trainer.step);
  return step;
}

bool World::fits(const Node& n, int32_t slot) const { return n.kind.empty() || group_of(slot).type == n.kind; }

nlohmann::json World::layout_of(int64_t step) const {
  auto it = layouts_.lower_bound(step);  // the newest restart that restored a step below `step`
  if (it == layouts_.begin()) return nullptr;
  return std::prev(it)->second;
}

std::optional<int32_t> World::grown_from(const std::string& type) const {
  const auto it = grown_.find(type);
  if (it == grown_.end()) return std::nullopt;
  return it->second;
}

}  // namespace goodput::live
