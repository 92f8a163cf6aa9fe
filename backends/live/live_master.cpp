#include "backends/live/live_master.h"

#include <algorithm>
#include <ctime>
#include <iostream>
#include <sstream>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "engine/event_json.h"
#include "report/html.h"
#include "report/report.h"
#include "report/timeline.h"

namespace goodput::live {

using nlohmann::json;

// ---- clock -----------------------------------------------------------------------------------------

namespace {
int64_t clock_ns(clockid_t id) {
  timespec ts{};
  ::clock_gettime(id, &ts);
  return static_cast<int64_t>(ts.tv_sec) * kSecond + ts.tv_nsec;
}
}  // namespace

int64_t LiveClock::unix_now_ns() { return clock_ns(CLOCK_REALTIME); }

LiveClock::LiveClock(int64_t epoch_unix_ns, Time not_before)
    : base_(std::max(unix_now_ns() - epoch_unix_ns, not_before)), mono_start_(clock_ns(CLOCK_MONOTONIC)) {}

Time LiveClock::now() const { return base_ + (clock_ns(CLOCK_MONOTONIC) - mono_start_); }

// ---- helpers ---------------------------------------------------------------------------------------

namespace {

// The address other ranks reach a node at: what its agent says, else where its request came from
// (a pod's or a Ray node's own IP; 127.0.0.1 for local nodes).
std::string host_of(const json& body, const std::string& peer_address) {
  const auto it = body.find("host");
  if (it != body.end() && it->is_string() && !it->get<std::string>().empty()) return it->get<std::string>();
  return peer_address.empty() ? "127.0.0.1" : peer_address;
}

// Nodes lost before they joined, in a row, before the job is failed: a node that cannot start
// (a bad image or binary, an impossible resource request) must not be relaunched forever.
constexpr int32_t kMaxLaunchesLost = 5;

// Text from agents and request paths may hold any bytes: invalid UTF-8 is replaced, never thrown.
HttpResponse reply(int status, const json& body) {
  return {status, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace)};
}
HttpResponse error(int status, const std::string& what) { return reply(status, json{{"error", what}}); }

bool same_token(const std::string& a, const std::string& b) {  // constant time in the secret's length
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Typed access to agent JSON: a missing or mistyped field is the agent's bug, answered with 400.
struct BadRequest : std::runtime_error {
  using std::runtime_error::runtime_error;
};
template <class T> T field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) throw BadRequest(std::string("field '") + key + "' is missing");
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw BadRequest(std::string("field '") + key + "' has the wrong type");
  }
}
template <class T> T field_or(const json& j, const char* key, T fallback) {
  return j.contains(key) && !j[key].is_null() ? field<T>(j, key) : fallback;
}
// A body (or the object at `where` in it) may hold these keys and no others: a key the master does
// not know is a mistake (`{"name": 5}` for `{"slots": [5]}`) or an agent of another version, and is
// refused rather than ignored.
void only_keys(const json& j, std::initializer_list<std::string_view> keys, const std::string& where = "") {
  for (const auto& [k, _] : j.items())
    if (std::find(keys.begin(), keys.end(), k) == keys.end())
      throw BadRequest("unknown field '" + where + k.substr(0, 100) + "'");
}

int phase_rank(const std::string& p) {
  if (p == "starting") return 1;
  if (p == "rendezvous") return 2;
  if (p == "loaded") return 3;
  if (p == "training") return 4;
  return 0;  // none, exited
}

}  // namespace

// ---- construction and the log ---------------------------------------------------------------------

LiveMaster::LiveMaster(JobSpec spec, PolicySet policies, SqliteStore& store, const Clock& clock,
                       NodeProvider* provider, std::string token, std::string run_id)
    : spec_(std::move(spec)),
      clock_(clock),
      provider_(provider),
      token_(std::move(token)),
      run_id_(std::move(run_id)),
      store_(store),
      master_(std::move(policies), clock, *this, {&store, this}, JobMaster::Options{.flush_before_acting = true}) {
  if (spec_.replicas.empty()) spec_.replicas = spec_.workers_only();  // a spec built in code, not parsed
  ledger_.reset(spec_.data_shards);
  slots_.assign(static_cast<size_t>(spec_.nodes), -1);
  slot_memory_.assign(static_cast<size_t>(spec_.nodes), 1000);
  world_ = spec_.nodes;
  if (store.last_seq() > 0) {
    resumed_ = true;
    folding_ = true;
    store.for_each([&](const Event& e) { append(e); });
    folding_ = false;
    master_.resume_from(store);
    if (provider_) provider_->set_layout(spec_.replicas);  // as scaled in the log
    // Every node we knew gets a full heartbeat timeout to find the new master.
    for (auto& [id, n] : nodes_) n.last_heartbeat = clock_.now();
  } else {
    master_.observe(spec_.job_started());
    if (provider_)
      for (int32_t i = 0; i < spec_.nodes; ++i) provider_->launch(i, 1000);
  }
}

void LiveMaster::append(const Event& e) {
  ledger_.apply(e);
  std::visit(
      [&](const auto& p) {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, NodeJoined>) {
          Node& n = nodes_[p.node];
          n.id = p.node;
          n.name = p.name;
          n.slot = p.slot;
          n.kind = p.replica_type;
          n.check_wanted = spec_.node_check.enabled;
          if (p.slot >= 0 && static_cast<size_t>(p.slot) < slots_.size()) slots_[p.slot] = p.node;
          waiting_slots_.erase(p.slot);
          launches_lost_ = grow_back_lost_ = 0;
          if (slots_seen_.insert(p.slot).second)
            if (const auto f = spec_.node_check.faults.find(p.slot); f != spec_.node_check.faults.end())
              n.check_fault = f->second;
          next_node_ = std::max(next_node_, p.node + 1);
        } else if constexpr (std::is_same_v<T, ShardsAssigned>) {
          last_assigned_[p.node] = p;
        } else if constexpr (std::is_same_v<T, SlowdownObserved>) {
          straggler_permille_[p.node] = p.slowdown_permille;
        } else if constexpr (std::is_same_v<T, NodeChecked>) {
          ++check_verdicts_[p.verdict];
          Node& n = nodes_[p.node];
          n.check_mflops = p.compute_mflops;
          if (p.link_ok && p.peer >= 0) n.check_link = p.link_mb_per_s;
          if (p.verdict != "suspect") {
            n.check_verdict = p.verdict;
            n.check_detail = p.detail;
          }
        } else if constexpr (std::is_same_v<T, CheckRequested>) {
          if (p.waiting) {  // starts after the next checkpoint (start_waiting_check)
            waiting_check_ = p;
            return;
          }
          waiting_check_.reset();
          // Checked again from scratch: its verdict and what was acted on (its last measured link
          // stays: it only ranks nodes that passed as partners, and this one is not one now).
          checks_requested_ = true;
          for (NodeId id : p.nodes) {
            Node& n = nodes_[id];
            n.check_wanted = true;
            n.check_verdict.clear();
            n.check_detail.clear();
            n.check_acted = false;
            n.check_slowdown = 0;
            n.check_round = 0;
            n.check_fault = p.fault;
          }
        } else if constexpr (std::is_same_v<T, StallObserved>) {
          if (p.resumed) stall_.reset();
          else stall_ = p;
          pause_.reset();
        } else if constexpr (std::is_same_v<T, FailureObserved>) {
          last_failure_ = p;
        } else if constexpr (std::is_same_v<T, RecoveryDecided>) {
          if (!folding_) notes_.push_back(recovery_note(p));
          if (p.action == RecoveryAction::RelaunchNode || p.action == RecoveryAction::RelaunchWithMoreMemory) {
            Node& n = nodes_[p.node];
            n.gone = true;
            if (n.slot >= 0 && static_cast<size_t>(n.slot) < slots_.size()) {
              if (p.action == RecoveryAction::RelaunchWithMoreMemory)
                slot_memory_[n.slot] = static_cast<int32_t>(int64_t{slot_memory_[n.slot]} * p.memory_permille / 1000);
              slots_[n.slot] = -1;
            }
            n.former_slot = n.slot;
            n.slot = -1;
          }
        } else if constexpr (std::is_same_v<T, RestartJob>) {
          restart_ = p;
          // Its saves (steps above the one it restores) are laid out as its world is.
          const json layout = replica_counts(spec_.replicas, p.world_size);
          if (layout != layout_of(p.restore_step + 1)) {
            layouts_.erase(layouts_.lower_bound(p.restore_step), layouts_.end());
            layouts_[p.restore_step] = layout;
          }
          run_at_ = e.time + p.delay;
          rdzv_port_ = 0;  // execute() picks a free one
          stall_.reset();
          pause_.reset();
          last_assigned_.clear();
          gen_saves_ = gen_blocking_ns_ = 0;
        } else if constexpr (std::is_same_v<T, CheckpointSaved>) {
          gen_saves_ += std::max<int64_t>(p.count, 1);
          saved_step_ = std::max(saved_step_, p.step);
          gen_blocking_ns_ += p.blocking * std::max<int64_t>(p.count, 1);
        } else if constexpr (std::is_same_v<T, CheckpointPersisted>) {
          persisted_step_ = std::max(persisted_step_, p.step);
        } else if constexpr (std::is_same_v<T, CheckpointPlanSet>) {
          plan_ = p;
        } else if constexpr (std::is_same_v<T, ScaleDecided>) {
          if (!p.group.empty()) {
            relayout(p);
            return;
          }
          world_ = std::clamp(p.to, 0, spec_.nodes);
          for (int32_t s = world_; s < spec_.nodes; ++s)
            if (slots_[s] >= 0) {
              nodes_[slots_[s]].slot = -1;  // back to the spares
              slots_[s] = -1;
            }
          place_spares();
        }
      },
      e.payload);
}

