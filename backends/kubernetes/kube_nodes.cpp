#include "backends/kubernetes/kube_nodes.h"

#include <openssl/evp.h>

#include <chrono>
#include <iostream>

namespace goodput::kube {

using nlohmann::json;

namespace {

const std::set<std::string> kConfigErrors = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                                             "CreateContainerConfigError", "ErrImageNeverPull"};

std::string describe(const json& terminated) {
  std::string s = "reason=" + terminated.value("reason", std::string("?")) +
                  " exitCode=" + std::to_string(terminated.value("exitCode", 0));
  if (terminated.value("signal", 0) != 0) s += " signal=" + std::to_string(terminated.value("signal", 0));
  const std::string msg = terminated.value("message", std::string());
  if (!msg.empty()) s += ": " + msg;
  return s;
}

std::string base64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

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

std::optional<PodTrouble> pod_trouble(const json& pod) {
  const json status = pod.value("status", json::object());
  const std::string phase = status.value("phase", std::string());
  if (status.value("reason", std::string()) == "Evicted")
    return PodTrouble{"pod Evicted: " + status.value("message", std::string()), false};
  std::optional<PodTrouble> found;
  for (const char* list : {"initContainerStatuses", "containerStatuses"}) {
    if (!status.contains(list) || !status[list].is_array()) continue;
    for (const json& cs : status[list]) {
      const std::string name = cs.value("name", std::string("?"));
      const json state = cs.value("state", json::object());
      if (state.contains("waiting")) {
        const std::string why = state["waiting"].value("reason", std::string());
        const std::string msg = state["waiting"].value("message", std::string());
        if (kConfigErrors.count(why)) return PodTrouble{"container " + name + " cannot start: " + why + ": " + msg, true};
        if (why == "CrashLoopBackOff") {
          std::string r = "container " + name + " CrashLoopBackOff";
          if (cs.contains("lastState") && cs["lastState"].contains("terminated"))
            r += "; last exit: " + describe(cs["lastState"]["terminated"]);
          return PodTrouble{r, false};
        }
      }
      // The runtime's `reason` comes first: OOMKilled is an OOM whatever the exit code says.
      if (state.contains("terminated")) {
        const json& t = state["terminated"];
        if (t.value("exitCode", 0) != 0 || t.value("reason", std::string()) != "Completed" || phase == "Failed")
          found = PodTrouble{"container " + name + " terminated: " + describe(t), false};
      } else if (cs.value("restartCount", 0) > 0 && cs.contains("lastState") && cs["lastState"].contains("terminated")) {
        // Restarted by the kubelet already: the failure is in lastState.
        found = PodTrouble{"container " + name + " restarted " + std::to_string(cs.value("restartCount", 0)) +
                               " times; last exit: " + describe(cs["lastState"]["terminated"]),
                           false};
      }
    }
  }
  if (found) return found;
  if (phase == "Failed")
    return PodTrouble{"pod Failed: " + status.value("reason", std::string()) + " " + status.value("message", std::string()),
                      false};
  if (phase == "Succeeded") return PodTrouble{"pod completed", false};
  return std::nullopt;
}

std::optional<std::string> node_trouble(const json& node) {
  const json status = node.value("status", json::object());
  for (const json& c : status.value("conditions", json::array())) {
    const std::string type = c.value("type", std::string()), st = c.value("status", std::string());
    const std::string why = c.value("reason", std::string()) + ": " + c.value("message", std::string());
    if (type == "Ready" && st != "True") return "node Ready=" + st + " (" + why + ")";
    if (type == "DisruptionTarget" && st == "True") return "node DisruptionTarget (" + why + ")";
  }
  for (const json& t : node.value("/spec/taints"_json_pointer, json::array())) {
    const std::string key = t.value("key", std::string());
    if (key == "node.kubernetes.io/unreachable" || key == "node.kubernetes.io/not-ready")
      return "node tainted " + key + ":" + t.value("effect", std::string());
  }
  return std::nullopt;
}

KubeNodes::KubeNodes(KubeNodesOptions options) : o_(std::move(options)), client_(o_.config) {
  ns_ = !o_.spec.namespace_.empty() ? o_.spec.namespace_ : o_.config.namespace_;
  selector_ = "goodput/run=" + dns_label(o_.run);
  // The token the agents authenticate with: a Secret the pods' environment reads.
  const json secret = {{"apiVersion", "v1"},
                       {"kind", "Secret"},
                       {"metadata", {{"name", dns_label(o_.run) + "-token"}, {"labels", {{"goodput/run", dns_label(o_.run)}}}}},
                       {"type", "Opaque"},
                       {"data", {{"token", base64(o_.token)}}}};
  try {
    client_.call("POST", "/api/v1/namespaces/" + ns_ + "/secrets", secret);
  } catch (const KubeError& e) {
    if (e.code != 409) throw;  // AlreadyExists: a resumed master's
  }
  if (o_.adopt) {
    for (const json& p : client_.list("/api/v1/namespaces/" + ns_ + "/pods", selector_).items) {
      const std::string name = p.value("/metadata/name"_json_pointer, std::string());
      const auto dash = name.rfind('-');
      if (dash != std::string::npos) counter_ = std::max(counter_, std::atoi(name.c_str() + dash + 1) + 1);
      pods_[name].node = p.value("/spec/nodeName"_json_pointer, std::string());
    }
  }
  threads_.emplace_back([this] { commands(); });
  threads_.emplace_back([this] { watch_loop("nodes"); });
  threads_.emplace_back([this] { watch_loop("pods"); });
}

KubeNodes::~KubeNodes() {
  quit_ = true;
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

std::string KubeNodes::pod_name(int n) const {
  return dns_label(o_.run) + "-" + o_.spec.replica_type + "-" + std::to_string(n);
}

json KubeNodes::manifest_for(const KubeNodesOptions& o_, const std::string& name, int32_t memory_permille,
                             const std::set<std::string>& avoid) {
  const live::KubeBackendSpec& s = o_.spec;
  json container = {{"name", "agent"},
                    {"image", s.image},
                    {"command", {s.agent, "agent", "--master", o_.master_url, "--name", name, "--memory-permille",
                                 std::to_string(memory_permille)}},
                    {"env", json::array({{{"name", "GOODPUT_TOKEN"},
                                          {"valueFrom", {{"secretKeyRef", {{"name", dns_label(o_.run) + "-token"},
                                                                           {"key", "token"}}}}}}})}};
  if (!s.working_dir.empty()) container["workingDir"] = s.working_dir;
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
  if (!avoid.empty())
    spec["affinity"] = {{"nodeAffinity",
                         {{"requiredDuringSchedulingIgnoredDuringExecution",
                           {{"nodeSelectorTerms",
                             json::array({{{"matchExpressions",
                                            json::array({{{"key", "kubernetes.io/hostname"},
                                                          {"operator", "NotIn"},
                                                          {"values", avoid}}})}}})}}}}}};
  const auto dash = name.rfind('-');
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata",
           {{"name", name},
            {"labels",
             {{"goodput/job", dns_label(o_.job)},
              {"goodput/run", dns_label(o_.run)},
              {"goodput/replica-type", s.replica_type},
              {"goodput/launch", name.substr(dash + 1)},
              {"goodput/memory-permille", std::to_string(memory_permille)}}}}},
          {"spec", spec}};
}

