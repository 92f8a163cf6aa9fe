#include "vopr/vopr.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "backends/live/job_spec.h"
#include "backends/live/live_master.h"
#include "backends/live/master_api.h"
#include "engine/event_json.h"
#include "engine/event_store.h"
#include "engine/rng.h"
#include "policies/policy.h"
#include "report/report.h"

namespace goodput::vopr {

using nlohmann::json;

namespace {

constexpr Duration kTick = 100 * kMillisecond;  // one step of the simulation
constexpr Duration kStepTime = 50 * kMillisecond;  // one training step
constexpr int64_t kShardSteps = 5;                 // training steps per data shard
constexpr Duration kCallTimeout = 2 * kSecond;     // an agent's (and a trainer's) wait for an answer
constexpr char kToken[] = "vopr-token";

struct Violation {
  std::string what;
};

std::string seconds(Time t) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1fs", static_cast<double>(t) / kSecond);
  return b;
}

// ---- the disk -------------------------------------------------------------------------------------
// The event log as a disk holds it: appended events are durable once a flush commits them; a
// flush can fail (the master stops), and a crash loses what was not committed.
class SimDisk final : public EventStore {
 public:
  explicit SimDisk(std::function<bool()> fail_now) : fail_now_(std::move(fail_now)) {}
  void append(const Event& e) override {
    if (e.seq != last_seq() + 1) throw Violation{"event " + std::to_string(e.seq) + " appended after " + std::to_string(last_seq())};
    pending_.push_back(e);
  }
  void flush() override {
    if (pending_.empty()) return;
    if (fail_now_()) throw StoreError("commit of the event log failed: fsync: Input/output error (injected)");
    durable_.insert(durable_.end(), pending_.begin(), pending_.end());
    pending_.clear();
  }
  uint64_t last_seq() const override {
    return !pending_.empty() ? pending_.back().seq : durable_.empty() ? 0 : durable_.back().seq;
  }
  void for_each(const std::function<void(const Event&)>& f) const override {
    for (const Event& e : durable_) f(e);
    for (const Event& e : pending_) f(e);
  }
  void set_meta(const std::string& k, const std::string& v) override { meta_[k] = v; }
  std::optional<std::string> meta(const std::string& k) const override {
    const auto it = meta_.find(k);
    return it == meta_.end() ? std::nullopt : std::optional(it->second);
  }
  void crash(bool lie) {
    pending_.clear();
    if (lie && !durable_.empty()) durable_.pop_back();
  }
  size_t pending() const { return pending_.size(); }
  const std::vector<Event>& durable() const { return durable_; }

