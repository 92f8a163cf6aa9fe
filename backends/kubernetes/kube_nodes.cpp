#include "backends/kubernetes/kube_nodes.h"

#include <algorithm>
#include <chrono>
#include <iostream>

#include "backends/kubernetes/kube_json.h"

namespace goodput::kube {

using nlohmann::json;

namespace {

const std::set<std::string> kConfigErrors = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                                             "CreateContainerConfigError", "ErrImageNeverPull"};

std::string dns_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out += std::isalnum(static_cast<unsigned char>(l)) ? l : '-';
  }
  while (!out.empty() && out.front() == '-') out.erase(0, 1);
  return out.substr(0, 40);
}

}  // namespace

std::string describe_termination(const json& terminated) {
  std::string s = "reason=" + str(terminated, "reason", "?") + " exitCode=" + std::to_string(num(terminated, "exitCode"));
  if (num(terminated, "signal") != 0) s += " signal=" + std::to_string(num(terminated, "signal"));
  const std::string msg = str(terminated, "message");
  if (!msg.empty()) s += ": " + msg;
  return s;
}

std::optional<PodTrouble> pod_trouble(const json& pod) {
  const json& status = field(pod, "status");
  const std::string phase = str(status, "phase");
  if (str(status, "reason") == "Evicted") return PodTrouble{"pod Evicted: " + str(status, "message"), false};
  std::optional<PodTrouble> found;
  for (const char* statuses : {"initContainerStatuses", "containerStatuses"}) {
    for (const json& cs : list(status, statuses)) {
      const std::string name = str(cs, "name", "?");
      const json& state = field(cs, "state");
      const json& last = field(field(cs, "lastState"), "terminated");
      if (const json& waiting = field(state, "waiting"); waiting.is_object()) {
        const std::string why = str(waiting, "reason");
        if (kConfigErrors.count(why))
          return PodTrouble{"container " + name + " cannot start: " + why + ": " + str(waiting, "message"), true};
        if (why == "CrashLoopBackOff") {
          std::string r = "container " + name + " CrashLoopBackOff";
          if (last.is_object()) r += "; last exit: " + describe_termination(last);
          return PodTrouble{r, false};
        }
      }
      // The runtime's `reason` comes first: OOMKilled is an OOM whatever the exit code says.
      if (const json& t = field(state, "terminated"); t.is_object()) {
        if (num(t, "exitCode") != 0 || str(t, "reason") != "Completed" || phase == "Failed")
          found = PodTrouble{"container " + name + " terminated: " + describe_termination(t), false};
      } else if (num(cs, "restartCount") > 0 && last.is_object()) {
        // Restarted by the kubelet already: the failure is in lastState.
        found = PodTrouble{"container " + name + " restarted " + std::to_string(num(cs, "restartCount")) +
                               " times; last exit: " + describe_termination(last),
                           false};
      }
    }
  }
  if (found) return found;
  if (phase == "Failed") return PodTrouble{"pod Failed: " + str(status, "reason") + " " + str(status, "message"), false};
  if (phase == "Succeeded") return PodTrouble{"pod completed", false};
  return std::nullopt;
}

std::optional<std::string> node_trouble(const json& node) {
  for (const json& c : list(field(node, "status"), "conditions")) {
    const std::string type = str(c, "type"), st = str(c, "status");
    const std::string why = str(c, "reason") + ": " + str(c, "message");
    if (type == "Ready" && st != "True") return "node Ready=" + st + " (" + why + ")";
    if (type == "DisruptionTarget" && st == "True") return "node DisruptionTarget (" + why + ")";
  }
  for (const json& t : list(field(node, "spec"), "taints")) {
    const std::string key = str(t, "key");
    if (key == "node.kubernetes.io/unreachable" || key == "node.kubernetes.io/not-ready")
      return "node tainted " + key + ":" + str(t, "effect");
  }
  return std::nullopt;
}

static bool scheduler_keeps_off(const json& node) {
  if (field(node, "spec").value("unschedulable", false)) return true;  // cordoned
  for (const json& t : list(field(node, "spec"), "taints"))
    if (const std::string effect = str(t, "effect"); effect == "NoSchedule" || effect == "NoExecute") return true;
  return false;
}