void KubeNodes::launch(int32_t memory_permille) {
  {
    std::lock_guard lock(mu_);
    const std::string name = pod_name(counter_++);
    pods_[name];
    queue_.push_back({Command::Create, name, memory_permille});
  }
  cv_.notify_all();
}

void KubeNodes::terminate(const std::string& name) {
  {
    std::lock_guard lock(mu_);
    auto it = pods_.find(name);
    if (it == pods_.end()) return;
    it->second.deleting = true;
    queue_.push_back({Command::Delete, name, 0});
  }
  cv_.notify_all();
}

std::vector<live::LostNode> KubeNodes::lost() {
  std::lock_guard lock(mu_);
  return std::exchange(lost_, {});
}

void KubeNodes::shut_down(int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, until, [&] {
    for (const auto& [name, p] : pods_)
      if (!p.ended && !p.deleting) return false;
    return true;
  });
  // Pods are deleted at the end whatever their state: their logs are in the event log's reasons.
  for (auto& [name, p] : pods_)
    if (!p.deleting) {
      p.deleting = true;
      queue_.push_back({Command::Delete, name, 0});
    }
  cv_.notify_all();
  cv_.wait_until(lock, std::chrono::steady_clock::now() + std::chrono::seconds(10), [&] { return queue_.empty(); });
}

