#include "agent/trainer_group.h"

#include <algorithm>
#include <iostream>
#include <set>
#include <thread>

namespace goodput::agent {

using nlohmann::json;

namespace {

constexpr auto kSiblingGrace = std::chrono::seconds(2);  // SIGTERM to SIGKILL, as torchrun's agent does

void log(const std::string& name, const std::string& what) { std::cerr << "agent " << name << ": " << what << std::endl; }

int phase_order(const std::string& phase) {
  static const std::vector<std::string> order = {"none", "launched", "starting", "rendezvous", "loaded", "training", "exited"};
  const auto it = std::find(order.begin(), order.end(), phase);
  return it == order.end() ? 0 : static_cast<int>(it - order.begin());
}

// Sets `key` in an environment list, replacing what it held; keep: only when it is not set yet.
void set_env(std::vector<std::string>& env, const std::string& key, const std::string& value, bool keep = false) {
  const auto held = [&](const std::string& s) { return s.rfind(key + "=", 0) == 0; };
  if (keep && std::any_of(env.begin(), env.end(), held)) return;
  std::erase_if(env, held);
  env.push_back(key + "=" + value);
}

std::optional<int64_t> env_int(const std::vector<std::string>& env, const std::string& key) {
  for (const std::string& s : env)
    if (s.rfind(key + "=", 0) == 0) try {
        return std::stoll(s.substr(key.size() + 1));
      } catch (const std::exception&) {
        return std::nullopt;
      }
  return std::nullopt;
}

}  // namespace

TrainerGroup::TrainerGroup(std::string node_name, std::string work_dir)
    : name_(std::move(node_name)), work_dir_(std::move(work_dir)) {
  process(0);  // a node that never ran a trainer reports local rank 0's empty state
}

TrainerGroup::Process& TrainerGroup::process(size_t local) {
  while (procs_.size() <= local) {
    const size_t l = procs_.size();
    Process p;
    p.checkpoints = std::make_unique<CheckpointHost>();
    CheckpointHost* host = p.checkpoints.get();
    // Local rank 0 keeps the single-process names (its log lines and files), so a node of one
    // process looks as it always did.
    const std::string tag = l == 0 ? "" : "-l" + std::to_string(l);
    p.trainer = std::make_unique<TrainerProcess>(l == 0 ? name_ : name_ + " local rank " + std::to_string(l), work_dir_, tag,
                                                 [host](bool persist) {
                                                   if (persist) host->request();
                                                   host->replicate();
                                                 });
    procs_.push_back(std::move(p));
  }
  return procs_[local];
}

bool TrainerGroup::start(const Launch& l) {
  for (Process& p : procs_) p.trainer->stop();
  nproc_ = static_cast<size_t>(std::max(l.nproc, 1));
  root_.reset();
  exited_ = false;
  const std::optional<int64_t> replica_index = env_int(l.env, "GOODPUT_REPLICA_INDEX");
  bool any = false;
  for (size_t local = 0; local < nproc_; ++local) {
    Process& p = process(local);
    const int32_t lr = static_cast<int32_t>(local);
    p.rank = l.rank_base + lr;
    ckpt::Options co = l.checkpoint;
    co.rank = p.rank;
    co.world_size = l.world;
    p.checkpoints->configure(co);
    // The node's checkpoint size: allocate its shared memory now, while the trainers start up.
    if (l.checkpoint_bytes > 0) p.checkpoints->reserve(std::max<uint64_t>(l.checkpoint_bytes / nproc_, 1));

    const TrainerProcess::Files files = p.trainer->prepare(l.restart);
    std::vector<std::string> env = l.env;
    // torchrun's environment (torch.distributed.elastic's local agent sets these for each worker).
    set_env(env, "RANK", std::to_string(p.rank));
    set_env(env, "LOCAL_RANK", std::to_string(local));
    set_env(env, "GROUP_RANK", std::to_string(l.node_rank));
    set_env(env, "ROLE_RANK", std::to_string(l.role_rank_base + lr));
    set_env(env, "ROLE_NAME", l.role);
    set_env(env, "LOCAL_WORLD_SIZE", std::to_string(nproc_));
    set_env(env, "WORLD_SIZE", std::to_string(l.world));
    set_env(env, "GROUP_WORLD_SIZE", std::to_string(l.nodes));
    set_env(env, "ROLE_WORLD_SIZE", std::to_string(l.role_world));
    set_env(env, "TORCHELASTIC_ERROR_FILE", files.error);
    set_env(env, "TORCHELASTIC_USE_AGENT_STORE", "False");  // rank 0 hosts the store, as init_process_group expects
    set_env(env, "NCCL_ASYNC_ERROR_HANDLING", "1", true);
    if (nproc_ > 1) set_env(env, "OMP_NUM_THREADS", "1", true);  // torchrun's default for several per node
    set_env(env, "GOODPUT_PROGRESS_FILE", files.progress);
    if (replica_index) set_env(env, "GOODPUT_REPLICA_INDEX", std::to_string(*replica_index + lr));
    p.trainer->set_warm(l.warm_preload);
    any |= p.trainer->start(l.restart, p.rank, l.world, files, l.argv, std::move(env), l.limit_mb, l.plain);
  }
  if (any) restart_ = l.restart;  // else the next "run" answer tries again
  return any;
}

void TrainerGroup::stop(bool dump) {
  const bool in_grace = root_ && Steady::now() < kill_at_;
  for (size_t i = 0; i < procs_.size(); ++i)
    if (dump || !in_grace || i >= nproc_) procs_[i].trainer->stop(dump);
}

void TrainerGroup::leave() {
  for (Process& p : procs_) p.trainer->terminate();
  for (int i = 0; i < 100; ++i) {
    bool running = false;
    for (Process& p : procs_) {
      p.trainer->reap();
      running |= p.trainer->running();
    }
    if (!running) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (Process& p : procs_) p.trainer->stop();
}

bool TrainerGroup::reap() {
  bool changed = false;
  for (size_t i = 0; i < nproc_; ++i) {
    if (!procs_[i].trainer->reap()) continue;
    changed = true;
    if (root_ || !procs_[i].trainer->failed() || nproc_ == 1) {
      if (!root_ && procs_[i].trainer->failed()) root_ = i;
      continue;
    }
    root_ = i;
    kill_at_ = Steady::now() + kSiblingGrace;
    log(name_, "local rank " + std::to_string(i) + " (rank " + std::to_string(procs_[i].rank) +
                   ") failed: stopping its " + std::to_string(nproc_ - 1) + " siblings (SIGTERM, SIGKILL after " +
                   std::to_string(kSiblingGrace.count()) + " s)");
    for (size_t j = 0; j < nproc_; ++j)
      if (j != i) procs_[j].trainer->terminate();
  }
  if (root_ && Steady::now() >= kill_at_)
    for (size_t j = 0; j < nproc_; ++j) procs_[j].trainer->kill_group();
  if (!exited_ && restart_ >= 0) {
    bool all = true;
    for (size_t i = 0; i < nproc_; ++i) all &= procs_[i].trainer->exited();
    if (root_ || all) {
      exited_ = true;
      return true;
    }
  }
  return changed && nproc_ > 1;
}

bool TrainerGroup::read_progress() {
  bool urgent = false;
  for (size_t i = 0; i < nproc_; ++i) urgent |= procs_[i].trainer->read_progress();
  return urgent;
}

void TrainerGroup::inject(const std::string& fault) {
  std::string what = fault;
  size_t local = 0;
  if (const auto at = fault.find('@'); at != std::string::npos) {
    what = fault.substr(0, at);
    try {
      local = std::stoul(fault.substr(at + 1));
    } catch (const std::exception&) {
      log(name_, "ignoring fault '" + fault + "': no local rank after '@'");
      return;
    }
  }
  if (what == "dump-stacks") {
    for (size_t i = 0; i < nproc_; ++i) procs_[i].trainer->inject(what);
    return;
  }
  if (local >= nproc_) {
    log(name_, "ignoring fault '" + fault + "': this node runs " + std::to_string(nproc_) + " trainer processes");
    return;
  }
  procs_[local].trainer->inject(what);
}

void TrainerGroup::kill_group() {
  for (Process& p : procs_) p.trainer->kill_group();
}

std::string TrainerGroup::persist_error() const {
  for (size_t i = 0; i < nproc_; ++i)
    if (std::string e = procs_[i].checkpoints->error(); !e.empty())
      return nproc_ == 1 ? e : "local rank " + std::to_string(i) + ": " + e;
  return "";
}

void TrainerGroup::replicate_to(const CheckpointHost::Replication& r) {
  for (size_t i = 0; i < nproc_; ++i) procs_[i].checkpoints->replicate_to(r);
}

std::string TrainerGroup::replica_error() const {
  for (size_t i = 0; i < nproc_; ++i)
    if (std::string e = procs_[i].checkpoints->replica_error(); !e.empty())
      return nproc_ == 1 ? e : "local rank " + std::to_string(i) + ": " + e;
  return "";
}

void TrainerGroup::drain_and_free() {
  for (Process& p : procs_) p.checkpoints->drain();
  for (Process& p : procs_) p.checkpoints->remove_memory();
}

json TrainerGroup::report() const {
  if (nproc_ == 1) {
    json t = procs_[0].trainer->report();
    t["storage_steps"] = procs_[0].checkpoints->storage_steps();
    return t;
  }
  return aggregate();
}

// Several processes as one node: what holds for the node is what holds for its least advanced
// process (a restore needs every rank's checkpoint; a step is done when every rank did it).
json TrainerGroup::aggregate() const {
  std::vector<json> each;
  for (size_t i = 0; i < nproc_; ++i) {
    json r = procs_[i].trainer->report();
    r["storage_steps"] = procs_[i].checkpoints->storage_steps();
    each.push_back(std::move(r));
  }
  const json& first = each[0];
  json t{{"restart", first["restart"]}, {"pid", first["pid"]}, {"processes", nproc_}};
  std::string phase = "exited";
  int64_t step = INT64_MAX, saves = INT64_MAX, saved_step = INT64_MAX, age = 0, blocking = 0;
  bool stopped = false, done = true, all_loaded = true;
  double work = -1, mad = -1;
  std::set<int64_t> storage;
  json loaded;
  for (size_t i = 0; i < each.size(); ++i) {
    const json& r = each[i];
    const bool finished = r.contains("exit") && r["exit"].value("done", false);
    if (!finished && phase_order(r["phase"]) < phase_order(phase)) phase = r["phase"];
    if (!finished) age = std::max(age, r["progress_age_ms"].get<int64_t>());
    step = std::min(step, r["step"].get<int64_t>());
    saves = std::min(saves, r["saves"].get<int64_t>());
    saved_step = std::min(saved_step, r["saved_step"].get<int64_t>());
    blocking = std::max(blocking, r["save_blocking_ns"].get<int64_t>());
    stopped |= r.value("stopped", false);
    done &= r.value("done", false);
    if (r.contains("work_median_s") && r["work_median_s"].get<double>() > work) {
      work = r["work_median_s"];
      mad = r["work_mad_s"];
    }
    const auto steps = r["storage_steps"].get<std::vector<int64_t>>();
    if (i == 0) {
      storage.insert(steps.begin(), steps.end());
    } else {
      std::set<int64_t> kept;
      for (int64_t s : steps)
        if (storage.count(s)) kept.insert(s);
      storage = std::move(kept);
    }
    if (!r.contains("loaded")) {
      all_loaded = false;
    } else if (loaded.is_null()) {
      loaded = r["loaded"];
    } else {
      loaded["step"] = std::min(loaded["step"].get<int64_t>(), r["loaded"]["step"].get<int64_t>());
      loaded["ns"] = std::max(loaded["ns"].get<int64_t>(), r["loaded"]["ns"].get<int64_t>());
    }
  }
  if (exited_) phase = "exited";
  t["phase"] = phase;
  t["step"] = step;
  t["progress_age_ms"] = age;
  t["saves"] = saves;
  t["save_blocking_ns"] = blocking;
  t["saved_step"] = saved_step;
  t["done"] = done;
  t["storage_steps"] = std::vector<int64_t>(storage.begin(), storage.end());
  if (first.contains("stopped") || stopped) t["stopped"] = stopped;
  if (all_loaded && !loaded.is_null()) t["loaded"] = loaded;
  if (first.contains("loss")) t["loss"] = first["loss"];  // rank 0's, as the report shows it
  if (work >= 0) {
    t["work_median_s"] = work;  // the slowest process's: a straggler among them slows the node
    t["work_mad_s"] = mad;
  }
  if (exited_) {
    if (root_) {
      const json& x = each[*root_]["exit"];
      t["exit"] = {{"code", x["code"]},
                   {"signal", x["signal"]},
                   {"reason", ("local rank " + std::to_string(*root_) + " (rank " + std::to_string(procs_[*root_].rank) +
                               "): " + x["reason"].get<std::string>()).substr(0, 2000)},
                   {"done", false},
                   {"age_ms", x["age_ms"]},
                   {"local_rank", *root_},
                   {"rank", procs_[*root_].rank}};
    } else {  // all done
      int64_t youngest = INT64_MAX;
      for (const json& r : each) youngest = std::min(youngest, r["exit"]["age_ms"].get<int64_t>());
      t["exit"] = {{"code", 0}, {"signal", 0}, {"reason", ""}, {"done", true}, {"age_ms", youngest}};
    }
  }
  json ranks = json::array();
  for (size_t i = 0; i < each.size(); ++i) {
    json r{{"local_rank", i}, {"rank", procs_[i].rank}, {"pid", each[i]["pid"]}, {"phase", each[i]["phase"]},
           {"step", each[i]["step"]}, {"progress_age_ms", each[i]["progress_age_ms"]}};
    if (each[i].value("stopped", false)) r["stopped"] = true;
    if (each[i].contains("exit")) {
      r["exit"] = each[i]["exit"];
      r["exit"].erase("age_ms");
      if (root_ && i != *root_) r["collateral"] = true;  // stopped because local rank *root_ failed
    }
    ranks.push_back(std::move(r));
  }
  t["ranks"] = std::move(ranks);
  return t;
}

}  // namespace goodput::agent
