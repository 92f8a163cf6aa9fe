#include "backends/live/job_spec.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/json_reader.h"
#include "policies/policy.h"

namespace goodput::live {

JobStarted JobSpec::job_started() const {
  return JobStarted{job,
                    nodes,
                    accelerators_per_node,
                    step_time,
                    total_steps,
                    checkpoint_bytes_per_node,
                    memory_bandwidth_bytes_per_s,
                    storage_bandwidth_bytes_per_s,
                    policy_name};
}

namespace {
nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open " + what);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(path + ": not valid JSON: " + e.what());
  }
}
ApiLimits read_api_limits(ConfigReader& r) {
  ApiLimits a;
  a.qps = r.number("api_qps", a.qps, 0.1, 100000);
  a.burst = static_cast<int32_t>(r.integer("api_burst", a.burst, 1, 100000));
  a.concurrency = static_cast<int32_t>(r.integer("api_concurrency", a.concurrency, 1, 256));
  return a;
}

RayBackendSpec ray_backend_from_json(const nlohmann::json& j, const std::string& where) {
  ConfigReader r(j, where);
  r.text("type", "");
  RayBackendSpec b;
  b.address = r.text("address", "");
  if (b.address.rfind("http://", 0) != 0 && b.address.rfind("https://", 0) != 0)
    r.fail("address", "is required: the Ray dashboard's URL, e.g. http://head:8265");
  if (const nlohmann::json* h = r.child("headers")) {
    if (!h->is_object()) r.fail("headers", "must be an object of header names to strings");
    for (const auto& [k, v] : h->items()) {
      if (!v.is_string()) r.fail("headers", "value of '" + k + "' must be a string");
      b.headers.emplace_back(k, v.get<std::string>());
    }
  }
  b.num_cpus = r.number("num_cpus", b.num_cpus, 0, 1e6);
  b.num_gpus = r.number("num_gpus", b.num_gpus, 0, 1e6);
  b.memory_mb = r.integer("memory_mb", 0, 0, int64_t{1} << 40);
  if (const nlohmann::json* res = r.child("resources")) {
    if (!res->is_object()) r.fail("resources", "must be an object of resource names to amounts");
    for (const auto& [k, v] : res->items()) {
      if (!v.is_number() || v.get<double>() < 0) r.fail("resources", "amount of '" + k + "' must be a number >= 0");
      b.resources[k] = v.get<double>();
    }
  }
  b.agent = r.text("agent", "");
  b.working_dir = r.text("working_dir", "");
  b.agent_host = r.text("agent_host", "");
  b.master_url = r.text("master_url", "");
  b.pending_timeout = r.duration("pending_timeout", b.pending_timeout);
  b.poll_interval = r.duration("poll_interval", b.poll_interval);
  if (b.pending_timeout <= 0) r.fail("pending_timeout", "must be positive");
  if (b.poll_interval <= 0) r.fail("poll_interval", "must be positive");
  b.api = read_api_limits(r);
  r.finish();
  return b;
}