 private:
  std::function<bool()> fail_now_;
  std::vector<Event> durable_, pending_;
  std::map<std::string, std::string> meta_;
};

// ---- the simulated world ----------------------------------------------------------------------------

struct Trainer {
  int32_t restart = -1;
  std::string phase = "none";  // none, starting, rendezvous, loaded, training, exited
  Time phase_at = 0, progress_at = 0;
  int32_t rank = -1, world = 0;
  int64_t step = 0, restore_step = 0;
  std::string restore_tier = "none";
  int64_t saves = 0, saved_step = -1, every = 0, persist_every = 0, total = 0;
  bool loaded = false, done = false, hung = false;
  std::optional<json> exit;  // code, signal, reason, done
  Time exited_at = 0;
  // Data shards, one per block of kShardSteps steps (none when the service had none to give, as
  // the example trains on other data then): the block's, those finished since the last save, and
  // completions to send.
  std::optional<int64_t> shard;
  int64_t block_until = -1;  // the step the block in progress ends at (none: step >= it)
  std::vector<int64_t> finished;
  std::deque<std::pair<int64_t, std::vector<int64_t>>> to_complete;  // (save step, shards)
  int64_t shard_requests = 0;
  int32_t refusals = 0;  // completions refused in a row
  bool save_due = false;  // a checkpoint to commit once its shards are acknowledged
};

struct Call {
  std::string path;
  json body;
};

struct Agent {
  std::string name;
  int32_t launched_for = -1;
  bool alive = true;
  Time silent_until = 0;  // a hung agent: sends nothing until then
  int32_t node = -1;
  Time next_beat = 0;
  bool exit_reported = false;
  Trainer t;
  double slow = 1;  // its machine's speed against a healthy one's (a straggler's: 2.5 to 4)
  // Its host memory: the newest two steps its trainers saved there, of this rank.
  std::set<int64_t> memory;
  int32_t memory_rank = -1;
  // One call in flight per channel (the agent's, its trainer's), as HTTP clients with a deadline.
  struct Channel {
    int64_t id = 0;       // the call awaited; 0: none
    Time deadline = 0;
  } agent_ch, trainer_ch;
};

struct InFlight {
  Time at;
  int64_t id;  // unique; orders deliveries at the same time
  std::string agent;
  bool trainer_channel = false;
  bool is_answer = false;
  Call call;                  // requests
  net::HttpResponse answer;   // answers
  int64_t answers = 0;        // for an answer: the call it answers
};

class Sim final : public live::NodeProvider {
 public:
  explicit Sim(const Options& o)
      : o_(o), rng_(o.seed), disk_([this] { return faulty() && chance(p_.disk); }) {
    // Each seed draws how stormy it is, as FoundationDB's simulation does: some are calm, some
    // are not, and most faults are rare enough that the job still makes progress.
    auto pick = [&](double hi) { return rng_.uniform() < 0.2 ? 0.0 : rng_.uniform() * hi; };
    p_.drop = pick(0.05);
    p_.drop_answer = pick(0.05);
    p_.duplicate = pick(0.05);
    p_.delay = pick(0.2);
    p_.agent_dies = pick(0.002);
    p_.agent_silent = pick(0.002);
    p_.agent_restarts = pick(0.001);
    p_.trainer_crash = pick(0.003);
    p_.trainer_hang = pick(0.001);
    p_.straggler = pick(0.0005);
    p_.launch_lost = pick(0.2);
    p_.master_crash = pick(0.003);
    p_.disk = pick(0.002);
    spec_json_ = json{{"job", "vopr"},
                      {"nodes", o.nodes},
                      {"command", {"sim-trainer"}},
                      {"total_steps", o.total_steps},
                      {"step_time", "50ms"},
                      {"heartbeat_interval", "200ms"},
                      {"heartbeat_timeout", "2s"},
                      {"hang_timeout", "3s"},
                      {"join_timeout", "15s"},
                      {"straggler_factor", 2.0},
                      {"data_shards", o.nodes * o.total_steps / kShardSteps},
                      {"storage_dir", "/sim/storage"}};
    policy_json_ = json{{"recovery", {{"policy", "diagnose"}, {"max_restarts_per_node", 1000}, {"restore_from", "memory"},
                                      {"replace_stragglers_above", 2.0}}},
                        {"checkpoint", {{"policy", "flash"}, {"every_steps", 20}, {"persist_every", 2}}},
                        {"scaling", {{"policy", "wait"}}}};
  }

  Result run() {
    // What the master says on its console goes into the history, not to this process's stderr.
    struct Capture {
      std::stringstream text;
      std::streambuf* was = std::cerr.rdbuf(text.rdbuf());
      ~Capture() { std::cerr.rdbuf(was); }
    } console;
    console_ = &console.text;
    try {
      start_master();
      const int64_t last = o_.steps + o_.calm_steps;
      for (step_ = 0; step_ < last; ++step_) {
        now_.t += kTick;
        one_step();
        check();
        if (master_ && master_->finished() && step_ >= o_.steps) break;
        if (master_ && master_->finished() && all_left()) break;
      }
      result_.steps_run = step_;
      final_checks();
    } catch (const Violation& v) {
      result_.ok = false;
      result_.failure = v.what;
      result_.failed_at_step = step_;
    } catch (const std::exception& e) {
      result_.ok = false;
      result_.failure = std::string("unexpected exception: ") + e.what();
      result_.failed_at_step = step_;
    }
    said();
    console_ = nullptr;
    DigestSink digest;
    for (const Event& e : disk_.durable()) digest.append(e);
    result_.log_digest = digest.hex();
    result_.events = disk_.durable().size();
    for (const Event& e : disk_.durable()) ++result_.logged[std::string(event_type_name(e.payload))];
    if (!result_.ok)
      for (size_t i = 0; i < disk_.durable().size(); ++i) {
        const Event& e = disk_.durable()[i];
        result_.log_tail.push_back(seconds(e.time) + " #" + std::to_string(e.seq) + " " + std::string(event_type_name(e.payload)) +
                                   " " + payload_to_json(e.payload).dump());
      }
    return std::move(result_);
  }