std::string LiveMaster::recovery_note(const RecoveryDecided& d) const {
  const auto it = nodes_.find(d.node);
  std::string o = "goodput: node " + (it != nodes_.end() ? it->second.name : std::to_string(d.node));
  if (it != nodes_.end() && it->second.slot >= 0) o += " (slot " + std::to_string(it->second.slot) + ")";
  o += ": " + std::string(to_string(d.diagnosis));
  if (last_failure_ && last_failure_->node == d.node) {
    const FailureObserved& f = *last_failure_;
    o += " (" + std::string(to_string(f.kind));
    if (f.kind == FailureKind::ProcessExit) o += ", exit code " + std::to_string(f.exit_code);
    if (f.signal) o += ", signal " + std::to_string(f.signal);
    if (!f.reason.empty()) o += ": " + f.reason.substr(0, 200);
    o += ")";
  }
  o += " -> " + std::string(to_string(d.action)) + " [" + d.rule + "]";
  if (d.backoff > 0) o += " after " + format_duration(d.backoff);
  return o;
}

void LiveMaster::relayout(const ScaleDecided& d) {
  // Part of the fold: a resumed master lays the slots out the same way.
  std::vector<ReplicaGroup> groups = spec_.replicas;
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
  for (int32_t s = 0; s < spec_.nodes; ++s) {
    const ReplicaGroup& old = replica_group(spec_.replicas, s);
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
  spec_.replicas = std::move(groups);
  spec_.nodes = first;
  relaid_ = true;
  slots_ = std::move(slots);
  slot_memory_ = std::move(memory);
  waiting_slots_ = std::move(waiting);
  world_ = std::clamp(d.to, 0, spec_.nodes);
  place_spares();
}

bool LiveMaster::undo_growth(int32_t slot, const std::string& why) {
  const ReplicaGroup& g = replica_group(spec_.replicas, slot);
  const auto it = grown_.find(g.type);
  if (it == grown_.end() || slot - g.first_slot < it->second) return false;  // not a slot the growth added
  ScaleRequested r{g.type, g.count, it->second, {},
                   "no machine came for the " + g.type + " group's new slot " + std::to_string(slot) + " in " +
                       std::to_string(kMaxLaunchesLost + 1) + " tries (" + why + "): back to " +
                       std::to_string(it->second)};
  for (int32_t i = g.count - 1; i >= it->second; --i)  // the new slots' nodes that did come go too
    if (const NodeId id = slots_[g.first_slot + i]; id >= 0) r.release.push_back(id);
  launches_lost_ = 0;
  observe(std::move(r));
  return true;
}

json LiveMaster::layout_of(int64_t step) const {
  auto it = layouts_.lower_bound(step);  // the newest restart that restored a step below `step`
  if (it == layouts_.begin()) return nullptr;
  return std::prev(it)->second;
}

bool LiveMaster::fits(const Node& n, int32_t slot) const {
  return n.kind.empty() || replica_group(spec_.replicas, slot).type == n.kind;
}

void LiveMaster::place_spares() {
  // Part of the fold (it follows from the log alone), so a resumed master places them the same way.
  for (int32_t s = 0; s < world_; ++s) {
    if (slots_[s] >= 0) continue;
    for (auto& [id, n] : nodes_)
      if (!n.gone && n.slot < 0 && fits(n, s)) {
        n.slot = s;
        slots_[s] = id;
        break;
      }
  }
}

void LiveMaster::execute(const Event& d) {
  if (std::holds_alternative<RestartJob>(d.payload)) {
    rdzv_port_ = pick_port();
    if (provider_)
      for (int32_t s = 0; s < world_; ++s)
        if (slots_[s] >= 0) provider_->ranked(nodes_[slots_[s]].name, s);
  }
  if (const auto* sc = std::get_if<ScaleDecided>(&d.payload); sc && !sc->group.empty() && provider_) {
    // append() already laid the slots out anew: let the released machines go, fill the new slots.
    provider_->set_layout(spec_.replicas);
    for (NodeId id : sc->released)
      if (const Node* n = node(id)) provider_->terminate(n->name);
    for (int32_t s = 0; s < world_; ++s)
      if (slots_[s] < 0) provider_->launch(s, slot_memory_[s]);
    return;
  }
  if (const auto* r = std::get_if<RecoveryDecided>(&d.payload)) {
    if (r->action != RecoveryAction::RelaunchNode && r->action != RecoveryAction::RelaunchWithMoreMemory) return;
    const Node& n = nodes_[r->node];
    if (provider_) {
      if (r->diagnosis == Diagnosis::HardwareError) provider_->exclude(n.name);  // elsewhere, not there again
      provider_->terminate(n.name);
      // The slot it held (append already vacated it) gets a fresh machine, with that slot's memory.
      provider_->launch(n.former_slot, n.former_slot >= 0 ? slot_memory_[n.former_slot] : 1000);
    }
  }
}

void LiveMaster::observe(EventPayload p) {
  if (master_.state().finished()) return;
  if (std::holds_alternative<JobFinished>(p)) log_refusals(true);  // the log's last word on them
  master_.observe(std::move(p));
}

void LiveMaster::log_refusals(bool now) {
  const int64_t pending = unauthorized_ - unauthorized_logged_;
  if (pending <= 0 || finished()) return;
  if (!now && refusals_logged_at_ && clock_.now() - *refusals_logged_at_ < kMinute) return;
  unauthorized_logged_ = unauthorized_;
  refusals_logged_at_ = clock_.now();
  master_.observe(ApiRefused{refused_peer_, pending, "missing or wrong bearer token"});
}

LiveMaster::Node* LiveMaster::node(NodeId id) {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

std::vector<LiveMaster::Node*> LiveMaster::world() {
  std::vector<Node*> out;
  for (int32_t s = 0; s < world_; ++s) {
    if (slots_[s] < 0) return {};
    out.push_back(&nodes_[slots_[s]]);
  }
  return out;
}

uint16_t LiveMaster::pick_port() const {
  // The port torch.distributed's store listens on, on rank 0's machine: the one rank 0's agent
  // found free there (it offers a new one after each use). An agent that offers none (an older
  // one) gets a port free on the master's machine, right where every rank runs here.
  if (world_ > 0 && slots_[0] >= 0)
    if (const auto it = nodes_.find(slots_[0]); it != nodes_.end() && it->second.rdzv_port > 0) return it->second.rdzv_port;
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::tcp::v4(), 0});
  return a.local_endpoint().port();
}

// ---- HTTP ------------------------------------------------------------------------------------------

void LiveMaster::set_read_access(ReadAccess access, const std::string& listen_address) {
  boost::system::error_code ec;
  const auto addr = boost::asio::ip::make_address(listen_address, ec);
  const bool loopback = !ec && addr.is_loopback();
  status_needs_token_ = access == ReadAccess::Token || (access == ReadAccess::Auto && !loopback);
  metrics_need_token_ = access == ReadAccess::Token;
}