KubeBackendSpec kube_backend_from_json(const nlohmann::json& j, const std::string& where) {
  ConfigReader r(j, where);
  r.text("type", "");
  KubeBackendSpec b;
  b.kubeconfig = r.text("kubeconfig", "");
  b.context = r.text("context", "");
  b.namespace_ = r.text("namespace", "");
  b.image = r.text("image", "");
  if (b.image.empty()) r.fail("image", "is required: the container image with goodput and the trainer");
  b.agent = r.text("agent", b.agent);
  b.image_pull_policy = r.text("image_pull_policy", "");
  if (!b.image_pull_policy.empty() && b.image_pull_policy != "Always" && b.image_pull_policy != "IfNotPresent" &&
      b.image_pull_policy != "Never")
    r.fail("image_pull_policy", "must be Always, IfNotPresent or Never");
  b.service_account = r.text("service_account", "");
  b.cpu = r.text("cpu", "");
  b.memory_mb = r.integer("memory_mb", 0, 0, int64_t{1} << 40);
  b.gpus = r.integer("gpus", 0, 0, 1024);
  if (const nlohmann::json* ns = r.child("node_selector")) {
    if (!ns->is_object()) r.fail("node_selector", "must be an object of label names to values");
    for (const auto& [k, v] : ns->items()) {
      if (!v.is_string()) r.fail("node_selector", "value of '" + k + "' must be a string");
      b.node_selector[k] = v.get<std::string>();
    }
  }
  if (const nlohmann::json* t = r.child("tolerations")) {
    if (!t->is_array()) r.fail("tolerations", "must be a list of Kubernetes tolerations");
    b.tolerations = *t;
  }
  b.master_url = r.text("master_url", "");
  b.working_dir = r.text("working_dir", "");
  for (const auto& [key, out] : {std::pair{"volumes", &b.volumes}, std::pair{"volume_mounts", &b.volume_mounts}})
    if (const nlohmann::json* v = r.child(key)) {
      if (!v->is_array() || !std::all_of(v->begin(), v->end(), [](const nlohmann::json& x) { return x.is_object(); }))
        r.fail(key, "must be a list of Kubernetes objects");
      *out = *v;
    }
  b.pending_timeout = r.duration("pending_timeout", b.pending_timeout);
  if (b.pending_timeout <= 0) r.fail("pending_timeout", "must be positive");
  b.api = read_api_limits(r);
  b.token_secret = r.text("token_secret", "");
  if (const nlohmann::json* o = r.child("owner_references")) {
    if (!o->is_array() || !std::all_of(o->begin(), o->end(), [](const nlohmann::json& x) {
          return x.is_object() && x.contains("uid") && x["uid"].is_string() && x.contains("kind") && x["kind"].is_string();
        }))
      r.fail("owner_references", "must be a list of Kubernetes ownerReferences (apiVersion, kind, name, uid)");
    b.owner_references = *o;
  }
  r.finish();
  return b;
}

NodeCheckSpec node_check_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw ConfigError("field '" + where + "' must be an object");
  ConfigReader r(j, where);
  NodeCheckSpec c;
  c.enabled = true;
  c.compute = r.duration("compute", c.compute);
  if (c.compute < 10 * kMillisecond || c.compute > 10 * kMinute) r.fail("compute", "must be between 10ms and 10m");
  c.link_bytes = r.integer("link_mib", c.link_bytes >> 20, 1, 4096) << 20;
  c.straggler_factor = r.number("straggler_factor", c.straggler_factor, 1.05, 1000);
  c.round_timeout = r.duration("round_timeout", c.round_timeout);
  if (c.round_timeout < c.compute + kSecond) r.fail("round_timeout", "must be at least compute + 1s");
  if (const nlohmann::json* col = r.child("collective")) {
    if (!col->is_array() || col->empty() ||
        !std::all_of(col->begin(), col->end(), [](const nlohmann::json& x) { return x.is_string(); }))
      r.fail("collective", "must be the probe program's argv, e.g. [\"/usr/bin/python3\", \"-m\", \"goodput.collective_probe\"]");
    for (const auto& a : *col) c.collective.push_back(a.get<std::string>());
  }
  if (const nlohmann::json* f = r.child("faults")) {
    if (!f->is_array()) r.fail("faults", "must be a list of {\"slot\": N, \"fault\": ...}");
    for (size_t i = 0; i < f->size(); ++i) {
      if (!(*f)[i].is_object()) r.fail("faults", "entry " + std::to_string(i) + " must be an object");
      ConfigReader fr((*f)[i], where + ".faults[" + std::to_string(i) + "]");
      const auto slot = static_cast<int32_t>(fr.integer("slot", -1, 0, 4095));
      if (!fr.has("slot")) fr.fail("slot", "is required");
      const std::string fault = fr.text("fault", "");
      if (!valid_check_fault(fault))
        fr.fail("fault", "must be corrupt, link-down or slow:F (F from 1 to 1000)");
      fr.finish();
      c.faults[slot] = fault;
    }
  }
  r.finish();
  return c;
}

