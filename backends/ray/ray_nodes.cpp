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
    : ClusterNodes({"ray", "Ray node", "node"}, options.replicas, false, options.spec.api),
      o_(std::move(options)),
      client_(o_.spec.address, o_.spec.headers, o_.retry) {
  start_worker();
}

RayNodes::~RayNodes() { stop_worker(); }

std::string RayNodes::submission_id(const std::string& name) const {
  std::string id = "goodput-" + o_.run + "-" + name;
  for (char& c : id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) c = '_';
  return id;
}

void RayNodes::launch(int32_t slot, int32_t memory_permille) {
  std::lock_guard lock(mu_);
  queue({Command::Create, "", memory_permille, slot});
}

void RayNodes::prepare(Command& c) {
  if (c.kind != Command::Create || !c.name.empty()) return;
  // Named when carried out, so names continue after any this run adopted.
  c.name = "ray-" + std::to_string(counter_++);
  RayJobNode& t = members_[c.name];
  t.name = c.name;
  t.memory_permille = c.memory_permille;
  t.slot = c.slot;
}

std::chrono::steady_clock::duration RayNodes::idle_every() const { return std::chrono::nanoseconds(o_.spec.poll_interval); }

SubmitRequest RayNodes::request_for(const RayJobNode& t) const {
  const live::ReplicaGroup* g = groups_.empty() ? nullptr : &live::replica_group(groups_, t.slot);
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

void RayNodes::end(RayJobNode& t, std::string reason, bool fatal) {
  t.ended = true;
  report(t.name, t, std::move(reason), fatal);
}

std::pair<std::string, std::string> RayNodes::pinned_node() const {
  if (excluded_.empty()) return {};
  // Spread over the alive nodes not excluded: workers before the head, fewest of this run's nodes
  // first, counting where they run or, until a poll says so, where they were pinned (submissions
  // made between two polls, several at a time, must not all pick the same node).
  std::map<std::string, int> ours;
  for (const auto& [name, t] : members_)
    if (!t.ended && (!t.machine.empty() || !t.pinned.empty())) ++ours[t.machine.empty() ? t.pinned : t.machine];
  const RayNode* best = nullptr;
  auto key = [&](const RayNode& n) { return std::make_tuple(n.is_head_node, ours[n.node_id], n.node_ip); };
  for (const RayNode& n : cluster_)
    if (n.state == "ALIVE" && !excluded_.count(n.node_id) && !n.node_ip.empty() && (!best || key(n) < key(*best)))
      best = &n;
  if (!best) std::cerr << "goodput: ray: every alive Ray node is excluded; submitting without a pin\n";
  if (!best) return {};
  return {best->node_ip, best->node_id};
}

bool RayNodes::carry_out(const Command& c) {
  if (c.kind == Command::Relabel) return true;  // Ray jobs carry no rank label
  try {
    if (c.kind == Command::Create) {
      SubmitRequest r;
      {
        std::lock_guard lock(mu_);
        r = request_for(members_.at(c.name));
        if (const auto [ip, id] = pinned_node(); !ip.empty()) {
          r.resources["node:" + ip] = 0.001;
          members_.at(c.name).pinned = id;
        }
      }
      client_.submit(r);
      std::lock_guard lock(mu_);
      members_[c.name].submitted = true;
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
    if (c.kind == Command::Create) end(members_[c.name], std::string("Ray refused the node's job: ") + e.what(), true);
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
        RayJobNode& t = members_[name];
        t.name = name;
        t.submitted = true;
        t.status = j.status;
      }
      return;
    } catch (const RayError& e) {
      std::cerr << "goodput: ray: cannot list this run's jobs yet: " << e.what() << "\n";
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, std::chrono::seconds(1), [&] { return quit_.load(); })) return;
    }
  }
}

void RayNodes::poll() {
  // Only nodes submitted before the list was asked for can be judged by it: a submission that a
  // worker makes meanwhile may be missing from it without being gone.
  std::set<std::string> submitted;
  {
    std::lock_guard lock(mu_);
    for (const auto& [name, t] : members_)
      if (t.submitted) submitted.insert(name);
  }
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
    for (auto& [name, t] : members_) {
      if (!submitted.contains(name) || t.ended) continue;
      const auto it = by_id.find(submission_id(name));
      if (it == by_id.end()) {
        end(t, "Ray job " + submission_id(name) + " is gone from the cluster");
        continue;
      }
      const RayJob& j = *it->second;
      if (!j.driver_node_id.empty()) t.machine = j.driver_node_id;
      if (j.status == "PENDING" && t.status != "PENDING") t.pending_since = now;
      if (j.status != t.status) status_changed("ray_job", name, j.status + " (" + j.submission_id + ")");
      t.status = j.status;
      const auto d = dead.find(j.driver_node_id);
      if (d != dead.end()) {
        const RayNode& n = *d->second;
        end(t, "Ray node " + n.node_ip + " (" + n.node_id.substr(0, 12) + ") is DEAD: " + n.state_message);
        if (!j.terminal()) queue({Command::Delete, name, 0, -1});
      } else if (j.status == "FAILED") {
        failed.push_back(name);
      } else if (j.status == "STOPPED") {
        // Not by this master (its own stops are not reported): a user's `ray job stop`.
        end(t, "Ray job " + j.submission_id + " STOPPED by someone else: stopped by an operator (" + j.message + ")");
      } else if (j.terminal()) {
        end(t, "Ray job " + j.submission_id + " " + j.status + ": " + j.message);
      } else if (j.status == "PENDING" && now - t.pending_since > std::chrono::nanoseconds(o_.spec.pending_timeout)) {
        end(t, "Ray job " + j.submission_id + " still PENDING after " + seconds(now - t.pending_since) +
                      ": no node has the resources it asks for");
        queue({Command::Delete, name, 0, -1});
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
    end(members_[name], std::move(reason));
  }
  cv_.notify_all();
}

void RayNodes::on_start() {
  try {
    std::cerr << "goodput: ray: dashboard " << o_.spec.address << " runs Ray " << client_.ray_version() << "\n";
  } catch (const RayError& e) {
    std::cerr << "goodput: ray: " << e.what() << " (submissions wait for it)\n";
  }
  if (o_.adopt) {
    adopt();
    o_.adopt = false;
  }
}

}  // namespace goodput::ray