HttpResponse LiveMaster::handle(const HttpRequest& req) {
  const std::string path = req.target.substr(0, req.target.find('?'));
  const bool authorized = same_token(req.authorization, "Bearer " + token_);
  auto refuse_token = [&] {
    ++unauthorized_;  // in /metrics, and in the log at most once a minute: a flood must not grow it
    refused_peer_ = req.peer_address.substr(0, 100);
    log_refusals(false);
    return error(401, "missing or wrong bearer token");
  };
  if (req.method == "GET" && path == "/healthz") return {200, "text/plain", "ok\n"};  // says nothing of the job
  if (req.method == "GET" && (path == "/status" || path == "/metrics" || path == "/")) {
    if (!authorized && (path == "/metrics" ? metrics_need_token_ : status_needs_token_)) return refuse_token();
    if (path == "/status") return reply(200, status());
    if (path == "/metrics") return {200, "text/plain; version=0.0.4", metrics()};
    return {200, "text/html; charset=utf-8", page()};
  }
  if (path.rfind("/v1/", 0) != 0) return error(404, "no such endpoint: " + path);
  if (!authorized) return refuse_token();
  if (req.method != "POST") return error(405, "use POST");
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::exception&) {
    ++bad_requests_;
    return error(400, "body is not valid JSON");
  }
  if (!body.is_object()) {
    ++bad_requests_;
    return error(400, "body must be a JSON object");
  }
  try {
    HttpResponse r;
    if (path == "/v1/register") r = on_register(body, req.peer_address);
    else if (path == "/v1/heartbeat" || path == "/v1/exit") r = on_heartbeat(body, req.peer_address);
    else if (path == "/v1/shards/next") r = on_shards_next(body);
    else if (path == "/v1/shards/complete") r = on_shards_complete(body);
    else if (path == "/v1/inject") r = on_inject(body);
    else if (path == "/v1/check") r = on_check(body);
    else if (path == "/v1/scale") r = on_scale(body);
    else return error(404, "no such endpoint: " + path);
    if (path != "/v1/heartbeat" && path != "/v1/exit") advance();  // a heartbeat advanced before its answer
    return r;
  } catch (const BadRequest& e) {
    ++bad_requests_;
    return error(400, e.what());
  }
}

HttpResponse LiveMaster::on_register(const json& b, const std::string& peer_address) {
  only_keys(b, {"name", "pid", "host", "slot", "check_port", "rdzv_port"});
  const std::string name = field<std::string>(b, "name");
  if (name.empty() || name.size() > 253) throw BadRequest("field 'name' must be 1 to 253 characters");
  if (finished()) return reply(200, json{{"action", "exit"}});
  for (auto& [id, n] : nodes_)
    if (n.name == name && !n.gone) return reply(200, assignment(n));  // a retry, or a master restart
  Node n;
  n.id = next_node_++;
  n.name = name;
  n.host = host_of(b, peer_address);
  n.check_port = static_cast<uint16_t>(std::clamp<int64_t>(field_or<int64_t>(b, "check_port", 0), 0, 65535));
  n.rdzv_port = static_cast<uint16_t>(std::clamp<int64_t>(field_or<int64_t>(b, "rdzv_port", 0), 0, 65535));
  n.last_heartbeat = clock_.now();
  const NodeId id = n.id;
  nodes_[id] = n;
  // The slot it was launched for if that is still vacant (so a pod labelled rank 3 is rank 3),
  // else the first vacant one of its replica type. None: it joins as a spare (an elastic policy
  // may grow the world to take it).
  const int64_t wanted = field_or<int64_t>(b, "slot", -1);
  // Its type: the slot it was launched for says (with one group, any slot will do).
  if (wanted >= 0 && wanted < spec_.nodes && spec_.replicas.size() > 1)
    nodes_[id].kind = replica_group(spec_.replicas, static_cast<int32_t>(wanted)).type;
  std::optional<int32_t> slot;
  if (wanted >= 0 && wanted < world_ && slots_[wanted] < 0) slot = static_cast<int32_t>(wanted);
  for (int32_t s = 0; s < world_ && !slot; ++s)
    if (slots_[s] < 0 && fits(nodes_[id], s)) slot = s;
  observe(NodeJoined{id, slot.value_or(-1), name, nodes_[id].kind});  // append() records the slot
  return reply(200, assignment(nodes_[id]));
}

json LiveMaster::assignment(const Node& n) const {
  json out{{"node", n.id}, {"slot", n.slot}, {"heartbeat_interval_ms", spec_.heartbeat_interval / kMillisecond}};
  const JobState& s = master_.state();
  if (s.finished() || n.gone) {
    out["action"] = "exit";
  } else if (n.slot >= 0 && n.slot < world_ && checks_pending()) {
    // Nobody trains until every node of the world has passed its check.
    out["action"] = "stop";
    if (!spec_.node_check.collective.empty()) {  // every node may be asked to host a pair's rank 0
      json env = json::array();
      for (const auto& [k, v] : spec_.env) env.push_back(k + "=" + v);
      out["check_collective"] = {{"argv", spec_.node_check.collective}, {"env", env}};
    }
    if (n.check_round > 0 && n.check_verdict.empty()) {
      out["action"] = "check";
      json c{{"round", n.check_round},
             {"id", n.check_id},
             {"compute_ms", spec_.node_check.compute / kMillisecond},
             {"link_bytes", spec_.node_check.link_bytes},
             {"timeout_ms", (spec_.node_check.round_timeout - spec_.node_check.compute) / 2 / kMillisecond}};
      if (const auto p = nodes_.find(n.check_peer); p != nodes_.end() && p->second.check_port > 0) {
        c["peer"] = p->first;
        c["peer_host"] = p->second.host.empty() ? std::string("127.0.0.1") : p->second.host;
        c["peer_port"] = p->second.check_port;
      }
      if (!n.check_fault.empty()) c["fault"] = n.check_fault;
      if (!spec_.node_check.collective.empty()) c["collective"] = true;
      out["check"] = c;
    }
  } else if (n.slot < 0 || n.slot >= world_ || s.restart_jobs() == 0 || s.phase() == Phase::Scheduling ||
             s.phase() == Phase::WaitingForCapacity || s.needs_restart() || clock_.now() < run_at_ ||
             std::any_of(slots_.begin(), slots_.begin() + world_, [](NodeId id) { return id < 0; })) {
    // A spare, or the world is between restarts or misses a rank (a parameter server's slot that
    // no worker may take): no trainer should run.
    out["action"] = "stop";
  } else {
    out["action"] = "run";
    out["restart"] = restart_.restart;
    out["rank"] = n.slot;
    out["world_size"] = restart_.world_size;
    // torch.distributed's store runs on rank 0: its host, as its agent reported it.
    const std::string rank0 = slots_[0] >= 0 ? nodes_.at(slots_[0]).host : "";
    out["master_addr"] = rank0.empty() ? std::string("127.0.0.1") : rank0;
    out["master_port"] = rdzv_port_;
    out["restore_step"] = restart_.restore_step;
    out["restore_tier"] = std::string(to_string(restart_.restore_tier));
    out["checkpoint_every_steps"] = plan_.every_steps;
    out["checkpoint_tier"] = std::string(to_string(plan_.tier));
    out["persist_every"] = plan_.persist_every;
    out["total_steps"] = spec_.total_steps;
    out["dump_stacks"] = last_failure_ && last_failure_->kind == FailureKind::Hang;  // the old trainers' stacks say where they hung
    out["job"] = spec_.job;
    out["run_id"] = run_id_;
    // Its replica group's program; every rank learns its part and the world's shape.
    const ReplicaGroup& g = replica_group(spec_.replicas, n.slot);
    out["command"] = g.command;
    json env = g.env;
    env["GOODPUT_REPLICA_TYPE"] = g.type;
    env["GOODPUT_REPLICA_INDEX"] = std::to_string(n.slot - g.first_slot);
    env["GOODPUT_REPLICAS"] = replica_counts(spec_.replicas, restart_.world_size).dump();
    // Once a group was scaled, storage holds checkpoints of more than one layout: a restore from
    // it loads exactly the step the master chose, each rank finding its part's state by the ranks
    // of the layout that step was saved under.
    if (relaid_ && restart_.restore_tier == Tier::Storage)
      if (const json saved = layout_of(restart_.restore_step); saved.is_object())
        env["GOODPUT_RESTORE_REPLICAS"] = saved.dump();
    out["env"] = env;
    out["storage_dir"] = spec_.storage_dir;
    out["checkpoint_bytes"] = spec_.checkpoint_bytes_per_node;
    out["memory_limit_mb"] = spec_.memory_limit_mb;
  }
  if (!n.inject.empty()) out["inject"] = n.inject;
  return out;
}