// The backend settings a replica group may set for itself: its machines' shape and placement.
const std::vector<std::string>& group_backend_keys(const std::string& backend) {
  static const std::vector<std::string> kube = {"image", "cpu", "memory_mb", "gpus", "node_selector", "tolerations",
                                                "volumes", "volume_mounts"};
  static const std::vector<std::string> ray = {"num_cpus", "num_gpus", "memory_mb", "resources"};
  static const std::vector<std::string> none;
  return backend == "kubernetes" ? kube : backend == "ray" ? ray : none;
}

// "replicas": [{"type": "ps", "count": 2, "command": [...], "env": {...}, "backend": {...}}, ...]
std::vector<ReplicaGroup> replicas_from_json(const nlohmann::json& j, const std::string& where, const JobSpec& s,
                                             const nlohmann::json& backend) {
  if (!j.is_array() || j.empty()) throw ConfigError("field '" + where + "' must be a non-empty list of replica groups");
  static const std::vector<std::string> order = {"chief", "ps", "worker"};
  std::vector<ReplicaGroup> groups;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!j[i].is_object()) throw ConfigError("field '" + at + "' must be an object");
    ConfigReader r(j[i], at);
    ReplicaGroup g;
    g.type = r.text("type", "");
    if (std::find(order.begin(), order.end(), g.type) == order.end()) r.fail("type", "must be chief, ps or worker");
    for (const ReplicaGroup& other : groups)
      if (other.type == g.type) r.fail("type", "'" + g.type + "' is given twice: one group per type");
    g.count = static_cast<int32_t>(r.integer("count", 1, 1, kMaxNodes));
    g.nproc_per_node = static_cast<int32_t>(r.integer("nproc_per_node", s.nproc_per_node, 1, 1024));
    if (g.type == "chief" && g.count != 1) r.fail("count", "must be 1: a job has one chief");
    g.command = s.command;
    if (const nlohmann::json* cmd = r.child("command")) {
      if (!cmd->is_array() || cmd->empty() ||
          !std::all_of(cmd->begin(), cmd->end(), [](const nlohmann::json& a) { return a.is_string(); }))
        r.fail("command", "must be the group's argv, a non-empty list of strings");
      g.command = cmd->get<std::vector<std::string>>();
    }
    g.env = s.env;
    if (const nlohmann::json* env = r.child("env")) {
      if (!env->is_object()) r.fail("env", "must be an object of strings");
      for (const auto& [k, v] : env->items()) {
        if (!v.is_string()) r.fail("env", "value of '" + k + "' must be a string");
        g.env[k] = v.get<std::string>();
      }
    }
    g.kube = s.kube;
    g.ray = s.ray;
    if (const nlohmann::json* over = r.child("backend")) {
      const auto& keys = group_backend_keys(s.backend);
      if (keys.empty()) r.fail("backend", "is for jobs on ray or kubernetes: a local node has no shape to set");
      if (!over->is_object()) r.fail("backend", "must be an object");
      nlohmann::json merged = backend;
      for (const auto& [k, v] : over->items()) {
        if (std::find(keys.begin(), keys.end(), k) == keys.end()) {
          std::string known;
          for (const auto& key : keys) known += (known.empty() ? "" : ", ") + key;
          throw ConfigError("field '" + at + ".backend." + k + "' cannot differ between replica groups (these can: " +
                            known + ")");
        }
        merged[k] = v;
      }
      if (s.backend == "kubernetes") g.kube = kube_backend_from_json(merged, at + ".backend");
      else g.ray = ray_backend_from_json(merged, at + ".backend");
      g.kube.kubeconfig = s.kube.kubeconfig;  // already resolved against the spec's folder
    }
    r.finish();
    groups.push_back(std::move(g));
  }
  if (std::none_of(groups.begin(), groups.end(), [](const ReplicaGroup& g) { return g.type != "ps"; }))
    throw ConfigError("field '" + where + "' needs a chief or worker group: parameter servers alone do not train");
  std::sort(groups.begin(), groups.end(), [&](const ReplicaGroup& a, const ReplicaGroup& b) {
    return std::find(order.begin(), order.end(), a.type) < std::find(order.begin(), order.end(), b.type);
  });
  int32_t slot = 0;
  for (ReplicaGroup& g : groups) {
    g.first_slot = slot;
    slot += g.count;
  }
  return groups;
}

}  // namespace

