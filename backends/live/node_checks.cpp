#include "backends/live/node_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace goodput::live {

void NodeChecks::joined(const NodeJoined& p) {
  ++changes_;
  State& st = nodes_[p.node];
  st.wanted = spec_.enabled;
  if (slots_seen_.insert(p.slot).second)
    if (const auto f = spec_.faults.find(p.slot); f != spec_.faults.end()) st.fault = f->second;
}

void NodeChecks::fold(const NodeChecked& p) {
  ++changes_;
  ++verdict_counts_[p.verdict];
  State& st = nodes_[p.node];
  st.mflops = p.compute_mflops;
  if (p.link_ok && p.peer >= 0) st.link = p.link_mb_per_s;
  if (p.verdict != "suspect") {
    st.verdict = p.verdict;
    st.detail = p.detail;
  }
}

void NodeChecks::fold(const CheckRequested& p) {
  ++changes_;
  if (p.waiting) {  // starts after the next checkpoint
    waiting_ = p;
    return;
  }
  waiting_.reset();
  // Checked again from scratch: its verdict and what was acted on (its last measured link stays:
  // it only ranks nodes that passed as partners, and this one is not one now).
  requested_ = true;
  for (NodeId id : p.nodes) {
    State& st = nodes_[id];
    st.wanted = true;
    st.verdict.clear();
    st.detail.clear();
    st.acted = false;
    st.slowdown = 0;
    st.round = 0;
    st.fault = p.fault;
  }
}

bool NodeChecks::active(const World& world, NodeId id) const {
  const Node* n = world.node(id);
  return n && !n->gone;  // holding a slot, or a spare
}

bool NodeChecks::pending(const World& world) const {
  if (!on()) return false;
  if (pending_ && pending_->epoch == world.epoch() && pending_->changes == changes_) return pending_->pending;
  bool any = false;
  for (int32_t s = 0; s < world.size() && !any; ++s)
    if (const Node* n = world.holder(s); n && !n->gone)
      if (const auto it = nodes_.find(n->id); it != nodes_.end() && it->second.wanted && it->second.verdict.empty())
        any = true;
  pending_ = PendingMemo{world.epoch(), changes_, any};
  return any;
}

nlohmann::json NodeChecks::order(const Node& n, const World& world) const {
  const auto it = nodes_.find(n.id);
  if (it == nodes_.end() || it->second.round == 0 || !it->second.verdict.empty()) return nullptr;
  const State& st = it->second;
  nlohmann::json c{{"round", st.round},
                   {"id", st.id},
                   {"compute_ms", spec_.compute / kMillisecond},
                   {"link_bytes", spec_.link_bytes},
                   {"timeout_ms", (spec_.round_timeout - spec_.compute) / 2 / kMillisecond}};
  if (const Node* p = world.node(st.peer); p && p->check_port > 0) {
    c["peer"] = p->id;
    c["peer_host"] = p->host.empty() ? std::string("127.0.0.1") : p->host;
    c["peer_port"] = p->check_port;
  }
  if (!st.fault.empty()) c["fault"] = st.fault;
  if (!spec_.collective.empty()) c["collective"] = true;
  return c;
}

std::string NodeChecks::state_of(NodeId node) const {
  const auto it = nodes_.find(node);
  if (it == nodes_.end()) return "";
  if (!it->second.verdict.empty()) return it->second.verdict;
  return it->second.round > 0 ? "round " + std::to_string(it->second.round) : "";
}

void NodeChecks::report(NodeId node, int64_t id, CheckReport report) {
  const auto it = nodes_.find(node);
  if (it != nodes_.end() && it->second.round > 0 && id == it->second.id) it->second.report = std::move(report);
}

bool NodeChecks::round_over(const World& world, Time now) const {
  const bool waiting = std::any_of(members_.begin(), members_.end(), [&](NodeId id) {
    const auto it = nodes_.find(id);
    return active(world, id) && it->second.verdict.empty() && !it->second.report;
  });
  return !waiting || now >= deadline_;
}