HttpResponse LiveMaster::on_heartbeat(const json& b, const std::string& peer_address) {
  only_keys(b, {"node", "trainer", "check", "check_port", "rdzv_port", "persist_error", "host", "leaving"});
  if (const auto t = b.find("trainer"); t != b.end() && t->is_object()) {
    only_keys(*t, {"restart", "phase", "pid", "step", "progress_age_ms", "saves", "save_blocking_ns", "saved_step", "done",
                   "storage_steps", "stopped", "loaded", "loss", "work_median_s", "work_mad_s", "exit"},
              "trainer.");
    if (const auto x = t->find("exit"); x != t->end() && x->is_object())
      only_keys(*x, {"code", "signal", "reason", "done", "age_ms"}, "trainer.exit.");
  }
  if (const auto c = b.find("check"); c != b.end() && c->is_object())
    only_keys(*c, {"round", "id", "compute_mflops", "compute_ok", "link_mb_per_s", "link_ok", "error"}, "check.");
  Node* n = node(field<int64_t>(b, "node") > INT32_MAX ? -1 : static_cast<NodeId>(field<int64_t>(b, "node")));
  if (!n) return error(404, "unknown node: register again");
  // Hosts are not in the log: a master resumed from it learns them from the next heartbeats.
  if (n->host.empty()) n->host = host_of(b, peer_address);
  if (const int64_t port = field_or<int64_t>(b, "check_port", 0); port > 0 && port < 65536)
    n->check_port = static_cast<uint16_t>(port);
  if (const int64_t port = field_or<int64_t>(b, "rdzv_port", 0); port > 0 && port < 65536)
    n->rdzv_port = static_cast<uint16_t>(port);
  n->persist_error = field_or<std::string>(b, "persist_error", "").substr(0, 1000);
  if (const auto c = b.find("check"); c != b.end() && c->is_object() && n->check_round > 0 &&
                                      field_or<int64_t>(*c, "id", 0) == n->check_id) {
    Node::CheckReport r;
    r.mflops = std::max<int64_t>(field_or<int64_t>(*c, "compute_mflops", 0), 0);
    r.compute_ok = field_or<bool>(*c, "compute_ok", false);
    if (c->contains("link_ok")) r.link_ok = field<bool>(*c, "link_ok");
    r.link = std::max<int64_t>(field_or<int64_t>(*c, "link_mb_per_s", 0), 0);
    r.error = field_or<std::string>(*c, "error", "").substr(0, 1000);
    n->check_report = r;
  }
  const Time now = clock_.now();
  n->last_heartbeat = now;
  if (b.contains("leaving")) {
    // The agent was stopped on purpose and is going: not a fault of its machine.
    const std::string why = field<std::string>(b, "leaving").substr(0, 300);
    if (!n->gone && n->slot >= 0 && !finished())
      observe(FailureObserved{n->id, FailureKind::Maintenance, 0, 0,
                              "agent leaving (" + why + "): stopped by an operator or the cluster", now});
    advance();
    return reply(200, json{{"action", "exit"}});
  }
  if (const auto it = b.find("trainer"); it != b.end() && it->is_object()) {
    const json& t = *it;
    Trainer& tr = n->trainer;
    const int32_t restart = field<int32_t>(t, "restart");
    if (restart != tr.restart) tr = Trainer{};
    tr.restart = restart;
    tr.phase = field<std::string>(t, "phase");
    tr.pid = field_or<int64_t>(t, "pid", 0);
    tr.step = field_or<int64_t>(t, "step", 0);
    tr.last_progress = now - field_or<int64_t>(t, "progress_age_ms", 0) * kMillisecond;
    tr.stopped = field_or<bool>(t, "stopped", false);
    tr.done = field_or<bool>(t, "done", false);
    tr.loss = t.contains("loss") && t["loss"].is_number() ? std::optional<double>(t["loss"].get<double>()) : std::nullopt;
    tr.work_median_s = field_or<double>(t, "work_median_s", -1);
    tr.work_mad_s = field_or<double>(t, "work_mad_s", -1);
    tr.saves = field_or<int64_t>(t, "saves", 0);
    tr.save_blocking_ns = field_or<int64_t>(t, "save_blocking_ns", 0);
    tr.saved_step = field_or<int64_t>(t, "saved_step", -1);
    tr.storage_steps = field_or<std::vector<int64_t>>(t, "storage_steps", {});
    if (const auto l = t.find("loaded"); l != t.end() && l->is_object()) {
      const auto tier = tier_from(field<std::string>(*l, "tier"));
      if (!tier) throw BadRequest("field 'loaded.tier' must be none, memory or storage");
      tr.loaded = CheckpointLoaded{field<int64_t>(*l, "step"), *tier, field<int64_t>(*l, "ns")};
    }
    if (const auto x = t.find("exit"); x != t.end() && x->is_object()) {
      if (!tr.exited) tr.exited_at = now - field_or<int64_t>(*x, "age_ms", 0) * kMillisecond;
      tr.exited = true;
      tr.done = tr.done || field_or<bool>(*x, "done", false);
      tr.exit_code = field_or<int32_t>(*x, "code", 0);
      tr.exit_signal = field_or<int32_t>(*x, "signal", 0);
      tr.exit_reason = field_or<std::string>(*x, "reason", "");
      tr.phase = "exited";
    }
  }
  advance();
  if (rdzv_port_ == 0) rdzv_port_ = pick_port();  // a resumed master: the old one's port died with it
  json out = assignment(*n);
  n->inject.clear();
  return reply(200, out);
}

HttpResponse LiveMaster::on_shards_next(const json& b) {
  only_keys(b, {"node", "restart", "request"});
  Node* n = node(field<int32_t>(b, "node"));
  if (!n || n->gone || n->slot < 0) return error(409, "node holds no slot");
  const Phase phase = master_.state().phase();
  if (field<int32_t>(b, "restart") != restart_.restart || (phase != Phase::Training && phase != Phase::CheckpointLoad))
    return error(409, "not training in the current restart");
  if (ledger_.total() == 0) return error(404, "this job has no data-shard service (data_shards is 0)");
  // A retry (the answer was lost, or the master restarted) gets the same shard again.
  const int64_t request = field_or<int64_t>(b, "request", -1);
  if (auto it = last_assigned_.find(n->id); request >= 0 && it != last_assigned_.end() && it->second.request == request &&
                                            !it->second.shards.empty())
    return reply(200, json{{"shard", it->second.shards.front()}, {"of", ledger_.total()}});
  const auto next = ledger_.next_queued();
  if (!next) return reply(200, json{{"shard", nullptr}, {"remaining", ledger_.total() - ledger_.done()}});
  master_.log(ShardsAssigned{n->id, request, {*next}});  // durable before the trainer hears of it
  return reply(200, json{{"shard", *next}, {"of", ledger_.total()}});
}

HttpResponse LiveMaster::on_shards_complete(const json& b) {
  only_keys(b, {"node", "restart", "step", "shards"});
  Node* n = node(field<int32_t>(b, "node"));
  if (!n || n->gone) return error(409, "unknown node");
  // Idempotent: a retry of a completion the log already holds is acknowledged again.
  std::vector<int64_t> shards;
  for (int64_t s : field<std::vector<int64_t>>(b, "shards")) {
    if (ledger_.done_by(s, n->id)) continue;
    if (!ledger_.assigned_to(s, n->id)) return error(409, "shard " + std::to_string(s) + " is not assigned to this node");
    shards.push_back(s);
  }
  if (!shards.empty()) master_.log(ShardsCompleted{n->id, field<int64_t>(b, "step"), shards});
  return reply(200, json{{"done", ledger_.done()}, {"of", ledger_.total()}});
}

HttpResponse LiveMaster::on_inject(const json& b) {
  only_keys(b, {"fault", "slot"});
  try {
    return reply(200, inject(field<std::string>(b, "fault"), field<int32_t>(b, "slot")));
  } catch (const std::invalid_argument& e) {
    throw BadRequest(e.what());
  }
}

json LiveMaster::inject(const std::string& fault, int32_t slot) {
  if (fault != "kill-process" && fault != "kill-node" && fault != "hang" && fault != "oom")
    throw std::invalid_argument("fault must be kill-process, kill-node, hang or oom, not '" + fault + "'");
  if (slot < 0 || slot >= world_ || slots_[slot] < 0)
    throw std::invalid_argument("no node holds slot " + std::to_string(slot));
  Node& n = nodes_[slots_[slot]];
  n.inject.push_back(fault);
  return json{{"node", n.id}, {"name", n.name}, {"slot", slot}, {"fault", fault}};
}