void KubeNodes::report(const std::string& name, Pod& p, std::string reason, bool fatal) {
  if (p.reported || p.deleting) return;
  p.reported = true;
  lost_.push_back({name, std::move(reason), fatal});
}

void KubeNodes::on_pod(const std::string& type, const json& pod) {
  const std::string name = pod.value("/metadata/name"_json_pointer, std::string());
  std::lock_guard lock(mu_);
  auto it = pods_.find(name);
  if (it == pods_.end()) return;  // not one this master launched
  Pod& p = it->second;
  p.node = pod.value("/spec/nodeName"_json_pointer, p.node);
  if (type == "DELETED") {
    p.ended = true;
    report(name, p, "pod " + name + " was deleted", false);
  } else if (const auto t = pod_trouble(pod)) {
    const std::string phase = pod.value("/status/phase"_json_pointer, std::string());
    p.ended = phase == "Failed" || phase == "Succeeded";
    report(name, p, t->reason, t->fatal);
  } else if (!p.node.empty() && bad_nodes_.count(p.node)) {
    report(name, p, "pod " + name + " is on lost node " + p.node, false);
  }
  cv_.notify_all();
}

void KubeNodes::on_node(const std::string& type, const json& node) {
  const std::string name = node.value("/metadata/name"_json_pointer, std::string());
  const auto trouble = type == "DELETED" ? std::optional<std::string>("node deleted") : node_trouble(node);
  std::lock_guard lock(mu_);
  if (!trouble) {
    bad_nodes_.erase(name);
    return;
  }
  if (!bad_nodes_.insert(name).second) return;
  std::cerr << "goodput: kubernetes: node " << name << ": " << *trouble << "\n";
  for (auto& [pod, p] : pods_)
    if (p.node == name && !p.ended) report(pod, p, "node " + name + " lost: " + *trouble, false);
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

void KubeNodes::commands() {
  while (true) {
    Command c;
    std::set<std::string> avoid;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return quit_ || !queue_.empty(); });
      if (quit_) return;
      c = queue_.front();
      avoid = bad_nodes_;
    }
    bool done = true;
    try {
      if (c.kind == Command::Create) {
        client_.call("POST", "/api/v1/namespaces/" + ns_ + "/pods", manifest_for(o_, c.name, c.memory_permille, avoid));
      } else {
        client_.call("DELETE", "/api/v1/namespaces/" + ns_ + "/pods/" + c.name);
      }
    } catch (const KubeError& e) {
      if (c.kind == Command::Create && e.code == 409) {
        // AlreadyExists: an earlier try that lost its answer created it.
      } else if (c.kind == Command::Delete && e.code == 404) {
        // Already gone.
      } else if (e.code == 0 || e.code == 429 || e.code >= 500) {
        std::cerr << "goodput: kubernetes: " << e.what() << " (will try again)\n";
        done = false;
      } else {
        std::cerr << "goodput: kubernetes: " << e.what() << "\n";
        std::lock_guard lock(mu_);
        if (c.kind == Command::Create) report(c.name, pods_[c.name], std::string("the API server refused the pod: ") + e.what(), true);
      }
    } catch (const std::exception& e) {
      std::cerr << "goodput: kubernetes: " << e.what() << "\n";
    }
    std::unique_lock lock(mu_);
    if (done) queue_.pop_front();
    cv_.notify_all();
    if (!done) cv_.wait_for(lock, std::chrono::seconds(1), [&] { return quit_.load(); });
  }
}

}  // namespace goodput::kube