std::optional<std::string> unschedulable(const json& pod) {
  for (const json& c : list(field(pod, "status"), "conditions"))
    if (str(c, "type") == "PodScheduled" && str(c, "status") == "False")
      return str(c, "reason", "not scheduled") + (str(c, "message").empty() ? "" : ": " + str(c, "message"));
  return std::nullopt;
}

std::string pod_status(const json& pod) {
  const json& status = field(pod, "status");
  std::string s = str(status, "phase", "Unknown");
  if (const std::string why = str(status, "reason"); !why.empty()) s += " (" + why + ")";
  if (const auto why = unschedulable(pod)) s += " (" + *why + ")";
  if (const std::string node = str(field(pod, "spec"), "nodeName"); !node.empty()) s += " on " + node;
  for (const json& cs : list(status, "containerStatuses")) {
    const json& state = field(cs, "state");
    s += "; " + str(cs, "name", "?");
    if (const json& w = field(state, "waiting"); w.is_object()) s += " waiting (" + str(w, "reason", "?") + ")";
    else if (const json& t = field(state, "terminated"); t.is_object())
      s += " terminated (" + str(t, "reason", "?") + ", exit " + std::to_string(num(t, "exitCode")) + ")";
    else if (field(state, "running").is_object()) s += " running";
    if (const int64_t restarts = num(cs, "restartCount"); restarts > 0) s += ", " + std::to_string(restarts) + " restarts";
  }
  return s;
}

static std::string token_secret_name(const KubeNodesOptions& o) {
  return o.spec.token_secret.empty() ? dns_label(o.run) + "-token" : o.spec.token_secret;
}

KubeNodes::KubeNodes(KubeNodesOptions options)
    : ClusterNodes({"kubernetes", "node", "pod"}, options.replicas, true, options.spec.api), o_(std::move(options)), client_(o_.config) {
  ns_ = !o_.spec.namespace_.empty() ? o_.spec.namespace_ : o_.config.namespace_;
  selector_ = "goodput/run=" + dns_label(o_.run);
  // The token the agents authenticate with: a Secret the pods' environment reads; the operator's,
  // or one this run makes.
  if (o_.spec.token_secret.empty()) {
    json meta = {{"name", token_secret_name(o_)}, {"labels", {{"goodput/run", dns_label(o_.run)}}}};
    if (!o_.spec.owner_references.empty()) meta["ownerReferences"] = o_.spec.owner_references;
    const json secret = {{"apiVersion", "v1"}, {"kind", "Secret"}, {"metadata", meta}, {"type", "Opaque"},
                         {"data", {{"token", base64(o_.token)}}}};
    try {
      client_.call("POST", "/api/v1/namespaces/" + ns_ + "/secrets", secret);
    } catch (const KubeError& e) {
      if (e.code != 409) throw;  // AlreadyExists: a resumed master's
    }
  }
  if (o_.adopt) {
    for (const json& p : client_.list("/api/v1/namespaces/" + ns_ + "/pods", selector_).items) {
      const std::string name = str(field(p, "metadata"), "name");
      const auto dash = name.rfind('-');
      if (dash != std::string::npos) counter_ = std::max(counter_, std::atoi(name.c_str() + dash + 1) + 1);
      KubePod& pod = members_[name];
      pod.machine = str(field(p, "spec"), "nodeName");
      pod.launched = std::chrono::steady_clock::now();  // a pod still unscheduled gets a full pending_timeout
      pod.rank = str(field(field(p, "metadata"), "labels"), "goodput/rank");
    }
  }
  start_worker();
  threads_.emplace_back([this] { watch_loop("nodes"); });
  threads_.emplace_back([this] { watch_loop("pods"); });
}

void KubeNodes::job_over() {
  // The token is no use once the job is over; a master that only left (to be resumed) keeps it.
  // The operator's Secret goes with its GoodputJob.
  if (!o_.spec.token_secret.empty()) return;
  try {
    client_.call("DELETE", "/api/v1/namespaces/" + ns_ + "/secrets/" + token_secret_name(o_));
  } catch (const KubeError& e) {
    if (e.code != 404)
      std::cerr << "goodput: could not delete the agents' token Secret " << token_secret_name(o_) << ": " << e.what() << "\n";
  }
}