void NodeChecks::start_round(int32_t round, std::vector<NodeId> members, const std::vector<NodeId>& peers, Time now) {
  // Ids from the clock: a resumed master never reuses one, so no agent answers with a result it
  // measured for the old master's round (perhaps against another partner).
  last_id_ = std::max(now, last_id_ + 1);
  for (size_t i = 0; i < members.size(); ++i) {
    State& st = nodes_[members[i]];
    st.round = round;
    st.id = last_id_;
    st.peer = peers[i];
    st.report.reset();
  }
  round_ = round;
  members_ = std::move(members);
  deadline_ = now + spec_.round_timeout;
}

std::vector<NodeId> NodeChecks::by_link(std::vector<NodeId> ids) {
  std::stable_sort(ids.begin(), ids.end(), [&](NodeId a, NodeId b) { return nodes_[a].link > nodes_[b].link; });
  return ids;
}

bool NodeChecks::start_first_round(World& world, Time now) {
  const std::vector<Node*> w = world.ranks();
  if (w.empty()) return false;  // pairs are made across the whole world: wait for it
  std::vector<NodeId> fresh, checked;
  for (const Node* n : w) {
    const State& st = nodes_[n->id];
    if (st.wanted && st.verdict.empty()) fresh.push_back(n->id);
    else if (st.verdict != "faulty") checked.push_back(n->id);  // a partner: one that passed (or was not checked)
  }
  // Spares are checked as they join, while the world trains: a lost node's slot then takes one
  // that is known good, without a check round of its own.
  for (const auto& [id, n] : world.nodes())
    if (!n.gone && n.slot < 0)
      if (const auto it = nodes_.find(id); it != nodes_.end() && it->second.wanted && it->second.verdict.empty())
        fresh.push_back(id);
  if (fresh.empty()) return false;
  checked = by_link(std::move(checked));
  std::vector<NodeId> peers(fresh.size(), -1);
  for (size_t i = 0; i + 1 < fresh.size(); i += 2) {
    peers[i] = fresh[i + 1];
    peers[i + 1] = fresh[i];
  }
  if (fresh.size() % 2 == 1) peers.back() = !checked.empty() ? checked.front() : fresh.size() > 1 ? fresh.front() : -1;
  start_round(1, fresh, peers, now);
  return true;
}