const ReplicaGroup& replica_group(const std::vector<ReplicaGroup>& groups, int32_t slot) {
  for (const ReplicaGroup& g : groups)
    if (slot >= g.first_slot && slot < g.first_slot + g.count) return g;
  return groups.back();
}

nlohmann::json replica_counts(const std::vector<ReplicaGroup>& groups, int32_t world) {
  nlohmann::json out = nlohmann::json::object();
  for (const ReplicaGroup& g : groups)
    out[g.type] = std::clamp(world - g.first_slot, 0, &g == &groups.back() ? world : g.count);
  return out;
}

nlohmann::json process_counts(const std::vector<ReplicaGroup>& groups, nlohmann::json counts) {
  for (const ReplicaGroup& g : groups)
    if (const auto it = counts.find(g.type); it != counts.end() && it->is_number_integer())
      *it = it->get<int64_t>() * g.nproc_per_node;
  return counts;
}

int32_t first_process(const std::vector<ReplicaGroup>& groups, int32_t slot) {
  int32_t ranks = 0;
  for (const ReplicaGroup& g : groups)
    ranks += std::clamp(slot - g.first_slot, 0, &g == &groups.back() ? std::max(slot, 0) : g.count) * g.nproc_per_node;
  return ranks;
}

std::vector<ReplicaGroup> JobSpec::workers_only() const {
  ReplicaGroup g;
  g.count = nodes;
  g.nproc_per_node = nproc_per_node;
  g.command = command;
  g.env = env;
  g.kube = kube;
  g.ray = ray;
  return {g};
}

int32_t JobSpec::fixed_slots() const {
  int32_t n = 0;
  for (const ReplicaGroup& g : replicas)
    if (g.type != "worker") n += g.count;
  return n;
}

