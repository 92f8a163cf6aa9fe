#include "backends/ray/ray_nodes.h"

#include <cmath>
#include <tuple>
#include <iostream>

namespace goodput::ray {

namespace {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string tail(const std::string& s, size_t n) { return s.size() <= n ? s : "..." + s.substr(s.size() - n); }

std::string seconds(std::chrono::steady_clock::duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(d).count()) + " s";
}

}  // namespace

RayNodes::RayNodes(RayNodesOptions options)
    : o_(std::move(options)), client_(o_.spec.address, o_.spec.headers, o_.retry) {
  worker_ = std::thread([this] { loop(); });
}

RayNodes::~RayNodes() {
  {
    std::lock_guard lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::string RayNodes::submission_id(const std::string& name) const {
  std::string id = "goodput-" + o_.run + "-" + name;
  for (char& c : id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) c = '_';
  return id;
}

void RayNodes::set_layout(const std::vector<live::ReplicaGroup>& groups) {
  std::lock_guard lock(mu_);
  o_.replicas = groups;
}

void RayNodes::launch(int32_t slot, int32_t memory_permille) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back({Command::Submit, "", memory_permille, slot});
  }
  cv_.notify_all();
}

void RayNodes::terminate(const std::string& name) {
  {
    std::lock_guard lock(mu_);
    auto it = nodes_.find(name);
    if (it == nodes_.end()) return;
    it->second.stopping = true;
    queue_.push_back({Command::Stop, name, 0, -1});
  }
  cv_.notify_all();
}

std::vector<StatusObserved> RayNodes::status_changes() {
  std::lock_guard lock(mu_);
  return std::exchange(changes_, {});
}

std::vector<live::LostNode> RayNodes::lost() {
  std::lock_guard lock(mu_);
  return std::exchange(lost_, {});
}