  // ---- NodeProvider: the master's machines -----------------------------------------------------
  void launch(int32_t slot, int32_t) override {
    acting("launch");
    const std::string name = "n" + std::to_string(names_++);
    note("master launches " + name + " for slot " + std::to_string(slot));
    Agent a;
    a.name = name;
    a.launched_for = slot;
    if (faulty() && chance(p_.launch_lost)) {
      count("launch_lost");
      note(name + " will never come (its machine is lost)");
      losses_.push_back({now_.t + 3 * kSecond, {name, "machine never came (injected)", false}});
      return;
    }
    a.next_beat = now_.t + static_cast<Duration>(rng_.uniform() * 1.5 * kSecond) + 100 * kMillisecond;
    agents_.emplace(name, std::move(a));
  }
  void terminate(const std::string& name) override {
    acting("terminate");
    if (auto it = agents_.find(name); it != agents_.end() && it->second.alive) {
      note("master terminates " + name);
      it->second.alive = false;
    }
  }
  std::vector<live::LostNode> lost() override {
    std::vector<live::LostNode> out;
    for (auto it = losses_.begin(); it != losses_.end();)
      if (it->first <= now_.t) {
        out.push_back(it->second);
        it = losses_.erase(it);
      } else {
        ++it;
      }
    return out;
  }
  void shut_down(int) override {}

 private:
  struct Probabilities {
    double drop = 0, drop_answer = 0, duplicate = 0, delay = 0, agent_dies = 0, agent_silent = 0, agent_restarts = 0,
           trainer_crash = 0, trainer_hang = 0, straggler = 0, launch_lost = 0, master_crash = 0, disk = 0;
  };

  bool faulty() const { return o_.faults && step_ < o_.steps; }
  bool chance(double p) { return p > 0 && rng_.uniform() < p; }
  void count(const std::string& kind) { ++result_.faults[kind]; }
  void note(const std::string& what) {
    said();
    result_.history.push_back(seconds(now_.t) + " " + what);
  }
  // The master's console lines so far, into the history.
  void said() {
    if (!console_) return;
    std::string line;
    while (std::getline(*console_, line))
      if (!line.empty()) result_.history.push_back(seconds(now_.t) + " (master) " + line);
    console_->clear();
  }

  // The master acts on the world (a launch, a run order): everything it logged must be durable.
  void acting(const std::string& what) {
    if (disk_.pending() > 0)
      throw Violation{"the master acted (" + what + ") with " + std::to_string(disk_.pending()) + " events not yet durable"};
  }

  // ---- the master: started, crashed, resumed ---------------------------------------------------
  void start_master() {
    api_.reset();
    master_.reset();
    try {
      master_ = std::make_unique<live::LiveMaster>(live::job_spec_from_json(spec_json_, "", "."), load_policy(policy_json_),
                                                   disk_, now_, this, "run1");
      api_ = std::make_unique<live::MasterApi>(*master_, kToken);
      disk_.flush();  // the first events (a fresh job) are committed before anything answers
      if (acknowledged_seq_ > 0 &&
          (disk_.durable().size() < acknowledged_seq_ ||
           payload_to_json(disk_.durable()[acknowledged_seq_ - 1].payload).dump() != acknowledged_))
        throw Violation{"the master resumed without event " + std::to_string(acknowledged_seq_) +
                        ", which was durable (acknowledged) before it crashed"};
    } catch (const StoreError& e) {
      crash_master(e.what());
    }
  }

  void crash_master(const std::string& why) {
    note("master crashes (" + why + "); " + std::to_string(disk_.pending()) + " events not committed are lost");
    ++result_.master_restarts;
    api_.reset();
    master_.reset();
    // Everything committed so far was acknowledged (answered, acted on): a resumed master must find it.
    if (!disk_.durable().empty()) acknowledged_ = payload_to_json(disk_.durable().back().payload).dump();
    acknowledged_seq_ = disk_.durable().size();
    disk_.crash(o_.lying_disk);
    down_until_ = now_.t + static_cast<Duration>(rng_.uniform() * 2 * kSecond);
  }

  // A call into the master: its StoreError is the master stopping (it is resumed later).
  template <class F> bool into_master(F f) {
    if (!master_) return false;
    try {
      f();
    } catch (const StoreError& e) {
      crash_master(e.what());
      return false;
    }
    if (disk_.pending() > 0)
      throw Violation{"a call returned with " + std::to_string(disk_.pending()) + " events not durable"};
    return true;
  }

  void one_step() {
    if (!master_ && now_.t >= down_until_) {
      note("master resumes from its log (" + std::to_string(disk_.durable().size()) + " events)");
      start_master();
    }
    if (faulty() && master_ && chance(p_.master_crash)) {
      count("master_crash");
      crash_master("killed");
    }
    deliver();
    if (master_) into_master([&] { master_->tick(); });
    for (auto& [name, a] : agents_) agent_step(a);
  }