JobSpec job_spec_from_json(const nlohmann::json& j, const std::string& where, const std::string& base_dir) {
  if (!j.is_object()) throw ConfigError("a job spec must be a JSON object");
  ConfigReader r(j, where);
  JobSpec s;
  s.job = r.text("job", "");
  if (s.job.empty()) r.fail("job", "is required (a name for the job)");
  for (char c : s.job)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      r.fail("job", "may hold only letters, digits, '-', '_' and '.' (it names files and shared memory)");
  s.nodes = static_cast<int32_t>(r.integer("nodes", 1, 1, kMaxNodes));
  const nlohmann::json* cmd = r.child("command");
  if (cmd || !j.contains("replicas")) {  // with replica groups, each may bring its own instead
    if (!cmd || !cmd->is_array() || cmd->empty()) r.fail("command", "is required: the trainer's argv, a list of strings");
    for (const auto& a : *cmd) {
      if (!a.is_string()) r.fail("command", "must hold only strings");
      s.command.push_back(a.get<std::string>());
    }
  }
  if (const nlohmann::json* env = r.child("env")) {
    if (!env->is_object()) r.fail("env", "must be an object of strings");
    for (const auto& [k, v] : env->items()) {
      if (!v.is_string()) r.fail("env", "value of '" + k + "' must be a string");
      s.env[k] = v.get<std::string>();
    }
  }
  s.total_steps = r.integer("total_steps", 0, 1, INT64_MAX / 2);
  if (!r.has("total_steps")) r.fail("total_steps", "is required");
  s.step_time = r.duration("step_time", s.step_time);
  if (s.step_time <= 0) r.fail("step_time", "must be positive");
  s.nproc_per_node = static_cast<int32_t>(r.integer("nproc_per_node", 1, 1, 1024));
  if (const nlohmann::json* pre = r.child("preload")) {
    // Module names only: they go on an interpreter's command line.
    auto module_name = [](const nlohmann::json& m) {
      if (!m.is_string() || m.get_ref<const std::string&>().empty()) return false;
      const std::string& n = m.get_ref<const std::string&>();
      if (n.size() > 200 || n.front() == '.' || n.back() == '.' || std::isdigit(static_cast<unsigned char>(n.front())))
        return false;
      return std::all_of(n.begin(), n.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; });
    };
    if (!pre->is_array() || pre->size() > 64 || !std::all_of(pre->begin(), pre->end(), module_name))
      r.fail("preload", "must be a list of Python module names (what a warm interpreter imports; [] for none)");
    s.preload = pre->get<std::vector<std::string>>();
  }
  s.role = r.text("role", s.role);
  s.trainer_reports = r.boolean("trainer_reports", true);
  if (s.role.empty() || s.role.size() > 63) r.fail("role", "must be 1 to 63 characters");
  // A node failure costs all its processes' accelerators: by default, one per process.
  s.accelerators_per_node = static_cast<int32_t>(r.integer("accelerators_per_node", s.nproc_per_node, 1, 1024));
  s.checkpoint_bytes_per_node = r.integer("checkpoint_bytes_per_node", 0, 0, INT64_MAX / 2);
  s.memory_bandwidth_bytes_per_s = r.integer("memory_bandwidth_bytes_per_s", s.memory_bandwidth_bytes_per_s, 1, INT64_MAX / 2);
  s.storage_bandwidth_bytes_per_s = r.integer("storage_bandwidth_bytes_per_s", s.storage_bandwidth_bytes_per_s, 1, INT64_MAX / 2);
  if (const nlohmann::json* p = r.child("policy")) {
    std::string source;  // for messages: where the policy came from
    if (p->is_string()) {
      std::filesystem::path path(p->get<std::string>());
      if (path.is_relative()) path = std::filesystem::path(base_dir) / path;
      s.policy = read_json_file(path.string(), "policy file");
      s.policy_name = path.stem().string();
      source = "policy file " + path.lexically_normal().string();
    } else if (p->is_object()) {
      s.policy = *p;
      s.policy_name = p->value("name", std::string("inline"));
      source = "inline policy (field 'policy')";
    } else {
      r.fail("policy", "must be a policy file path or a policy object");
    }
    // Checked now, before anything of the run is written, and named by where it came from.
    PolicySet policies;
    try {
      policies = load_policy(s.policy);
    } catch (const PolicyError& e) {
      throw ConfigError(source + ": " + e.what());
    }
    // What the simulator models and the live side does not do yet is refused, not silently ignored.
    s.warm_start = policies.recovery->warm_start();
    if (policies.scaling->warm_spares() > 0)
      throw ConfigError(source + ": field 'scaling.warm_spares' is for the simulator so far: live, the job spec's "
                                 "\"spares\" keeps that many nodes registered and idle beside the world");
  }
  s.storage_dir = r.text("storage_dir", "");
  s.data_shards = r.integer("data_shards", 0, 0, 100'000'000);
  s.spares = static_cast<int32_t>(r.integer("spares", 0, 0, 10'000));
  s.memory_limit_mb = r.integer("memory_limit_mb", 0, 0, 1 << 30);
  s.replica_mb_per_s = r.number("replica_mb_per_s", s.replica_mb_per_s, 0, 1e7);
  s.heartbeat_interval = r.duration("heartbeat_interval", s.heartbeat_interval);
  s.heartbeat_timeout = r.duration("heartbeat_timeout", s.heartbeat_timeout);
  s.hang_timeout = r.duration("hang_timeout", s.hang_timeout);
  s.join_timeout = r.duration("join_timeout", s.join_timeout);
  if (s.join_timeout < kSecond) r.fail("join_timeout", "must be at least 1s");
  s.failure_settle = r.duration("failure_settle", s.failure_settle);
  const std::string hang_action = r.text("hang_action", "recover");
  if (hang_action == "report") s.hang_action = JobSpec::HangAction::Report;
  else if (hang_action != "recover") r.fail("hang_action", "must be \"recover\" or \"report\"");
  s.stall_after = r.duration("stall_after", s.stall_after);
  if (s.stall_after < 0) r.fail("stall_after", "must not be negative");
  s.straggler_factor = r.number("straggler_factor", s.straggler_factor, 0, 1000);
  if (s.straggler_factor > 0 && s.straggler_factor < 1.05) r.fail("straggler_factor", "must be 0 (off) or above 1.05");
  if (const nlohmann::json* c = r.child("node_check"))
    s.node_check = node_check_from_json(*c, (where.empty() ? "" : where + ".") + "node_check");
  const nlohmann::json* backend_json = r.child("backend");
  if (const nlohmann::json* b = backend_json) {
    const std::string at = (where.empty() ? "" : where + ".") + "backend";
    const nlohmann::json* type = b->is_object() && b->contains("type") ? &(*b)["type"] : nullptr;
    if (*b == "local") s.backend = "local";
    else if (type && *type == "ray") {
      s.backend = "ray";
      s.ray = ray_backend_from_json(*b, at);
    } else if (type && *type == "kubernetes") {
      s.backend = "kubernetes";
      s.kube = kube_backend_from_json(*b, at);
      // A kubeconfig path is relative to the spec, like the policy's.
      if (!s.kube.kubeconfig.empty() && std::filesystem::path(s.kube.kubeconfig).is_relative())
        s.kube.kubeconfig = (std::filesystem::path(base_dir) / s.kube.kubeconfig).string();
    } else {
      r.fail("backend", "must be \"local\", {\"type\": \"ray\", \"address\": \"http://head:8265\", ...} or "
                        "{\"type\": \"kubernetes\", \"image\": ..., ...}");
    }
  }
  if (const nlohmann::json* groups = r.child("replicas")) {
    s.replicas = replicas_from_json(*groups, (where.empty() ? "" : where + ".") + "replicas", s,
                                    backend_json && backend_json->is_object() ? *backend_json : nlohmann::json::object());
    for (const ReplicaGroup& g : s.replicas)
      if (g.command.empty())
        r.fail("command", "is required: the trainer's argv, unless every replica group has its own (the " + g.type +
                              " group has none)");
    const int32_t total = s.replicas.back().first_slot + s.replicas.back().count;
    if (r.has("nodes") && s.nodes != total)
      r.fail("nodes", "is " + std::to_string(s.nodes) + " but the replica groups add up to " + std::to_string(total) +
                          " (leave it out: it follows from them)");
    if (total > kMaxNodes) r.fail("replicas", "add up to " + std::to_string(total) + " nodes; at most " + std::to_string(kMaxNodes));
    s.nodes = total;
  } else {
    s.replicas = s.workers_only();
  }
  // Scaling gives up workers only: it must leave the chief and parameter servers a worker to serve.
  if (const int32_t fixed = s.fixed_slots(); fixed > 0 && s.policy.is_object())
    if (const auto sc = s.policy.find("scaling"); sc != s.policy.end() && sc->is_object() &&
                                                   sc->contains("policy") && (*sc)["policy"] == "elastic") {
      const auto m = sc->find("min_nodes");
      const int64_t min_nodes = m != sc->end() && m->is_number_integer() ? m->get<int64_t>() : 1;
      if (min_nodes <= fixed)
        r.fail("policy", "scales elastically down to min_nodes " + std::to_string(min_nodes) + ", but the chief and " +
                             "parameter servers hold " + std::to_string(fixed) + " slots that scaling never gives up: " +
                             "set scaling.min_nodes to at least " + std::to_string(fixed + 1));
    }
  if (s.heartbeat_interval <= 0) r.fail("heartbeat_interval", "must be positive");
  if (s.heartbeat_timeout < 2 * s.heartbeat_interval) r.fail("heartbeat_timeout", "must be at least twice heartbeat_interval");
  if (s.hang_timeout < s.heartbeat_timeout) r.fail("hang_timeout", "must be at least heartbeat_timeout");
  r.finish();
  return s;
}

bool valid_check_fault(const std::string& fault) {
  if (fault == "corrupt" || fault == "link-down") return true;
  if (fault.rfind("slow:", 0) != 0) return false;
  try {
    size_t used = 0;
    const double factor = std::stod(fault.substr(5), &used);
    return used == fault.size() - 5 && factor >= 1 && factor <= 1000;
  } catch (const std::exception&) {
    return false;
  }
}

JobSpec load_job_spec(const std::string& path) {
  const nlohmann::json j = read_json_file(path, "job spec");
  const std::string base = std::filesystem::path(path).parent_path().string();
  try {
    return job_spec_from_json(j, "", base.empty() ? "." : base);
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

}  // namespace goodput::live