void RayNodes::shut_down(int timeout_ms) {
  // Agents leave on their own once the master says the job is over; their Ray jobs then succeed.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto all_ended = [&] {
    for (const auto& [name, t] : nodes_)
      if (!t.ended && !t.stopping) return false;
    return true;
  };
  {
    std::unique_lock lock(mu_);
    cv_.wait_until(lock, until, [&] { return all_ended(); });
    for (auto& [name, t] : nodes_)
      if (!t.ended && !t.stopping) {
        t.stopping = true;
        queue_.push_back({Command::Stop, name, 0, -1});
      }
    cv_.notify_all();
    // Let the worker carry out the stops (bounded: a dashboard that is gone cannot be helped).
    cv_.wait_until(lock, std::chrono::steady_clock::now() + std::chrono::seconds(10), [&] { return queue_.empty(); });
    quit_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

SubmitRequest RayNodes::request_for(const Tracked& t) const {
  const live::ReplicaGroup* g = o_.replicas.empty() ? nullptr : &live::replica_group(o_.replicas, t.slot);
  const live::RayBackendSpec& s = o_.spec;
  const live::RayBackendSpec& shape = g ? g->ray : o_.spec;  // what the node's Ray job asks for
  SubmitRequest r;
  r.submission_id = submission_id(t.name);
  if (!s.working_dir.empty()) r.entrypoint = "cd " + shell_quote(s.working_dir) + " && ";
  r.entrypoint += "exec " + shell_quote(o_.agent_binary) + " agent --master " + shell_quote(o_.master_url) + " --name " +
                 shell_quote(t.name) + " --memory-permille " + std::to_string(t.memory_permille) + " --slot " +
                 std::to_string(t.slot);
  if (!s.agent_host.empty()) r.entrypoint += " --host " + shell_quote(s.agent_host);
  // The token travels in the job's environment, never in its command line.
  r.env_vars["GOODPUT_TOKEN"] = o_.token;
  if (const char* ca = std::getenv("GOODPUT_CA_FILE"); ca && *ca) r.env_vars["GOODPUT_CA_FILE"] = ca;
  r.metadata = {{"goodput_run", o_.run}, {"goodput_node", t.name}, {"goodput_rank", std::to_string(t.slot)},
                {"goodput_replica_type", g ? g->type : "worker"}};
  r.num_cpus = shape.num_cpus;
  r.num_gpus = shape.num_gpus;
  r.memory_bytes =
      static_cast<int64_t>(std::llround(static_cast<double>(shape.memory_mb) * (1 << 20) * t.memory_permille / 1000.0));
  r.resources = shape.resources;
  return r;
}

void RayNodes::report(Tracked& t, std::string reason, bool fatal) {
  t.ended = true;
  if (t.stopping) return;
  lost_.push_back({t.name, std::move(reason), fatal});
}

void RayNodes::exclude(const std::string& name) {
  std::lock_guard lock(mu_);
  const auto it = nodes_.find(name);
  if (it == nodes_.end() || it->second.ray_node.empty()) {
    std::cerr << "goodput: ray: cannot keep later nodes off " << name << "'s machine: Ray never said where it ran\n";
    return;
  }
  excluded_.insert(it->second.ray_node);
  std::cerr << "goodput: ray: Ray node " << it->second.ray_node.substr(0, 12) << " (" << name
            << "'s) is excluded: later nodes are pinned to other nodes\n";
}

std::string RayNodes::pinned_node_ip() const {
  if (excluded_.empty()) return "";
  // Spread over the alive nodes not excluded: workers before the head, fewest of this run's nodes first.
  std::map<std::string, int> ours;
  for (const auto& [name, t] : nodes_)
    if (!t.ended && !t.ray_node.empty()) ++ours[t.ray_node];
  const RayNode* best = nullptr;
  auto key = [&](const RayNode& n) { return std::make_tuple(n.is_head_node, ours[n.node_id], n.node_ip); };
  for (const RayNode& n : cluster_)
    if (n.state == "ALIVE" && !excluded_.count(n.node_id) && !n.node_ip.empty() && (!best || key(n) < key(*best)))
      best = &n;
  if (!best) std::cerr << "goodput: ray: every alive Ray node is excluded; submitting without a pin\n";
  return best ? best->node_ip : "";
}

bool RayNodes::run_command(const Command& c) {
  try {
    if (c.kind == Command::Submit) {
      SubmitRequest r;
      {
        std::lock_guard lock(mu_);
        r = request_for(nodes_.at(c.name));
        if (const std::string ip = pinned_node_ip(); !ip.empty()) r.resources["node:" + ip] = 0.001;
      }
      client_.submit(r);
      std::lock_guard lock(mu_);
      nodes_[c.name].submitted = true;
    } else {
      client_.stop(submission_id(c.name));
    }
    return true;
  } catch (const RayError& e) {
    if (e.retryable) {
      std::cerr << "goodput: ray: " << e.what() << " (will try again)\n";
      return false;
    }
    // Refused for good: a submission Ray rejects (4xx) is a configuration error that trying again
    // cannot fix; a stop of a job Ray does not know needs nothing more.
    std::cerr << "goodput: ray: " << e.what() << "\n";
    std::lock_guard lock(mu_);
    if (c.kind == Command::Submit) report(nodes_[c.name], std::string("Ray refused the node's job: ") + e.what(), true);
    return true;
  }
}

void RayNodes::adopt() {
  for (;;) {
    try {
      for (const RayJob& j : client_.jobs()) {
        auto meta = [&](const char* key) {
          const auto it = j.metadata.find(key);
          return it != j.metadata.end() && it->is_string() ? it->get<std::string>() : std::string();
        };
        if (meta("goodput_run") != o_.run) continue;
        const std::string name = meta("goodput_node");
        if (name.rfind("ray-", 0) != 0) continue;
        std::lock_guard lock(mu_);
        counter_ = std::max(counter_, std::atoi(name.c_str() + 4) + 1);
        if (j.terminal()) continue;
        Tracked& t = nodes_[name];
        t.name = name;
        t.submitted = true;
        t.status = j.status;
      }
      return;
    } catch (const RayError& e) {
      std::cerr << "goodput: ray: cannot list this run's jobs yet: " << e.what() << "\n";
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, std::chrono::seconds(1), [&] { return quit_; })) return;
    }
  }
}