  // ---- the network ----------------------------------------------------------------------------
  void send(Agent& a, bool trainer_channel, Call c) {
    Agent::Channel& ch = trainer_channel ? a.trainer_ch : a.agent_ch;
    const int64_t id = ++calls_;
    ch.id = id;
    ch.deadline = now_.t + kCallTimeout;
    if (faulty() && chance(p_.drop)) {
      count("request_dropped");
      return;
    }
    const Duration delay = faulty() && chance(p_.delay) ? static_cast<Duration>(rng_.uniform() * 3 * kSecond) : 0;
    if (delay > 0) count("request_delayed");
    net_.push_back({now_.t + delay, id, a.name, trainer_channel, false, std::move(c), {}, 0});
    if (faulty() && chance(p_.duplicate)) {
      count("request_duplicated");
      InFlight again = net_.back();
      again.at = now_.t + static_cast<Duration>(rng_.uniform() * 2 * kSecond);
      again.id = ++calls_;
      again.answers = -1;  // nobody waits for the copy's answer
      net_.push_back(std::move(again));
    }
  }

  void deliver() {
    std::stable_sort(net_.begin(), net_.end(), [](const InFlight& x, const InFlight& y) { return std::pair(x.at, x.id) < std::pair(y.at, y.id); });
    std::vector<InFlight> due;
    while (!net_.empty() && net_.front().at <= now_.t) {
      due.push_back(std::move(net_.front()));
      net_.pop_front();
    }
    for (InFlight& m : due) {
      if (m.is_answer) {
        receive(m);
        continue;
      }
      if (!master_) continue;  // nobody listening: the connection is refused
      net::HttpRequest r;
      r.method = "POST";
      r.target = m.call.path;
      r.authorization = std::string("Bearer ") + kToken;
      r.body = m.call.body.dump();
      r.peer_address = "10.0.0." + std::to_string(std::hash<std::string>{}(m.agent) % 250 + 1);
      net::HttpResponse answer;
      if (!into_master([&] { answer = api_->handle(r); })) continue;
      if (answer.status >= 500) throw Violation{"the master answered " + std::to_string(answer.status) + ": " + answer.body};
      if (m.answers < 0) continue;  // a duplicate's answer goes nowhere
      if (faulty() && chance(p_.drop_answer)) {
        count("answer_dropped");
        continue;
      }
      const Duration delay = faulty() && chance(p_.delay) ? static_cast<Duration>(rng_.uniform() * 3 * kSecond) : 0;
      net_.push_back({now_.t + delay, ++calls_, m.agent, m.trainer_channel, true, {}, std::move(answer), m.id});
    }
  }

  void receive(const InFlight& m) {
    auto it = agents_.find(m.agent);
    if (it == agents_.end() || !it->second.alive) return;
    Agent& a = it->second;
    Agent::Channel& ch = m.trainer_channel ? a.trainer_ch : a.agent_ch;
    if (ch.id != m.answers || now_.t > ch.deadline) return;  // it gave up on that call
    ch.id = 0;
    const json body = m.answer.body.empty() ? json::object() : json::parse(m.answer.body);
    if (m.trainer_channel) trainer_answer(a, m.answer.status, body);
    else agent_answer(a, m.answer.status, body);
  }

  // ---- agents -----------------------------------------------------------------------------------
  void agent_step(Agent& a) {
    if (!a.alive) return;
    if (faulty()) {
      if (chance(p_.agent_dies)) {
        count("agent_died");
        a.alive = false;
        const bool seen = rng_.uniform() < 0.7;
        note(a.name + " dies" + (seen ? "" : " (its provider does not notice)"));
        if (seen) losses_.push_back({now_.t + static_cast<Duration>(rng_.uniform() * kSecond), {a.name, "machine died (injected)", false}});
        return;
      }
      if (chance(p_.agent_silent)) {
        count("agent_silent");
        a.silent_until = now_.t + static_cast<Duration>((0.5 + rng_.uniform() * 5.5) * kSecond);
        note(a.name + " goes silent until " + seconds(a.silent_until));
      }
      if (a.slow == 1 && chance(p_.straggler)) {
        count("straggler");
        a.slow = 2.5 + 1.5 * rng_.uniform();
        note(a.name + "'s machine slows down (" + std::to_string(a.slow) + "x the work per step)");
      }
      if (chance(p_.agent_restarts)) {
        count("agent_restarted");
        note(a.name + " restarts under the same name (its trainer dies with it)");
        a.node = -1;
        a.t = Trainer{};
        a.agent_ch = a.trainer_ch = {};
        a.exit_reported = false;
        a.memory.clear();  // an agent leaving frees its node's memory
      }
      trainer_faults(a);
    }
    trainer_step(a);
    if (now_.t < a.silent_until) return;
    for (Agent::Channel* ch : {&a.agent_ch, &a.trainer_ch})
      if (ch->id != 0 && now_.t > ch->deadline) ch->id = 0;  // timed out: it may ask again
    if (a.agent_ch.id == 0 && now_.t >= a.next_beat) {
      a.next_beat = now_.t + 200 * kMillisecond;
      if (a.node < 0) {
        send(a, false, {"/v1/register", json{{"name", a.name}, {"slot", a.launched_for}, {"check_port", 7000}, {"rdzv_port", 29500}}});
      } else {
        const bool exit = a.t.exit && !a.exit_reported;
        json trainer = report(a.t);
        if (a.t.phase == "training" && !a.t.exit) {  // the CPU work per step: how a straggler shows
          trainer["work_median_s"] = 0.02 * a.slow;
          trainer["work_mad_s"] = 0.001;
        }
        send(a, false, {exit ? "/v1/exit" : "/v1/heartbeat", json{{"node", a.node}, {"trainer", trainer}}});
      }
    }
    if (a.trainer_ch.id == 0 && a.node >= 0) trainer_call(a);
  }