KubeNodes::~KubeNodes() {
  stop_worker();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

namespace {
struct SlotShape {
  const live::KubeBackendSpec& spec;
  std::string type = "worker";
  int32_t index = 0;
};
SlotShape shape_of(const std::vector<live::ReplicaGroup>& groups, const live::KubeBackendSpec& spec, int32_t slot) {
  if (groups.empty()) return {spec, "worker", slot};
  const live::ReplicaGroup& g = live::replica_group(groups, slot);
  return {g.kube, g.type, slot - g.first_slot};
}
}  // namespace

std::string KubeNodes::pod_name(int32_t slot, int n) const {
  return dns_label(o_.run) + "-" + shape_of(groups_, o_.spec, slot).type + "-" + std::to_string(n);
}

json KubeNodes::manifest_for(const KubeNodesOptions& o_, const std::string& name, int32_t slot,
                             int32_t memory_permille, const std::set<std::string>& avoid) {
  const SlotShape shape = shape_of(o_.replicas, o_.spec, slot);
  const live::KubeBackendSpec& s = shape.spec;
  json container = {{"name", "agent"},
                    {"image", s.image},
                    // $(POD_IP) is expanded by the kubelet: other ranks reach this pod at its own IP.
                    {"command", {s.agent, "agent", "--master", o_.master_url, "--name", name, "--memory-permille",
                                 std::to_string(memory_permille), "--slot", std::to_string(slot), "--host", "$(POD_IP)"}},
                    {"env", json::array({{{"name", "GOODPUT_TOKEN"},
                                          {"valueFrom", {{"secretKeyRef", {{"name", token_secret_name(o_)},
                                                                           {"key", "token"}}}}}},
                                         {{"name", "POD_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}}})}};
  if (!s.working_dir.empty()) container["workingDir"] = s.working_dir;
  json volumes = s.volumes, mounts = s.volume_mounts;
  // Flash checkpoints live in /dev/shm, which container runtimes cap at 64 MiB: give the pod a
  // memory-backed one (its pages count against the pod's memory limit), unless the spec mounts its own.
  const bool own_shm = std::any_of(mounts.begin(), mounts.end(), [](const json& m) {
    return m.is_object() && m.value("mountPath", std::string()) == "/dev/shm";
  });
  if (!own_shm) {
    volumes.push_back({{"name", "goodput-shm"}, {"emptyDir", {{"medium", "Memory"}}}});
    mounts.push_back({{"name", "goodput-shm"}, {"mountPath", "/dev/shm"}});
  }
  container["volumeMounts"] = mounts;
  if (!s.image_pull_policy.empty()) container["imagePullPolicy"] = s.image_pull_policy;
  json limits = json::object(), requests = json::object();
  if (s.memory_mb > 0) {
    const int64_t mib = s.memory_mb * memory_permille / 1000;
    limits["memory"] = requests["memory"] = std::to_string(mib) + "Mi";
  }
  if (!s.cpu.empty()) requests["cpu"] = s.cpu;
  if (s.gpus > 0) limits["nvidia.com/gpu"] = requests["nvidia.com/gpu"] = std::to_string(s.gpus);
  if (!limits.empty() || !requests.empty()) container["resources"] = {{"limits", limits}, {"requests", requests}};
  json spec = {{"restartPolicy", "Never"}, {"containers", json::array({container})}};
  if (!s.service_account.empty()) spec["serviceAccountName"] = s.service_account;
  if (!s.node_selector.empty()) spec["nodeSelector"] = s.node_selector;
  if (!s.tolerations.empty()) spec["tolerations"] = s.tolerations;
  if (!volumes.empty()) spec["volumes"] = volumes;
  if (!avoid.empty())
    spec["affinity"] = {{"nodeAffinity",
                         {{"requiredDuringSchedulingIgnoredDuringExecution",
                           {{"nodeSelectorTerms",
                             json::array({{{"matchExpressions",
                                            json::array({{{"key", "kubernetes.io/hostname"},
                                                          {"operator", "NotIn"},
                                                          {"values", avoid}}})}}})}}}}}};
  const auto dash = name.rfind('-');
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"name", name},
                {"labels",
                 {{"goodput/job", dns_label(o_.job)},
                  {"goodput/run", dns_label(o_.run)},
                  {"goodput/replica-type", shape.type},
                  {"goodput/replica-index", std::to_string(shape.index)},
                  {"goodput/launch", name.substr(dash + 1)},
                  {"goodput/rank", std::to_string(slot)},
                  {"goodput/memory-permille", std::to_string(memory_permille)}}}}},
              {"spec", spec}};
  // A GoodputJob's pods are its own: deleting it deletes them.
  if (!o_.spec.owner_references.empty()) pod["metadata"]["ownerReferences"] = o_.spec.owner_references;
  return pod;
}

void KubeNodes::launch(int32_t slot, int32_t memory_permille) {
  {
    std::lock_guard lock(mu_);
    const std::string name = pod_name(slot, counter_++);
    members_[name].rank = std::to_string(slot);
    members_[name].launched = std::chrono::steady_clock::now();
    queue({Command::Create, name, memory_permille, slot});
  }
}

void KubeNodes::ranked(const std::string& name, int32_t rank) {
  {
    std::lock_guard lock(mu_);
    auto it = members_.find(name);
    if (it == members_.end() || it->second.stopping || it->second.ended || it->second.rank == std::to_string(rank)) return;
    it->second.rank = std::to_string(rank);
    queue({Command::Relabel, name, 0, rank});
  }
}

void KubeNodes::on_pod(const std::string& type, const json& pod) {
  const std::string name = str(field(pod, "metadata"), "name");
  std::lock_guard lock(mu_);
  auto it = members_.find(name);
  if (it == members_.end()) return;  // not one this master launched
  KubePod& p = it->second;
  p.machine = str(field(pod, "spec"), "nodeName", p.machine);
  p.unschedulable = unschedulable(pod).value_or("");
  if (const std::string st = type == "DELETED" ? "deleted" : pod_status(pod); st != p.status) {
    p.status = st;
    status_changed("pod", name, st);
  }
  if (!p.machine.empty()) node_status_.try_emplace(p.machine, "Ready");  // scheduled there: it was ready
  const bool deleted_by_others = type == "DELETED" || field(pod, "metadata").contains("deletionTimestamp");
  if (type == "DELETED") p.ended = true;
  if (deleted_by_others && !(!p.machine.empty() && bad_nodes_.count(p.machine))) {
    // Not by this master (its own deletions are not reported), and its node is fine: someone
    // deleted it (kubectl delete pod, a drain), which says nothing against the node.
    report(name, p, "pod " + name + " was deleted by someone else: stopped by an operator", false);
  } else if (type == "DELETED") {
    report(name, p, "pod " + name + " was deleted", false);
  } else if (const auto t = pod_trouble(pod)) {
    const std::string phase = str(field(pod, "status"), "phase");
    p.ended = phase == "Failed" || phase == "Succeeded";
    report(name, p, t->reason, t->fatal);
  } else if (!p.machine.empty() && bad_nodes_.count(p.machine)) {
    report(name, p, "pod " + name + " is on lost node " + p.machine, false);
  }
  cv_.notify_all();
}

void KubeNodes::on_node(const std::string& type, const json& node) {
  const std::string name = str(field(node, "metadata"), "name");
  const auto trouble = type == "DELETED" ? std::optional<std::string>("node deleted") : node_trouble(node);
  std::lock_guard lock(mu_);
  if (type != "DELETED" && scheduler_keeps_off(node)) kept_off_.insert(name);
  else kept_off_.erase(name);
  if (const auto it = node_status_.find(name); it != node_status_.end() && it->second != trouble.value_or("Ready")) {
    it->second = trouble.value_or("Ready");  // only nodes our pods ran on: a big cluster's others are not ours to log
    status_changed("node", name, it->second);
  }
  if (!trouble) {
    bad_nodes_.erase(name);
    return;
  }
  if (!bad_nodes_.insert(name).second) return;
  std::cerr << "goodput: kubernetes: node " << name << ": " << *trouble << "\n";
  for (auto& [pod, p] : members_)
    if (p.machine == name && !p.ended) report(pod, p, "node " + name + " lost: " + *trouble, false);
}

void KubeNodes::watch_loop(const std::string& resource) {
  const std::string path = resource == "pods" ? "/api/v1/namespaces/" + ns_ + "/pods" : "/api/v1/nodes";
  const std::string selector = resource == "pods" ? selector_ : "";
  std::string rv;
  int backoff_ms = 200;
  auto handle = [&](const std::string& type, const json& obj) {
    if (resource == "pods") on_pod(type, obj);
    else on_node(type, obj);
  };
  while (!quit_) {
    try {
      if (rv.empty()) {
        // (Re-)list: the state now, including anything a lost watch did not deliver.
        const KubeClient::List l = client_.list(path, selector);
        for (const json& obj : l.items) handle("ADDED", obj);
        rv = l.resource_version;
      }
      const bool expired = client_.watch(path, selector, rv, quit_, [&](const WatchEvent& e) { handle(e.type, e.object); });
      if (expired) {
        std::cerr << "goodput: kubernetes: " << resource << " watch expired (410): listing again\n";
        rv.clear();
      }
      backoff_ms = 200;
    } catch (const std::exception& e) {
      if (quit_) return;
      std::cerr << "goodput: kubernetes: " << resource << " watch: " << e.what() << " (resuming)\n";
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(backoff_ms), [&] { return quit_.load(); });
      backoff_ms = std::min(backoff_ms * 2, 5000);
    }
  }
}

void KubeNodes::give_up_unscheduled() {
  // A pod no node was found for (every node busy, or none matches its shape): given up, so the
  // slot is reported waiting (an elastic policy may go on without it) and another is created.
  // A pod that is scheduled but slow to start (an image pull) is not given up.
  const auto now = std::chrono::steady_clock::now();
  for (auto& [name, p] : members_) {
    if (!p.machine.empty() || p.stopping || p.reported || p.ended ||
        now - p.launched < std::chrono::nanoseconds(o_.spec.pending_timeout))
      continue;
    report(name, p, "pod " + name + " was not scheduled within " + format_duration(o_.spec.pending_timeout) +
                        (p.unschedulable.empty() ? "" : " (" + p.unschedulable + ")"),
           false);
    p.stopping = true;
    queue({Command::Delete, name, 0, -1});
  }
}

void KubeNodes::on_idle() {
  std::lock_guard lock(mu_);
  give_up_unscheduled();
}

void KubeNodes::prepare(Command&) { give_up_unscheduled(); }

bool KubeNodes::carry_out(const Command& c) {
  try {
    if (c.kind == Command::Create) {
      json pod;
      {
        // The shape as set_layout() last said, the nodes to keep off as they are now.
        std::lock_guard lock(mu_);
        KubeNodesOptions shape = o_;
        shape.replicas = groups_;
        // A node the scheduler keeps pods off by itself (tainted, cordoned) needs no NotIn: after a
        // zone is lost, a thousand names in every new pod would only make it heavier.
        std::set<std::string> avoid;
        for (const std::set<std::string>* s : {&bad_nodes_, &excluded_})
          for (const std::string& n : *s)
            if (!kept_off_.count(n)) avoid.insert(n);
        pod = manifest_for(shape, c.name, c.slot, c.memory_permille, avoid);
      }
      client_.call("POST", "/api/v1/namespaces/" + ns_ + "/pods", pod);
    } else if (c.kind == Command::Delete) {
      client_.call("DELETE", "/api/v1/namespaces/" + ns_ + "/pods/" + c.name);
    } else {
      client_.merge_patch("/api/v1/namespaces/" + ns_ + "/pods/" + c.name,
                          {{"metadata", {{"labels", {{"goodput/rank", std::to_string(c.slot)}}}}}});
    }
  } catch (const KubeError& e) {
    if (c.kind == Command::Create && e.code == 409) {
      // AlreadyExists: an earlier try that lost its answer created it.
    } else if (c.kind != Command::Create && e.code == 404) {
      // Already gone.
    } else if (e.code == 0 || e.code == 429 || e.code >= 500) {
      std::cerr << "goodput: kubernetes: " << e.what() << " (will try again)\n";
      return false;
    } else {
      std::cerr << "goodput: kubernetes: " << e.what() << "\n";
      std::lock_guard lock(mu_);
      if (c.kind == Command::Create) report(c.name, members_[c.name], std::string("the API server refused the pod: ") + e.what(), true);
    }
  } catch (const std::exception& e) {
    std::cerr << "goodput: kubernetes: " << e.what() << "\n";
  }
  return true;
}

}  // namespace goodput::kube