std::vector<NodeChecked> NodeChecks::judge(const World& world) {
  const int32_t round = round_;
  round_ = 0;
  std::vector<NodeChecked> results;
  for (NodeId id : members_) {
    const State& st = nodes_[id];
    if (!active(world, id) || !st.verdict.empty()) continue;  // left meanwhile
    NodeChecked c{id, round, st.peer, 0, false, 0, false, "faulty", ""};
    if (!st.report) {
      c.detail = "no check result within " + format_duration(spec_.round_timeout);
    } else {
      const CheckReport& r = *st.report;
      c.compute_mflops = r.mflops;
      c.compute_ok = r.compute_ok;
      c.link_mb_per_s = r.link;
      c.link_ok = c.peer < 0 || r.link_ok.value_or(false);
      if (!c.compute_ok) {
        c.detail = "compute probe: " + (r.error.empty() ? std::string("no result") : r.error);
      } else if (!c.link_ok) {
        c.verdict = round == 1 ? "suspect" : "faulty";
        c.detail = (round == 1 ? "" : "link failed with two partners; ") + (r.error.empty() ? "no link result" : r.error);
      } else {
        c.verdict = "passed";
      }
    }
    results.push_back(c);
  }
  // Stragglers among those that passed: compute (and link) against the median of the world's
  // checked nodes and this round's, the upper median (two nodes: the slower is compared with the faster).
  std::vector<int64_t> mflops, links;
  for (const auto& [id, n] : world.nodes()) {
    const auto it = nodes_.find(id);
    if (it == nodes_.end() || n.gone || n.slot < 0) continue;
    if (it->second.verdict == "passed" || it->second.verdict == "straggler") {
      mflops.push_back(it->second.mflops);
      if (it->second.link > 0) links.push_back(it->second.link);
    }
  }
  for (const NodeChecked& c : results) {
    if (c.compute_ok && c.compute_mflops > 0) mflops.push_back(c.compute_mflops);  // suspects' arithmetic counts
    if (c.verdict == "passed" && c.peer >= 0) links.push_back(c.link_mb_per_s);
  }
  auto upper_median = [](std::vector<int64_t> v) -> int64_t {
    if (v.empty()) return 0;
    std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const int64_t med_c = upper_median(mflops), med_l = upper_median(links);
  for (NodeChecked& c : results) {
    if (c.verdict != "passed") continue;
    const double rc = c.compute_mflops > 0 ? static_cast<double>(med_c) / static_cast<double>(c.compute_mflops) : 0;
    const double rl = c.peer >= 0 && c.link_mb_per_s > 0 ? static_cast<double>(med_l) / static_cast<double>(c.link_mb_per_s) : 0;
    const double ratio = std::max(rc, rl);
    if (ratio < spec_.straggler_factor) continue;
    char text[160];
    if (rc >= rl)
      std::snprintf(text, sizeof text, "compute %lld MFLOP/s, 1/%.2f of the median %lld", static_cast<long long>(c.compute_mflops),
                    rc, static_cast<long long>(med_c));
    else
      std::snprintf(text, sizeof text, "link %lld MB/s, 1/%.2f of the median %lld", static_cast<long long>(c.link_mb_per_s), rl,
                    static_cast<long long>(med_l));
    c.verdict = "straggler";
    c.detail = text;
    nodes_[c.node].slowdown = static_cast<int32_t>(std::lround(std::min(ratio, 1000.0) * 1000));
  }
  suspects_.clear();
  for (const NodeChecked& c : results)
    if (c.verdict == "suspect") suspects_.push_back(c.node);
  return results;
}

bool NodeChecks::start_second_round(const World& world, Time now) {
  std::vector<NodeId> suspects = std::exchange(suspects_, {});
  std::erase_if(suspects, [&](NodeId id) { return !active(world, id); });
  if (suspects.empty()) return false;
  // Each suspect (slowest link first) with a node that passed (fastest first); with none that
  // passed, the suspects with each other, partners shifted by one. What round 1 found waits for
  // round 2: the nodes it condemns may be the partners round 2 needs.
  std::vector<NodeId> passed;
  for (const auto& [id, n] : world.nodes()) {
    const auto it = nodes_.find(id);
    if (it != nodes_.end() && !n.gone && n.slot >= 0 && n.slot < world.size() &&
        (it->second.verdict == "passed" || it->second.verdict == "straggler"))
      passed.push_back(id);
  }
  passed = by_link(std::move(passed));
  std::vector<NodeId> peers(suspects.size());
  for (size_t i = 0; i < suspects.size(); ++i)
    peers[i] = !passed.empty()         ? passed[i % passed.size()]
               : suspects.size() > 1 ? suspects[(i + 1) % suspects.size()]
                                     : nodes_[suspects[i]].peer;
  start_round(2, suspects, peers, now);
  return true;
}

std::vector<NodeId> NodeChecks::failed_spares(const World& world) {
  std::vector<NodeId> out;
  for (auto& [id, st] : nodes_)
    if (const Node* n = world.node(id); n && n->slot < 0 && st.verdict == "faulty" && !st.acted) {
      st.acted = true;
      out.push_back(id);
    }
  return out;
}

std::optional<NodeChecks::Verdict> NodeChecks::next_to_act(const World& world) {
  for (int32_t s = 0; s < world.size(); ++s) {
    const Node* n = world.holder(s);
    if (!n || n->gone) continue;
    const auto it = nodes_.find(n->id);
    if (it == nodes_.end() || it->second.acted || it->second.verdict.empty()) continue;
    it->second.acted = true;
    return Verdict{n->id, it->second.verdict, it->second.detail, it->second.slowdown};
  }
  return std::nullopt;
}

}  // namespace goodput::live