  void agent_answer(Agent& a, int status, const json& b) {
    if (status == 404) {  // the master does not know us (it resumed without our registration)
      a.node = -1;
      return;
    }
    if (status != 200) return;
    if (b.contains("node") && a.node < 0) {
      a.node = b["node"].get<int32_t>();
      a.exit_reported = false;
    }
    if (a.t.exit) a.exit_reported = true;
    const std::string action = b.value("action", "stop");
    if (action == "exit") {
      note(a.name + " leaves (told to)");
      a.alive = false;
      // Its process exits: a provider sees that, and the master knows it is gone.
      losses_.push_back({now_.t + 50 * kMillisecond, {a.name, "node process exited with code 0", false}});
      return;
    }
    if (action == "run") {
      const int32_t restart = b.value("restart", 0);
      if (restart != a.t.restart) start_trainer(a, b);
    } else if (a.t.phase != "none" && a.t.phase != "exited") {
      const int32_t restart = a.t.restart;  // stopped: killed, no exit to report
      a.t = Trainer{};
      a.t.restart = restart;
    }
  }

  void start_trainer(Agent& a, const json& order) {
    const int32_t restart = order.value("restart", 0);
    // A run order is only handed out for a restart whose decision is durable.
    bool durable = false;
    for (const Event& e : disk_.durable())
      if (const auto* r = std::get_if<RestartJob>(&e.payload); r && r->restart == restart) durable = true;
    if (!durable) throw Violation{a.name + " was ordered to run restart " + std::to_string(restart) + ", which the log does not hold"};
    Trainer t;
    t.restart = restart;
    t.phase = "starting";
    t.phase_at = t.progress_at = now_.t;
    t.rank = order.value("rank", -1);
    t.world = order.value("world_size", 0);
    t.restore_step = order.value("restore_step", int64_t{0});
    t.restore_tier = order.value("restore_tier", std::string("none"));
    t.every = order.value("checkpoint_every_steps", int64_t{0});
    t.persist_every = order.value("persist_every", int64_t{0});
    t.total = order.value("total_steps", int64_t{0});
    a.t = std::move(t);
    a.exit_reported = false;
    a.trainer_ch = {};
  }

  json report(const Trainer& t) const {
    json r{{"restart", t.restart},         {"phase", t.phase},  {"pid", 1000},
           {"step", t.step},               {"progress_age_ms", (now_.t - t.progress_at) / kMillisecond},
           {"saves", t.saves},             {"save_blocking_ns", t.saves * kMillisecond},
           {"saved_step", t.saved_step},   {"done", t.done},    {"storage_steps", storage_steps(t.rank)}};
    if (t.loaded) r["loaded"] = {{"step", t.restore_step}, {"tier", t.restore_tier}, {"ns", 10 * kMillisecond}};
    if (t.exit) {
      r["exit"] = *t.exit;
      r["exit"]["age_ms"] = (now_.t - t.exited_at) / kMillisecond;
    }
    return r;
  }

  std::vector<int64_t> storage_steps(int32_t rank) const {
    const auto it = storage_.find(rank);
    return it == storage_.end() ? std::vector<int64_t>{} : std::vector<int64_t>(it->second.begin(), it->second.end());
  }

  // ---- trainers ---------------------------------------------------------------------------------
  void trainer_faults(Agent& a) {
    Trainer& t = a.t;
    if (t.phase == "none" || t.exit) return;
    if (chance(p_.trainer_crash)) {
      count("trainer_crashed");
      const uint64_t how = rng_.below(3);
      json x = how == 0   ? json{{"code", -9}, {"signal", 9}, {"reason", "killed by signal 9 (Killed)"}}
               : how == 1 ? json{{"code", 1}, {"signal", 0}, {"reason", "RuntimeError: simulated failure in the trainer"}}
                          : json{{"code", 1}, {"signal", 0}, {"reason", "torch.OutOfMemoryError: CUDA out of memory (simulated)"}};
      x["done"] = false;
      note(a.name + "'s trainer exits: " + x["reason"].get<std::string>());
      exit_trainer(t, std::move(x));
    } else if (chance(p_.trainer_hang)) {
      count("trainer_hung");
      note(a.name + "'s trainer hangs");
      t.hung = true;
    }
  }