void RayNodes::poll() {
  std::vector<RayJob> jobs;
  std::vector<RayNode> cluster;
  try {
    jobs = client_.jobs();
    cluster = client_.nodes();
    if (dashboard_down_) std::cerr << "goodput: ray: the dashboard answers again\n";
    dashboard_down_ = false;
  } catch (const RayError& e) {
    // Not a node loss: the agents' heartbeats tell the master whether the nodes still work.
    if (!dashboard_down_) std::cerr << "goodput: ray: cannot read the cluster's state: " << e.what() << "\n";
    dashboard_down_ = true;
    return;
  }
  std::map<std::string, const RayJob*> by_id;
  for (const RayJob& j : jobs) by_id[j.submission_id] = &j;
  std::map<std::string, const RayNode*> dead;
  for (const RayNode& n : cluster)
    if (n.state == "DEAD") dead[n.node_id] = &n;

  std::vector<std::string> failed;  // their logs are read outside the lock
  {
    std::lock_guard lock(mu_);
    cluster_ = cluster;
    const auto now = std::chrono::steady_clock::now();
    for (auto& [name, t] : nodes_) {
      if (!t.submitted || t.ended) continue;
      const auto it = by_id.find(submission_id(name));
      if (it == by_id.end()) {
        report(t, "Ray job " + submission_id(name) + " is gone from the cluster");
        continue;
      }
      const RayJob& j = *it->second;
      if (!j.driver_node_id.empty()) t.ray_node = j.driver_node_id;
      if (j.status == "PENDING" && t.status != "PENDING") t.pending_since = now;
      if (j.status != t.status) changes_.push_back({"ray_job", name, j.status + " (" + j.submission_id + ")"});
      t.status = j.status;
      const auto d = dead.find(j.driver_node_id);
      if (d != dead.end()) {
        const RayNode& n = *d->second;
        report(t, "Ray node " + n.node_ip + " (" + n.node_id.substr(0, 12) + ") is DEAD: " + n.state_message);
        if (!j.terminal()) queue_.push_back({Command::Stop, name, 0, -1});
      } else if (j.status == "FAILED") {
        failed.push_back(name);
      } else if (j.status == "STOPPED") {
        // Not by this master (its own stops are not reported): a user's `ray job stop`.
        report(t, "Ray job " + j.submission_id + " STOPPED by someone else: stopped by an operator (" + j.message + ")");
      } else if (j.terminal()) {
        report(t, "Ray job " + j.submission_id + " " + j.status + ": " + j.message);
      } else if (j.status == "PENDING" && now - t.pending_since > std::chrono::nanoseconds(o_.spec.pending_timeout)) {
        report(t, "Ray job " + j.submission_id + " still PENDING after " + seconds(now - t.pending_since) +
                      ": no node has the resources it asks for");
        queue_.push_back({Command::Stop, name, 0, -1});
      }
    }
  }
  for (const std::string& name : failed) {
    const std::string id = submission_id(name);
    const RayJob& j = *by_id[id];
    std::string logs;
    try {
      logs = client_.logs(id);
    } catch (const RayError& e) {
      logs = std::string("(logs unavailable: ") + e.what() + ")";
    }
    // The message and the log's tail are what the diagnosis table reads (OOM, NCCL, Xid...).
    std::string reason = "Ray job " + id + " FAILED";
    if (!j.error_type.empty()) reason += " (" + j.error_type + ")";
    reason += ": " + tail(j.message, 1000);
    if (!logs.empty()) reason += "\nlog tail:\n" + tail(logs, 2000);
    std::lock_guard lock(mu_);
    report(nodes_[name], std::move(reason));
  }
  cv_.notify_all();
}

void RayNodes::loop() {
  // Nothing may escape this thread (std::terminate would take the master down with it).
  while (true) {
    try {
      work();
      return;
    } catch (const std::exception& e) {
      std::cerr << "goodput: ray: unexpected error, carrying on: " << e.what() << "\n";
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, std::chrono::seconds(1), [&] { return quit_; })) return;
    }
  }
}

void RayNodes::work() {
  try {
    std::cerr << "goodput: ray: dashboard " << o_.spec.address << " runs Ray " << client_.ray_version() << "\n";
  } catch (const RayError& e) {
    std::cerr << "goodput: ray: " << e.what() << " (submissions wait for it)\n";
  }
  if (o_.adopt) {
    adopt();
    o_.adopt = false;
  }
  auto next_poll = std::chrono::steady_clock::now();
  for (;;) {
    std::optional<Command> c;
    {
      std::unique_lock lock(mu_);
      cv_.wait_until(lock, next_poll, [&] { return quit_ || !queue_.empty(); });
      if (quit_) return;
      if (!queue_.empty()) {
        c = queue_.front();
        if (c->kind == Command::Submit && c->name.empty()) {
          // Named when carried out, so names continue after any this run adopted.
          c->name = queue_.front().name = "ray-" + std::to_string(counter_++);
          Tracked& t = nodes_[c->name];
          t.name = c->name;
          t.memory_permille = c->memory_permille;
          t.slot = c->slot;
        }
      }
    }
    if (c) {
      const bool done = run_command(*c);
      std::lock_guard lock(mu_);
      if (done) queue_.pop_front();
      cv_.notify_all();
      if (!done) next_poll = std::min(next_poll, std::chrono::steady_clock::now() + std::chrono::seconds(1));
      if (done) continue;
    }
    if (std::chrono::steady_clock::now() >= next_poll) {
      poll();
      next_poll = std::chrono::steady_clock::now() + std::chrono::nanoseconds(o_.spec.poll_interval);
    } else if (c) {
      // The dashboard refused a command for now: wait for the next poll before trying again.
      std::unique_lock lock(mu_);
      cv_.wait_until(lock, next_poll, [&] { return quit_; });
    }
  }
}

}  // namespace goodput::ray