HttpResponse LiveMaster::on_check(const json& b) {
  only_keys(b, {"slots", "all", "fault", "reason", "now"});
  // Which nodes, said explicitly: a body that names none (or the wrong key) must not stop the
  // whole world for a check.
  const bool all = field_or<bool>(b, "all", false);
  if (all == b.contains("slots"))
    throw BadRequest("give either 'slots' (a list of slot numbers) or \"all\": true");
  std::vector<int32_t> slots;
  if (const auto it = b.find("slots"); it != b.end()) {
    if (!it->is_array()) throw BadRequest("field 'slots' must be a list of slot numbers");
    for (const json& s : *it) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() > 1'000'000)
        throw BadRequest("field 'slots' must be a list of slot numbers");
      slots.push_back(static_cast<int32_t>(s.get<int64_t>()));
    }
    if (slots.empty()) throw BadRequest("field 'slots' is empty (\"all\": true checks every node)");
  }
  const std::string reason = field_or<std::string>(b, "reason", "");
  if (reason.size() > 1000) throw BadRequest("field 'reason' must be at most 1000 characters");
  try {
    return reply(200, request_check(slots, field_or<std::string>(b, "fault", ""), reason, field_or<bool>(b, "now", false)));
  } catch (const std::invalid_argument& e) {
    return error(409, e.what());
  }
}

HttpResponse LiveMaster::on_scale(const json& b) {
  only_keys(b, {"group", "count", "reason"});
  const std::string reason = field_or<std::string>(b, "reason", "");
  if (reason.size() > 1000) throw BadRequest("field 'reason' must be at most 1000 characters");
  const int64_t count = field<int64_t>(b, "count");
  if (count < 0 || count > 4096) throw BadRequest("field 'count' must be from 0 to 4096");
  try {
    return reply(200, request_scale(field<std::string>(b, "group"), static_cast<int32_t>(count), reason));
  } catch (const std::invalid_argument& e) {
    return error(409, e.what());
  }
}

json LiveMaster::request_scale(const std::string& group, int32_t count, const std::string& reason) {
  if (finished()) throw std::invalid_argument("the job has finished");
  if (group != "ps" && group != "worker")
    throw std::invalid_argument("only the \"ps\" and \"worker\" groups can be scaled, not '" + group + "'");
  const auto g = std::find_if(spec_.replicas.begin(), spec_.replicas.end(), [&](const ReplicaGroup& x) { return x.type == group; });
  if (g == spec_.replicas.end()) throw std::invalid_argument("the job has no '" + group + "' group");
  if (count < 1) throw std::invalid_argument("a '" + group + "' group needs at least one node");
  if (master_.state().restart_jobs() == 0 || world_ < spec_.nodes ||
      std::any_of(slots_.begin(), slots_.end(), [](NodeId id) { return id < 0; }))
    throw std::invalid_argument("the world is not complete (a node is being placed or replaced); ask again when it is");
  if (check_round_ > 0 || checks_pending() || waiting_check_)
    throw std::invalid_argument("a node check is in progress or waiting; ask again when it ends");
  if (count == g->count) return json{{"group", group}, {"count", count}, {"changed", false}};
  ScaleRequested r{group, g->count, count, {}, reason.empty() ? "requested by an operator" : reason};
  json released = json::array();
  for (int32_t i = g->count - 1; i >= count; --i) {  // the group's highest slots go
    const NodeId id = slots_[g->first_slot + i];
    r.release.push_back(id);
    released.push_back({{"slot", g->first_slot + i}, {"node", id}, {"name", nodes_[id].name}});
  }
  const int32_t from = g->count;
  observe(std::move(r));
  // What the restart goes back to: the newest checkpoint in storage, or the start when there is none.
  const CheckpointRef& stored = master_.state().checkpoints().newest_in_storage();
  json out{{"group", group}, {"from", from}, {"count", count}, {"released", released},
           {"restore_step", stored.valid ? stored.step : 0}};
  if (!stored.valid) out["warning"] = "no checkpoint has reached storage yet: the job starts over";
  return out;
}

json LiveMaster::request_check(const std::vector<int32_t>& slots, const std::string& fault, const std::string& reason,
                               bool now) {
  if (finished()) throw std::invalid_argument("the job has finished");
  if (!fault.empty() && !valid_check_fault(fault))
    throw std::invalid_argument("fault must be corrupt, link-down or slow:F (F from 1 to 1000), not '" + fault + "'");
  if (check_round_ > 0 || checks_pending()) throw std::invalid_argument("a node check is in progress; ask again when it ends");
  if (waiting_check_) throw std::invalid_argument("a node check is waiting for the next checkpoint; ask again when it ends");
  std::vector<int32_t> wanted = slots;
  if (wanted.empty())
    for (int32_t s = 0; s < world_; ++s) wanted.push_back(s);
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  CheckRequested r{{}, fault, reason.empty() ? "requested by an operator" : reason};
  json names = json::array();
  for (int32_t s : wanted) {
    if (s < 0 || s >= world_ || slots_[s] < 0) throw std::invalid_argument("no node holds slot " + std::to_string(s));
    r.nodes.push_back(slots_[s]);
    names.push_back({{"slot", s}, {"node", slots_[s]}, {"name", nodes_[slots_[s]].name}});
  }
  if (!now && plan_.every_steps > 0 && master_.state().phase() == Phase::Training) {
    r.waiting = true;
    r.after_step = saved_step_;
    observe(std::move(r));  // append() keeps it in waiting_check_
    return json{{"checking", names}, {"when", "after the next checkpoint"}};
  }
  observe(std::move(r));
  return json{{"checking", names}, {"when", "now"}};
}

void LiveMaster::start_waiting_check() {
  // After the checkpoint it waited for (or at once if the job stopped training meanwhile: it
  // restarts anyway), for the nodes that still hold their slots.
  if (!waiting_check_ || finished()) return;
  if (master_.state().phase() == Phase::Training && saved_step_ <= waiting_check_->after_step) return;
  CheckRequested r = std::move(*waiting_check_);
  waiting_check_.reset();
  r.waiting = false;  // this one starts it
  r.after_step = 0;
  std::erase_if(r.nodes, [&](NodeId id) { const Node* n = node(id); return !n || n->gone || n->slot < 0; });
  if (!r.nodes.empty()) observe(std::move(r));
}

void LiveMaster::stop() { observe(JobFinished{"stopped", newest_step()}); }

// ---- turning reports into observations ------------------------------------------------------------