  void exit_trainer(Trainer& t, json x) {
    t.exit = std::move(x);
    t.exited_at = now_.t;
    t.phase = "exited";
    t.shard.reset();  // what it trained since its last save is lost with it
    t.finished.clear();
  }

  // Whether every rank of this trainer's restart is up to the phase (a collective needs them all).
  bool world_at(const Trainer& t, const std::string& phase) const {
    int32_t ranks = 0;
    for (const auto& [name, b] : agents_) {
      if (!b.alive || b.t.restart != t.restart || b.t.world != t.world || b.t.hung) continue;
      if (b.t.phase == phase || (phase == "rendezvous" && (b.t.phase == "loaded" || b.t.phase == "training")) ||
          (phase == "loaded" && b.t.phase == "training") || b.t.done)
        ++ranks;
    }
    return ranks >= t.world;
  }

  void trainer_step(Agent& a) {
    Trainer& t = a.t;
    if (!a.alive || t.phase == "none" || t.exit || t.hung || t.done) return;
    if (t.phase == "starting" && now_.t - t.phase_at >= 200 * kMillisecond) {
      t.phase = "rendezvous";
      t.phase_at = t.progress_at = now_.t;
    } else if (t.phase == "rendezvous" && world_at(t, "rendezvous")) {
      // As goodput.live does: the ranks agree on the newest step every one of them can load
      // (from its node's memory unless the master says storage, or from storage), whatever the
      // master planned; the slowest tier is what they report.
      const auto [step, tier] = agreed_restore(t);
      t.phase = "loaded";
      t.loaded = true;
      t.restore_step = t.step = step;
      t.restore_tier = tier;
      // As goodput.live does: rank 0 drops the storage steps of the history given up, and every
      // rank its memory's.
      if (t.rank == 0)
        for (auto& [rank, steps] : storage_) steps.erase(steps.upper_bound(t.restore_step), steps.end());
      a.memory.erase(a.memory.upper_bound(t.restore_step), a.memory.end());
      t.phase_at = t.progress_at = now_.t;
    } else if (t.phase == "loaded" && world_at(t, "loaded")) {
      t.phase = "training";
      t.phase_at = t.progress_at = now_.t;
    } else if (t.phase == "training" && world_at(t, "training")) {
      const int64_t shards = spec_json_["data_shards"].get<int64_t>();
      for (int i = 0; i < kTick / kStepTime; ++i) {
        if (!t.to_complete.empty()) return;  // save() waits for its shards to be acknowledged...
        if (t.save_due) save(a);             // ...before it commits the checkpoint holding them
        if (t.step >= t.total) {  // the last step is saved and acknowledged: done
          exit_trainer(t, json{{"code", 0}, {"signal", 0}, {"reason", ""}, {"done", true}});
          t.done = true;
          return;
        }
        if (shards > 0 && t.step >= t.block_until) return;  // waits for its next shard
        if (!peers_reached(t, t.step)) return;  // synchronous training: a step's collectives need every rank
        ++t.step;
        t.progress_at = now_.t;
        if (t.shard && t.step >= t.block_until) {
          t.finished.push_back(*t.shard);
          t.shard.reset();
        }
        if ((t.every > 0 && t.step % t.every == 0) || t.step == t.total) {
          if (!t.finished.empty()) t.to_complete.emplace_back(t.step, std::exchange(t.finished, {}));
          t.save_due = true;
        }
      }
    }
  }

  void save(Agent& a) {
    Trainer& t = a.t;
    t.save_due = false;
    ++t.saves;
    t.saved_step = t.step;
    if (a.memory_rank != t.rank) a.memory.clear();
    a.memory_rank = t.rank;
    a.memory.insert(t.step);
    while (a.memory.size() > 2) a.memory.erase(a.memory.begin());
    if ((t.persist_every > 0 && t.saves % t.persist_every == 0) || t.step == t.total) storage_[t.rank].insert(t.step);
  }

  void trainer_call(Agent& a) {
    Trainer& t = a.t;
    if (t.phase != "training" && t.phase != "exited") return;
    if (t.exit && !t.exit->value("done", false)) return;  // a dead process calls nobody
    if (!t.to_complete.empty()) {
      const auto& [step, shards] = t.to_complete.front();
      send(a, true, {"/v1/shards/complete", json{{"node", a.node}, {"restart", t.restart}, {"step", step}, {"shards", shards}}});
    } else if (t.phase == "training" && t.step >= t.block_until && t.step < t.total && spec_json_["data_shards"].get<int64_t>() > 0) {
      send(a, true, {"/v1/shards/next", json{{"node", a.node}, {"restart", t.restart}, {"request", t.shard_requests}}});
    }
  }

  void trainer_answer(Agent& a, int status, const json& b) {
    Trainer& t = a.t;
    if (b.contains("done") && b.contains("of")) {  // a completion acknowledged
      if (!t.to_complete.empty()) t.to_complete.pop_front();
      t.refusals = 0;
      return;
    }
    if (status == 409 && !t.to_complete.empty()) {
      // As goodput.live does: a 409 is tried again for about 10 s (the master may be between
      // restarts), then the trainer fails.
      if (++t.refusals >= 50) {
        note("a trainer gives up acknowledging its shards: " + b.dump());
        exit_trainer(t, json{{"code", 1}, {"signal", 0}, {"reason", "RuntimeError: goodput master refused /v1/shards/complete"},
                             {"done", false}});
      }
      return;
    }
    if (status != 200 || t.phase != "training") return;
    if (!b.contains("shard") || t.step < t.block_until) return;
    ++t.shard_requests;
    if (b["shard"].is_number_integer()) t.shard = b["shard"].get<int64_t>();
    else note(a.name + " trains steps " + std::to_string(t.step + 1) + "-" + std::to_string(t.step + kShardSteps) +
              " without a shard: " + b.dump());
    t.block_until = t.step + kShardSteps;
  }

  // Every rank of this trainer's world has done `step` (a rank ahead of it waits in a collective).
  bool peers_reached(const Trainer& t, int64_t step) const {
    int32_t ranks = 0;
    for (const auto& [name, b] : agents_)
      if (b.alive && b.t.restart == t.restart && b.t.world == t.world && !b.t.hung && (b.t.step >= step || b.t.done) &&
          (b.t.phase == "training" || b.t.done))
        ++ranks;
    return ranks >= t.world;
  }

  std::pair<int64_t, std::string> agreed_restore(const Trainer& t) const {
    std::set<int64_t> complete;  // steps every rank has in storage
    for (int32_t r = 0; r < t.world; ++r) {
      const auto it = storage_.find(r);
      const std::set<int64_t> have = it == storage_.end() ? std::set<int64_t>{} : it->second;
      if (r == 0) complete = have;
      else std::erase_if(complete, [&](int64_t x) { return !have.contains(x); });
    }
    std::optional<std::set<int64_t>> common;
    bool all_memory = true;
    std::vector<const Agent*> ranks;
    for (const auto& [name, b] : agents_)
      if (b.alive && b.t.restart == t.restart && b.t.world == t.world) ranks.push_back(&b);
    for (const Agent* b : ranks) {
      std::set<int64_t> have = complete;
      if (t.restore_tier != "storage" && b->memory_rank == b->t.rank) have.insert(b->memory.begin(), b->memory.end());
      if (!common) common = have;
      else std::erase_if(*common, [&](int64_t x) { return !have.contains(x); });
    }
    if (!common || common->empty()) return {0, "none"};
    const int64_t step = *common->rbegin();
    for (const Agent* b : ranks)
      all_memory = all_memory && t.restore_tier != "storage" && b->memory_rank == b->t.rank && b->memory.contains(step);
    return {step, all_memory ? "memory" : "storage"};
  }

  bool all_left() const {
    return std::none_of(agents_.begin(), agents_.end(), [](const auto& x) { return x.second.alive; });
  }

  // ---- invariants -------------------------------------------------------------------------------
  void check() {
    if (!master_) return;
    const live::World& w = master_->world();
    // One node per slot, one slot per node.
    std::map<int32_t, int32_t> slot_of;
    for (const auto& [id, n] : w.nodes()) {
      if (n.gone || n.slot < 0) continue;
      if (!slot_of.emplace(n.slot, id).second)
        throw Violation{"nodes " + std::to_string(slot_of[n.slot]) + " and " + std::to_string(id) + " both hold slot " + std::to_string(n.slot)};
      if (n.slot < w.slot_count() && w.at(n.slot) != id)
        throw Violation{"node " + std::to_string(id) + " says it holds slot " + std::to_string(n.slot) + ", the slot table says " +
                        std::to_string(w.at(n.slot))};
    }
    // No data shard held by two live trainers of the same restart.
    std::map<int64_t, std::string> holder;
    for (const auto& [name, a] : agents_) {
      if (!a.alive || !a.t.shard || a.t.exit) continue;
      if (auto [it, fresh] = holder.emplace(*a.t.shard, name); !fresh)
        throw Violation{"data shard " + std::to_string(*a.t.shard) + " is held by " + it->second + " and " + name + " at once"};
    }
    // The state folded from the durable log is the master's.
    if (step_ % 50 == 0 || master_->finished()) compare_with_fold();
  }