void LiveMaster::tick() {
  if (finished()) return;
  const Time now = clock_.now();
  if (provider_) {
    for (StatusObserved& s : provider_->status_changes()) observe(std::move(s));
    for (const LostNode& lost : provider_->lost()) on_lost(lost, now);
    if (grow_back_at_ && now >= *grow_back_at_ && !finished()) {
      grow_back_at_.reset();
      // Still a slot outside the world (a world slot that fell vacant meanwhile has its own launch).
      if (const auto s = first_vacant(); s && *s >= world_) provider_->launch(*s, slot_memory_[*s]);
    }
  }
  for (auto& [id, n] : nodes_)
    if (!n.gone && n.slot >= 0 && n.slot < world_ && now - n.last_heartbeat > spec_.heartbeat_timeout && !finished())
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

void LiveMaster::on_lost(const LostNode& lost, Time now) {
  if (finished()) return;
  for (auto& [id, n] : nodes_)
    if (n.name == lost.name) {
      if (!n.gone && n.slot >= 0) observe(FailureObserved{id, FailureKind::NodeLost, 0, 0, lost.reason, now});
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
  const std::optional<int32_t> vacant = first_vacant();
  if (!vacant) return;  // nobody is waiting for this node
  if (*vacant >= world_) {
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
  for (int32_t s = 0; s < world_; ++s)
    if (slots_[s] < 0 && waiting_slots_.insert(s).second) {
      observe(NoSpareNode{s, replica_group(spec_.replicas, s).type != "worker"});
      break;
    }
  provider_->launch(*vacant, slot_memory_[*vacant]);
}

std::optional<int32_t> LiveMaster::first_vacant() const {
  const auto it = std::find(slots_.begin(), slots_.end(), NodeId{-1});
  if (it == slots_.end()) return std::nullopt;
  return static_cast<int32_t>(it - slots_.begin());
}

bool LiveMaster::settled(const std::vector<Node*>& world, Time now) const {
  // failure_settle gathers the exits one failure causes. A rank whose agent has not been heard
  // from since the first exit may be the cause itself (its machine died and took the agent with
  // it; the backend or the heartbeat timeout will say so): wait for it, so the ranks its death
  // broke are not blamed first. A rank still alive reports within a heartbeat interval.
  if (now < *settle_from_ + spec_.failure_settle) return false;
  return std::none_of(world.begin(), world.end(), [&](const Node* n) {
    return !n->trainer.exited && n->last_heartbeat < *settle_from_ && now - n->last_heartbeat <= spec_.heartbeat_timeout;
  });
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
    std::vector<Node*> w = world();
    if (w.empty() || s.restart_jobs() == 0) return;
    const int32_t gen = restart_.restart;
    auto all = [&](auto pred) { return std::all_of(w.begin(), w.end(), [&](Node* n) { return pred(n->trainer); }); };
    const bool in_restart = phase == Phase::Restart || phase == Phase::Rendezvous || phase == Phase::CheckpointLoad ||
                            phase == Phase::Training;
    if (!in_restart) return;

    // Finished: every rank reported its last step (done), whether or not its process is gone yet.
    if (all([&](const Trainer& t) { return t.restart == gen && t.done && (!t.exited || t.exit_code == 0); })) {
      int64_t step = 0;
      for (Node* n : w) step = std::max(step, n->trainer.step);
      observe(JobFinished{"completed", step});
      return;
    }

    // Storage: the newest step every rank has in storage (once the log knows it was saved).
    {
      std::optional<int64_t> common;
      for (int64_t step : w.front()->trainer.storage_steps)
        if (step > persisted_step_ && step <= saved_step_ && (!common || step > *common) && all([&](const Trainer& t) {
              return std::find(t.storage_steps.begin(), t.storage_steps.end(), step) != t.storage_steps.end();
            }))
          common = step;
      if (common) {
        observe(CheckpointPersisted{*common, 1});
        continue;
      }
    }

    // Failures. A failure makes the other ranks fail too (their collectives break); wait a moment
    // for those reports, then blame the one that looks like the cause.
    Node* culprit = nullptr;
    FailureKind kind = FailureKind::ProcessExit;
    for (Node* n : w) {
      const Trainer& t = n->trainer;
      if (t.restart != gen || !t.exited || t.done) continue;
      if (!settle_from_) settle_from_ = now;
      auto score = [](const Trainer& x) { return (x.exit_signal != 0 ? 2 : 0) + (x.exit_reason.find("emory") != std::string::npos ? 1 : 0); };
      if (!culprit || score(t) > score(culprit->trainer) ||
          (score(t) == score(culprit->trainer) && t.exited_at < culprit->trainer.exited_at))
        culprit = n;
    }
    if (!culprit && phase != Phase::Restart) {
      // Hung: alive, no report for hang_timeout. One hung rank stalls them all (collectives wait
      // for it), so blame a stopped process if there is one, else the one silent longest.
      const bool hung = std::any_of(w.begin(), w.end(), [&](Node* n) {
        const Trainer& t = n->trainer;
        return t.restart == gen && !t.exited && now - t.last_progress > spec_.hang_timeout;
      });
      for (Node* n : w) {
        const Trainer& t = n->trainer;
        if (!hung || t.restart != gen || t.exited) continue;
        if (!culprit || (t.stopped && !culprit->trainer.stopped) ||
            (t.stopped == culprit->trainer.stopped && t.last_progress < culprit->trainer.last_progress))
          culprit = n;
      }
      if (culprit) kind = FailureKind::Hang;
      if (spec_.hang_action == JobSpec::HangAction::Report) {
        // Left alone: say so once, with every trainer's stacks, and say when it moves again.
        if (culprit && !stall_) {
          const Trainer& t = culprit->trainer;
          for (Node* n : w) n->inject.push_back("dump-stacks");
          observe(StallObserved{culprit->id, t.last_progress, false,
                                "no progress for " + format_duration(now - t.last_progress) + " at step " +
                                    std::to_string(t.step) + (t.stopped ? " (process stopped)" : "") +
                                    "; left alone (hang_action report)"});
          continue;
        }
        if (!hung && stall_) {
          observe(StallObserved{stall_->node, stall_->stalled_since, true, "progress resumed"});
          continue;
        }
        culprit = nullptr;
      }
      if (!culprit && !stall_ && phase == Phase::Training) {
        // A pause: no rank advanced for stall_after (the ranks wait on each other, so the job is
        // silent as one). Logged when it moves again, as a stall from its start, with the rank that
        // fell silent first; one that lasts to hang_timeout is a hang instead. Moving again means a
        // new step (report times jitter by a millisecond from one heartbeat to the next).
        Time newest = 0;
        int64_t step = 0;
        Node* first = nullptr;
        for (Node* n : w) {
          newest = std::max(newest, n->trainer.last_progress);
          step = std::max(step, n->trainer.step);
          if (!first || n->trainer.last_progress < first->trainer.last_progress) first = n;
        }
        if (!pause_ && now - newest >= spec_.stall_after_or_default()) {
          pause_ = StallObserved{first->id, newest, true, ""};
          pause_step_ = step;
        } else if (pause_ && step > pause_step_) {
          StallObserved p = *pause_;
          pause_.reset();
          p.reason = "no progress for " + format_duration(now - p.stalled_since) + " at step " +
                     std::to_string(pause_step_) + ", then moving again";
          observe(std::move(p));
          continue;
        }
      }
    }
    if (culprit) {
      if (kind == FailureKind::ProcessExit && settle_from_ && !settled(w, now)) return;  // tick() comes back
      const Trainer& t = culprit->trainer;
      settle_from_.reset();
      if (kind == FailureKind::Hang)
        observe(FailureObserved{culprit->id, FailureKind::Hang, 0, 0,
                                "no progress for " + format_duration(now - t.last_progress) + " at step " +
                                    std::to_string(t.step) + (t.stopped ? " (process stopped)" : ""),
                                t.last_progress});
      else
        observe(FailureObserved{culprit->id, FailureKind::ProcessExit, t.exit_code, t.exit_signal, t.exit_reason,
                                std::min(t.exited_at, now)});
      continue;
    }
    settle_from_.reset();

    if (phase == Phase::Restart) {
      if (now >= run_at_ && all([&](const Trainer& t) { return t.restart == gen && phase_rank(t.phase) >= 1; })) {
        observe(ProcessesStarted{restart_.world_size, gen});
        continue;
      }
    } else if (phase == Phase::Rendezvous) {
      if (all([&](const Trainer& t) { return t.restart == gen && phase_rank(t.phase) >= 2; })) {
        observe(RendezvousComplete{restart_.world_size, gen});
        continue;
      }
    } else if (phase == Phase::CheckpointLoad) {
      if (all([&](const Trainer& t) { return t.restart == gen && t.loaded; })) {
        CheckpointLoaded l = *w.front()->trainer.loaded;
        for (Node* n : w) {
          l.step = std::min(l.step, n->trainer.loaded->step);
          l.tier = std::max(l.tier, n->trainer.loaded->tier);
          l.load_time = std::max(l.load_time, n->trainer.loaded->load_time);
        }
        observe(l);
        continue;
      }
    } else if (phase == Phase::Training) {
      if (ticking_ && detect_stragglers(w)) continue;
      int64_t saves = INT64_MAX, step = INT64_MAX, blocking = 0;
      for (Node* n : w) {
        const Trainer& t = n->trainer;
        saves = std::min(saves, t.restart == gen ? t.saves : 0);
        step = std::min(step, t.saved_step);
        blocking = std::max(blocking, t.save_blocking_ns);
      }
      if (saves > gen_saves_ && step >= 0) {
        const int64_t count = saves - gen_saves_;
        const int64_t per_save = std::max<int64_t>(blocking - gen_blocking_ns_, 0) / count;
        const bool persist = plan_.tier == Tier::Memory && plan_.persist_every > 0 && saves % plan_.persist_every == 0;
        observe(CheckpointSaved{step, plan_.tier == Tier::None ? Tier::Memory : plan_.tier, per_save, persist, count});
        start_waiting_check();  // the moment an operator's check waited for: nothing to recompute
        continue;
      }
    }
    return;
  }
}

bool LiveMaster::detect_stragglers(const std::vector<Node*>& w) {
  // Synchronized ranks all take as long per step as the slowest; what differs is the CPU work each
  // does in a step. Compare each rank's median work (over its last steps) with the typical rank's
  // (the lower median, so two ranks compare with the faster one). Evidence goes in the event: the
  // ratio, as slowdown_permille.
  if (spec_.straggler_factor <= 0 || w.size() < 2) return false;
  std::vector<double> med;
  for (Node* n : w) {
    if (n->trainer.work_median_s <= 0) return false;
    med.push_back(n->trainer.work_median_s);
  }
  std::sort(med.begin(), med.end());
  const double typical = med[(med.size() - 1) / 2];
  for (Node* n : w) {
    const Trainer& t = n->trainer;
    const double ratio = t.work_median_s / typical;
    const bool steady = t.work_mad_s <= 0.25 * t.work_median_s;  // not a noisy window
    const int32_t permille = static_cast<int32_t>(std::lround(ratio * 1000));
    int32_t& flagged = straggler_permille_[n->id];
    if (ratio >= spec_.straggler_factor && steady && std::abs(permille - flagged) > 100) {
      flagged = permille;
      observe(SlowdownObserved{n->id, permille});
      return true;
    }
    if (flagged > 1000 && ratio < spec_.straggler_factor * 0.8) {
      flagged = 1000;
      observe(SlowdownObserved{n->id, 1000});
      return true;
    }
  }
  return false;
}

// ---- pre-flight node check -------------------------------------------------------------------------
//
// Every node is checked once, when the world it joined is complete: round 1 pairs the new nodes
// (each measures its link to its partner, so both directions are tried; an odd one goes to the
// fastest node already checked); a node with a wrong product is faulty at once; one whose link
// failed is a suspect, and round 2 pairs each suspect (slowest first) with a node that passed
// (fastest first). A suspect whose link fails again is faulty: it failed with two partners.
// Once no round is left, faulty nodes become failures for the recovery policy ("node check failed"
// reads as a hardware error: relaunched elsewhere, the machine excluded) and stragglers slowdowns
// with their ratio; not before, since round 2 may need them as partners. See docs/node-check.md.

bool LiveMaster::checks_pending() const {
  if (!checks_on()) return false;
  for (int32_t s = 0; s < world_; ++s)
    if (slots_[s] >= 0)
      if (const Node& n = nodes_.at(slots_[s]); !n.gone && n.check_wanted && n.check_verdict.empty()) return true;
  return false;
}

void LiveMaster::run_checks() {
  if (!checks_on() || finished()) return;
  if (check_round_ > 0) {
    const bool waiting = std::any_of(check_members_.begin(), check_members_.end(), [&](NodeId id) {
      const Node* n = node(id);
      return n && !n->gone && n->slot >= 0 && n->check_verdict.empty() && !n->check_report;
    });
    if (!waiting || clock_.now() >= check_deadline_) judge_checks();
    return;
  }
  act_on_checks();
  const std::vector<Node*> w = world();
  if (w.empty()) return;  // pairs are made across the whole world: wait for it
  std::vector<NodeId> fresh, checked;
  for (Node* n : w) {
    if (n->check_wanted && n->check_verdict.empty()) fresh.push_back(n->id);
    else if (n->check_verdict != "faulty") checked.push_back(n->id);  // a partner: one that passed (or was not checked)
  }
  if (fresh.empty()) return;
  std::stable_sort(checked.begin(), checked.end(),
                   [&](NodeId a, NodeId b) { return nodes_[a].check_link > nodes_[b].check_link; });
  std::vector<NodeId> peers(fresh.size(), -1);
  for (size_t i = 0; i + 1 < fresh.size(); i += 2) {
    peers[i] = fresh[i + 1];
    peers[i + 1] = fresh[i];
  }
  if (fresh.size() % 2 == 1) peers.back() = !checked.empty() ? checked.front() : fresh.size() > 1 ? fresh.front() : -1;
  start_check_round(1, fresh, peers);
}

void LiveMaster::start_check_round(int32_t round, std::vector<NodeId> members, const std::vector<NodeId>& peers) {
  // Ids from the clock: a resumed master never reuses one, so no agent answers with a result it
  // measured for the old master's round (perhaps against another partner).
  last_check_id_ = std::max(clock_.now(), last_check_id_ + 1);
  for (size_t i = 0; i < members.size(); ++i) {
    Node& n = nodes_[members[i]];
    n.check_round = round;
    n.check_id = last_check_id_;
    n.check_peer = peers[i];
    n.check_report.reset();
  }
  check_round_ = round;
  check_members_ = std::move(members);
  check_deadline_ = clock_.now() + spec_.node_check.round_timeout;
}

void LiveMaster::judge_checks() {
  const NodeCheckSpec& spec = spec_.node_check;
  const int32_t round = check_round_;
  check_round_ = 0;
  std::vector<NodeChecked> results;
  for (NodeId id : check_members_) {
    Node* n = node(id);
    if (!n || n->gone || n->slot < 0 || !n->check_verdict.empty()) continue;  // left meanwhile
    NodeChecked c{id, round, n->check_peer, 0, false, 0, false, "faulty", ""};
    if (!n->check_report) {
      c.detail = "no check result within " + format_duration(spec.round_timeout);
    } else {
      const Node::CheckReport& r = *n->check_report;
      c.compute_mflops = r.mflops;
      c.compute_ok = r.compute_ok;
      c.link_mb_per_s = r.link;
      c.link_ok = c.peer < 0 || r.link_ok.value_or(false);
      const std::string& error = r.error;
      if (!c.compute_ok) {
        c.detail = "compute probe: " + (error.empty() ? std::string("no result") : error);
      } else if (!c.link_ok) {
        c.verdict = round == 1 ? "suspect" : "faulty";
        c.detail = (round == 1 ? "" : "link failed with two partners; ") + (error.empty() ? "no link result" : error);
      } else {
        c.verdict = "passed";
      }
    }
    results.push_back(c);
  }
  // Stragglers among those that passed: compute (and link) against the median of the world's
  // checked nodes and this round's, the upper median (two nodes: the slower is compared with the faster).
  std::vector<int64_t> mflops, links;
  for (const auto& [id, n] : nodes_)
    if (!n.gone && n.slot >= 0 && (n.check_verdict == "passed" || n.check_verdict == "straggler")) {
      mflops.push_back(n.check_mflops);
      if (n.check_link > 0) links.push_back(n.check_link);
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
    if (ratio < spec.straggler_factor) continue;
    char text[160];
    if (rc >= rl)
      std::snprintf(text, sizeof text, "compute %lld MFLOP/s, 1/%.2f of the median %lld", static_cast<long long>(c.compute_mflops),
                    rc, static_cast<long long>(med_c));
    else
      std::snprintf(text, sizeof text, "link %lld MB/s, 1/%.2f of the median %lld", static_cast<long long>(c.link_mb_per_s), rl,
                    static_cast<long long>(med_l));
    c.verdict = "straggler";
    c.detail = text;
    nodes_[c.node].check_slowdown = static_cast<int32_t>(std::lround(std::min(ratio, 1000.0) * 1000));
  }
  std::vector<NodeId> suspects;
  for (NodeChecked& c : results) {
    observe(c);  // the evidence, before anything is decided
    if (c.verdict == "suspect") suspects.push_back(c.node);
  }
  std::erase_if(suspects, [&](NodeId id) { return !node(id) || node(id)->gone || node(id)->slot < 0; });
  if (!suspects.empty() && !finished()) {
    // Round 2: each suspect (slowest link first) with a node that passed (fastest first); with none
    // that passed, the suspects with each other, partners shifted by one. What this round found
    // waits for round 2: the nodes it condemns may be the partners round 2 needs.
    std::vector<NodeId> passed;
    for (const auto& [id, n] : nodes_)
      if (!n.gone && n.slot >= 0 && n.slot < world_ && (n.check_verdict == "passed" || n.check_verdict == "straggler"))
        passed.push_back(id);
    std::stable_sort(passed.begin(), passed.end(), [&](NodeId a, NodeId b) { return nodes_[a].check_link > nodes_[b].check_link; });
    std::vector<NodeId> peers(suspects.size());
    for (size_t i = 0; i < suspects.size(); ++i)
      peers[i] = !passed.empty()         ? passed[i % passed.size()]
                 : suspects.size() > 1 ? suspects[(i + 1) % suspects.size()]
                                       : nodes_[suspects[i]].check_peer;
    start_check_round(2, suspects, peers);
    return;
  }
  act_on_checks();
}

void LiveMaster::act_on_checks() {
  // Verdicts become observations for the policies: a faulty node is a failure ("node check failed"
  // reads as a hardware error), a straggler a slowdown with its measured ratio. Each once; a
  // master resumed from its log acts on a verdict the old one logged but did not act on.
  for (int32_t s = 0; s < world_ && !finished(); ++s) {
    if (slots_[s] < 0) continue;
    Node& n = nodes_[slots_[s]];
    if (n.gone || n.check_acted || n.check_verdict.empty()) continue;
    n.check_acted = true;
    if (n.check_verdict == "passed") {
      // Checked again on request and found well: a slowdown reported for it before is over.
      if (const auto it = straggler_permille_.find(n.id); it != straggler_permille_.end() && it->second > 1000) {
        it->second = 1000;
        observe(SlowdownObserved{n.id, 1000});
      }
    } else if (n.check_verdict == "faulty") {
      observe(FailureObserved{n.id, FailureKind::NodeLost, 0, 0, "node check failed: " + n.check_detail, clock_.now()});
    } else if (n.check_slowdown > 1000) {
      straggler_permille_[n.id] = n.check_slowdown;
      observe(SlowdownObserved{n.id, n.check_slowdown});
    }
  }
}

int64_t LiveMaster::newest_step() const {
  int64_t step = 0;
  for (const auto& [id, n] : nodes_)
    if (!n.gone) step = std::max(step, n.trainer.step);
  return step;
}

// ---- status and metrics ----------------------------------------------------------------------------

nlohmann::ordered_json LiveMaster::status() const {
  const JobState& s = master_.state();
  const Report r = make_report(s);
  nlohmann::ordered_json out;
  out["job"] = spec_.job;
  out["phase"] = std::string(to_string(s.phase()));
  if (s.finished()) out["finish_reason"] = r.end_reason;
  out["step"] = newest_step();
  if (world_ > 0 && slots_[0] >= 0)  // rank 0's latest loss, if its trainer reports one
    if (const auto it = nodes_.find(slots_[0]); it != nodes_.end() && it->second.trainer.loss)
      out["loss"] = *it->second.trainer.loss;
  out["total_steps"] = spec_.total_steps;
  out["restart"] = restart_.restart;
  out["world_size"] = world_;
  out["replicas"] = replica_counts(spec_.replicas, world_);
  // The step a restart from storage (a scale, a lost node) goes back to; null: none yet.
  if (const CheckpointRef& c = s.checkpoints().newest_in_storage(); c.valid) out["storage_step"] = c.step;
  else out["storage_step"] = nullptr;
  out["goodput"] = r.goodput;
  out["wall_s"] = static_cast<double>(r.wall) / kSecond;
  out["productive_s"] = static_cast<double>(r.productive) / kSecond;
  out["failures"] = r.failures;
  out["events"] = s.last_seq();
  if (ledger_.total() > 0)
    out["shards"] = {{"total", ledger_.total()}, {"done", ledger_.done()}, {"queued", ledger_.queued()},
                     {"duplicates", ledger_.duplicates()}};
  auto& nodes = out["nodes"] = nlohmann::ordered_json::array();
  const Time now = clock_.now();
  for (const auto& [id, n] : nodes_) {
    if (n.gone) continue;
    nodes.push_back({{"node", id},
                     {"name", n.name},
                     {"host", n.host},
                     {"slot", n.slot},
                     {"heartbeat_age_s", static_cast<double>(now - n.last_heartbeat) / kSecond},
                     {"check", n.check_verdict.empty() ? (n.check_round > 0 ? "round " + std::to_string(n.check_round) : "")
                                                       : n.check_verdict},
                     {"trainer", {{"restart", n.trainer.restart}, {"phase", n.trainer.phase}, {"pid", n.trainer.pid},
                                  {"step", n.trainer.step}, {"work_median_s", n.trainer.work_median_s}}}});
    if (!n.persist_error.empty()) nodes.back()["persist_error"] = n.persist_error;
  }
  return out;
}

std::string LiveMaster::page() const {
  // The replay report's page, folded from the log as it stands, reloading itself every 5 s.
  TimelineSink sink;
  store_.for_each([&](const Event& e) { sink.append(e); });
  std::string html = report_html(make_report(sink.state), sink.finish(), "Goodput live: " + spec_.job);
  if (const auto head = html.find("<head>"); head != std::string::npos)
    html.insert(head + 6, "<meta http-equiv=\"refresh\" content=\"5\">");
  return html;
}

std::string LiveMaster::metrics() const {
  const JobState& s = master_.state();
  const Report r = make_report(s);
  std::ostringstream o;
  o.precision(9);
  o << "# HELP goodput_ratio Share of wall time spent on training progress that was kept.\n"
       "# TYPE goodput_ratio gauge\n"
    << "goodput_ratio " << r.goodput << "\n"
    << "# HELP goodput_wall_seconds Wall time of the job so far.\n# TYPE goodput_wall_seconds gauge\n"
    << "goodput_wall_seconds " << static_cast<double>(r.wall) / kSecond << "\n"
    << "# HELP goodput_productive_seconds Training time that was kept.\n# TYPE goodput_productive_seconds gauge\n"
    << "goodput_productive_seconds " << static_cast<double>(r.productive) / kSecond << "\n"
    << "# HELP goodput_lost_seconds Time lost, by cause.\n# TYPE goodput_lost_seconds gauge\n";
  for (int l = 0; l < kLossCount; ++l)
    o << "goodput_lost_seconds{cause=\"" << to_string(static_cast<Loss>(l)) << "\"} "
      << static_cast<double>(r.loss[l]) / kSecond << "\n";
  o << "# HELP goodput_failures_total Failures, by diagnosis.\n# TYPE goodput_failures_total counter\n";
  for (int d = 0; d < kDiagnosisCount; ++d)
    o << "goodput_failures_total{diagnosis=\"" << to_string(static_cast<Diagnosis>(d)) << "\"} " << r.by_diagnosis[d] << "\n";
  o << "# HELP goodput_recoveries_total Recovery decisions, by action.\n# TYPE goodput_recoveries_total counter\n";
  for (int a = 0; a < kRecoveryActionCount; ++a)
    o << "goodput_recoveries_total{action=\"" << to_string(static_cast<RecoveryAction>(a)) << "\"} " << r.by_action[a] << "\n";
  o << "# HELP goodput_restarts_total Restarts of the whole job.\n# TYPE goodput_restarts_total counter\n"
    << "goodput_restarts_total " << r.restarts << "\n";
  int training = 0, spare = 0, waiting = 0;
  for (const auto& [id, n] : nodes_) {
    if (n.gone) continue;
    if (n.slot < 0) ++spare;
    else if (n.trainer.phase == "training") ++training;
    else ++waiting;
  }
  o << "# HELP goodput_nodes Nodes, by state.\n# TYPE goodput_nodes gauge\n"
    << "goodput_nodes{state=\"training\"} " << training << "\n"
    << "goodput_nodes{state=\"not_training\"} " << waiting << "\n"
    << "goodput_nodes{state=\"spare\"} " << spare << "\n"
    << "# HELP goodput_step Newest training step any trainer reported.\n# TYPE goodput_step gauge\n"
    << "goodput_step " << newest_step() << "\n"
    << "# HELP goodput_node_checks_total Node check results (one per node and round), by verdict.\n"
    << "# TYPE goodput_node_checks_total counter\n";
  for (const char* v : {"passed", "suspect", "faulty", "straggler"}) {
    const auto it = check_verdicts_.find(v);
    o << "goodput_node_checks_total{verdict=\"" << v << "\"} " << (it == check_verdicts_.end() ? 0 : it->second) << "\n";
  }
  o << "# HELP goodput_api_unauthorized_total Agent API requests refused for a missing or wrong token.\n"
    << "# TYPE goodput_api_unauthorized_total counter\n"
    << "goodput_api_unauthorized_total " << unauthorized_ << "\n";
  // Every refusal by reason: the token's, the handlers' (400), and the HTTP server's own (before any
  // handler saw a request).
  const HttpRefusals t = transport_refusals_ ? transport_refusals_() : HttpRefusals{};
  o << "# HELP goodput_api_refused_total Requests the master refused, by reason.\n"
    << "# TYPE goodput_api_refused_total counter\n";
  const std::pair<const char*, uint64_t> reasons[] = {
      {"token", static_cast<uint64_t>(unauthorized_)}, {"bad_request", static_cast<uint64_t>(bad_requests_)},
      {"body_too_large", t.body_too_large},           {"headers_too_large", t.headers_too_large},
      {"malformed_http", t.malformed},                {"slow_request", t.slow_request}};
  for (const auto& [reason, n] : reasons) o << "goodput_api_refused_total{reason=\"" << reason << "\"} " << n << "\n";
  return o.str();
}

}  // namespace goodput::live