  void compare_with_fold() {
    JobState folded;
    for (const Event& e : disk_.durable()) folded.apply(e);
    const std::string a = report_json(make_report(folded)).dump(), b = report_json(make_report(master_->state())).dump();
    if (a != b) throw Violation{"the state folded from the log differs from the master's:\n  log:    " + a + "\n  master: " + b};
    if (folded.last_seq() != master_->state().last_seq() || folded.phase() != master_->state().phase())
      throw Violation{"the log ends at " + std::to_string(folded.last_seq()) + " (" + std::string(to_string(folded.phase())) +
                      "), the master at " + std::to_string(master_->state().last_seq())};
  }

  void final_checks() {
    if (!master_) start_master();
    compare_with_fold();
    result_.finish_reason = master_->state().finish_reason();
    result_.completed = master_->finished() && result_.finish_reason == "completed";
    if (!result_.completed)
      throw Violation{"liveness: " + std::to_string(o_.calm_steps) + " steps after the faults stopped the job is " +
                      (master_->finished() ? "finished (" + result_.finish_reason + ")" : std::string(to_string(master_->state().phase()))) +
                      " at step " + std::to_string(master_->newest_step()) + " of " + std::to_string(o_.total_steps)};
    const ShardLedger& l = master_->shards();
    if (l.done() != l.total() || l.duplicates() != 0)
      throw Violation{"data shards: " + std::to_string(l.done()) + " of " + std::to_string(l.total()) + " done, " +
                      std::to_string(l.duplicates()) + " trained twice, " + std::to_string(l.rejected()) + " completions refused"};
  }

  struct ManualClock final : Clock {
    Time t = 0;
    Time now() const override { return t; }
  };

  Options o_;
  Rng rng_;
  Probabilities p_;
  ManualClock now_;
  SimDisk disk_;
  json spec_json_, policy_json_;
  std::unique_ptr<live::LiveMaster> master_;
  std::unique_ptr<live::MasterApi> api_;
  Time down_until_ = 0;
  uint64_t acknowledged_seq_ = 0;  // durable events when the master last crashed
  std::string acknowledged_;       // the last of them
  std::stringstream* console_ = nullptr;
  std::map<std::string, Agent> agents_;
  std::deque<InFlight> net_;
  std::vector<std::pair<Time, live::LostNode>> losses_;
  std::map<int32_t, std::set<int64_t>> storage_;  // rank -> steps persisted (storage outlives machines)
  int64_t names_ = 0, calls_ = 0, step_ = 0;
  Result result_;
};

}  // namespace

Result run(const Options& options) { return Sim(options).run(); }

std::string describe(const Options& o, const Result& r, bool full_history) {
  std::ostringstream out;
  out << "seed " << o.seed << ": " << (r.ok ? "ok" : "FAILED") << ", " << r.events << " events, " << r.master_restarts
      << " master restarts, ";
  int64_t faults = 0;
  for (const auto& [k, v] : r.faults) faults += v;
  out << faults << " faults, " << (r.completed ? "completed" : "not completed: " + r.finish_reason) << ", log " << r.log_digest;
  if (!r.ok) {
    out << "\n  at step " << r.failed_at_step << " (" << seconds(r.failed_at_step * kTick) << "): " << r.failure << "\n";
    out << "  reproduce: goodput vopr --seed " << o.seed << " --steps " << o.steps << " --nodes " << o.nodes << "\n";
    const size_t from = full_history || r.history.size() <= 60 ? 0 : r.history.size() - 60;
    if (from > 0) out << "  ... " << from << " earlier lines (--history shows all)\n";
    for (size_t i = from; i < r.history.size(); ++i) out << "  " << r.history[i] << "\n";
    const size_t first = full_history || r.log_tail.size() <= 40 ? 0 : r.log_tail.size() - 40;
    out << "  the log" << (first > 0 ? "'s last 40 events (--history shows all " + std::to_string(r.log_tail.size()) + ")" : "")
        << ":\n";
    for (size_t i = first; i < r.log_tail.size(); ++i) out << "  " << r.log_tail[i] << "\n";
  }
  return out.str();
}

}  // namespace goodput::vopr
