#include "backends/kubernetes/kube_operator.h"

#include <unistd.h>

#include <ctime>
#include <iostream>
#include <thread>
#include <vector>

#include "backends/kubernetes/kube_json.h"
#include "engine/json_reader.h"
#include "net/http.h"

namespace goodput::kube {

using nlohmann::json;

namespace {

std::string now_rfc3339() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

std::string core_path(const std::string& ns, const std::string& plural) {
  return "/api/v1/namespaces/" + ns + "/" + plural;
}

// A merge patch that turns `from` into `to` at the top level (a key `to` lacks is removed).
json patch_from(const json& from, const json& to) {
  json p = to;
  if (from.is_object())
    for (const auto& [k, v] : from.items())
      if (!to.contains(k)) p[k] = nullptr;
  return p;
}

}  // namespace

Operator::Operator(OperatorOptions options) : o_(std::move(options)), client_(o_.config) {
  char host[256] = "";
  (void)gethostname(host, sizeof host - 1);
  host_ = host;
}

void Operator::say(const Key& k, const std::string& what) const {
  if (!o_.quiet) std::cerr << "goodput operator: " << k.first << "/" << k.second << ": " << what << "\n";
}

void Operator::enqueue(const Key& k) {
  {
    std::lock_guard lock(mu_);
    queue_.insert(k);
  }
  wake_.notify_one();
}

void Operator::watch_loop(bool jobs, const std::atomic<bool>& stop) {
  const std::string path = jobs ? goodputjobs_path(o_.namespace_)
                                : o_.namespace_.empty() ? "/api/v1/pods" : core_path(o_.namespace_, "pods");
  const std::string selector = jobs ? "" : "goodput/component=master";
  auto key_of = [jobs](const json& o) {
    const json& meta = field(o, "metadata");
    return Key{str(meta, "namespace", "default"), jobs ? str(meta, "name") : str(field(meta, "labels"), "goodput/job")};
  };
  std::string said;
  while (!stop) {
    try {
      KubeClient::List l = client_.list(path, selector);
      if (jobs) {
        std::set<Key> now;
        for (const json& o : l.items) now.insert(key_of(o));
        std::lock_guard lock(mu_);
        known_ = now;
        queue_.insert(now.begin(), now.end());
      } else {
        for (const json& o : l.items) enqueue(key_of(o));
      }
      wake_.notify_one();
      std::string rv = l.resource_version;
      while (!stop) {
        const bool expired = client_.watch(path, selector, rv, stop, [&](const WatchEvent& e) {
          const Key k = key_of(e.object);
          if (k.second.empty()) return;
          if (jobs) {
            std::lock_guard lock(mu_);
            if (e.type == "DELETED") known_.erase(k);
            else known_.insert(k);
          }
          enqueue(k);
        });
        if (expired) break;  // re-list
      }
      said.clear();
    } catch (const KubeError& e) {
      if (said != e.what())
        std::cerr << "goodput operator: " << e.what()
                  << (jobs && e.code == 404 ? " (is the GoodputJob CRD installed? kubectl apply -f "
                                              "backends/kubernetes/deploy/crd.yaml)"
                                            : "")
                  << " (trying again)\n";
      said = e.what();
      for (int i = 0; i < 20 && !stop; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

void Operator::run(const std::atomic<bool>& stop) {
  std::vector<std::thread> watches;
  watches.emplace_back([&] { watch_loop(true, stop); });
  watches.emplace_back([&] { watch_loop(false, stop); });
  auto next_resync = std::chrono::steady_clock::now() + o_.resync;
  while (!stop) {
    std::set<Key> batch;
    {
      std::unique_lock lock(mu_);
      wake_.wait_until(lock, std::min(next_resync, std::chrono::steady_clock::now() + std::chrono::milliseconds(200)),
                       [&] { return !queue_.empty() || stop; });
      if (std::chrono::steady_clock::now() >= next_resync) {
        queue_.insert(known_.begin(), known_.end());
        next_resync = std::chrono::steady_clock::now() + o_.resync;
      }
      batch.swap(queue_);
    }
    for (const Key& k : batch) {
      if (stop) break;
      try {
        reconcile(k);
      } catch (const std::exception& e) {  // the API server refused or went away: the next pass tries again
        say(k, std::string("will try again: ") + e.what());
      }
    }
  }
  for (auto& t : watches) t.join();
}

std::string Operator::token_of(const json& job, bool create) {
  const json& meta = field(job, "metadata");
  const Key k{str(meta, "namespace", "default"), str(meta, "name")};
  const std::string uid = str(meta, "uid");
  if (const auto it = tokens_.find(k); it != tokens_.end() && it->second.first == uid) return it->second.second;
  const std::string name = owned_names(k.second).token;
  std::string token;
  try {
    const json secret = client_.call("GET", core_path(k.first, "secrets") + "/" + name);
    token = base64_decode(str(field(secret, "data"), "token"), "Secret " + k.first + "/" + name + " key token");
  } catch (const KubeError& e) {
    if (e.code != 404 || !create) throw;
    token = net::random_token();
    try {
      client_.call("POST", core_path(k.first, "secrets"), token_secret_for(job, token));
    } catch (const KubeError& again) {
      if (again.code == 409) return token_of(job, false);  // made meanwhile: that one holds
      throw;
    }
  }
  tokens_[k] = {uid, token};
  return token;
}

json Operator::policy_from(const json& job, const std::string& ns) {
  const json& from = field(field(field(job, "spec"), "policy_from"), "configMapKeyRef");
  if (!from.is_object()) return nullptr;
  const std::string cm = str(from, "name"), key = str(from, "key");
  json map;
  try {
    map = client_.call("GET", core_path(ns, "configmaps") + "/" + cm);
  } catch (const KubeError& e) {
    if (e.code != 404) throw;
    throw ConfigError("field 'spec.policy_from': ConfigMap " + cm + " not found in namespace " + ns);
  }
  const json& text = field(field(map, "data"), key.c_str());
  if (!text.is_string()) throw ConfigError("field 'spec.policy_from': ConfigMap " + cm + " has no key '" + key + "'");
  try {
    return yaml_to_json(text.get<std::string>());  // JSON is YAML too
  } catch (const std::exception& e) {
    throw ConfigError("field 'spec.policy_from': ConfigMap " + cm + " key '" + key + "' is not a policy: " + e.what());
  }
}

void Operator::ensure(const std::string& path, const json& object) {
  try {
    client_.call("POST", path, object);
  } catch (const KubeError& e) {
    if (e.code != 409) throw;
  }
}

void Operator::emit(const json& job, const JobEvent& e) {
  const json& meta = field(job, "metadata");
  const std::string ns = str(meta, "namespace", "default");
  const std::string now = now_rfc3339();
  char suffix[40];
  std::snprintf(suffix, sizeof suffix, ".%llx%04llx",
                static_cast<unsigned long long>(std::chrono::system_clock::now().time_since_epoch().count()),
                static_cast<unsigned long long>(++events_ & 0xffff));
  const json event = {
      {"apiVersion", "v1"},
      {"kind", "Event"},
      {"metadata",
       {{"name", str(meta, "name") + suffix}, {"namespace", ns}, {"ownerReferences", json::array({owner_reference(job)})}}},
      {"involvedObject",
       {{"apiVersion", "goodput.dev/v1alpha1"}, {"kind", "GoodputJob"}, {"name", str(meta, "name")}, {"namespace", ns},
        {"uid", str(meta, "uid")}, {"resourceVersion", str(meta, "resourceVersion")}}},
      {"reason", e.reason},
      {"message", e.message},
      {"type", e.type},
      {"firstTimestamp", now},
      {"lastTimestamp", now},
      {"count", 1},
      {"source", {{"component", "goodput-operator"}}},
      {"reportingComponent", "goodput-operator"},
      {"reportingInstance", host_}};
  try {
    client_.call("POST", core_path(ns, "events"), event);
  } catch (const KubeError& err) {  // an Event is a courtesy: the status holds the truth
    std::cerr << "goodput operator: could not record an Event: " << err.what() << "\n";
  }
}

void Operator::reconcile(const Key& k) {
  const auto& [ns, name] = k;
  const std::string path = goodputjobs_path(ns) + "/" + name;
  json job;
  try {
    job = client_.call("GET", path);
  } catch (const KubeError& e) {
    if (e.code != 404) throw;
    tokens_.erase(k);
    std::lock_guard lock(mu_);
    known_.erase(k);  // deleted: what it owned goes with it (ownerReferences)
    return;
  }
  if (!field(field(job, "metadata"), "deletionTimestamp").is_null()) return;
  const std::string phase = str(field(job, "status"), "phase");
  const bool awaiting = awaits_spec(job);
  if ((phase == "Succeeded" || phase == "Failed") && !awaiting) return;  // over: nothing to read or write

  Observed seen;
  json spec;
  if (awaiting) {
    try {
      spec = job_spec_of(job, policy_from(job, ns));
    } catch (const ConfigError& e) {
      seen.spec_error = e.what();
    }
  }
  const OwnedNames names = owned_names(name);
  if (seen.spec_error.empty()) {
    try {
      seen.master_pod = client_.call("GET", core_path(ns, "pods") + "/" + names.master);
    } catch (const KubeError& e) {
      if (e.code != 404) throw;
    }
    if (seen.master_pod && str(field(*seen.master_pod, "status"), "phase") == "Running") {
      const std::string token = token_of(job, false);
      const auto r = net::http_call(net::Url::parse(master_url_of(job)), "GET", "/status?nodes=0", token, "", 2000);
      if (r && r->status == 200) {
        const json st = json::parse(r->body, nullptr, false);
        if (st.is_object()) seen.master = st;
      }
    }
  }

  Reconciled r = kube::reconcile(job, seen, now_rfc3339());
  const json& old = field(job, "status");
  if (r.master == Reconciled::Master::Create) {
    // What the master needs first, then the master; a pod that exists already (another operator,
    // or this one before a restart) is left as it is.
    (void)token_of(job, true);
    if (!spec.is_null()) ensure(core_path(ns, "configmaps"), config_map_for(job, spec));
    if (const json claim = log_claim_for(job); !claim.is_null()) ensure(core_path(ns, "persistentvolumeclaims"), claim);
    ensure(core_path(ns, "services"), service_for(job));
    ensure(core_path(ns, "pods"), master_pod_for(job));
    say(k, "master " + names.master + (str(old, "phase").empty() ? " created" : " created again"));
  }
  // Before a replacement: the count of masters replaced must be there before the pod goes.
  if (r.status != old) client_.merge_patch(path + "/status", {{"status", patch_from(old, r.status)}});
  if (r.master == Reconciled::Master::Replace) {
    try {
      client_.call("DELETE", core_path(ns, "pods") + "/" + names.master);
    } catch (const KubeError& e) {
      if (e.code != 404) throw;
    }
    say(k, "master " + names.master + " ended; deleted, a new one resumes from the log");
  }
  if (str(r.status, "phase") != str(old, "phase")) say(k, str(old, "phase", "(new)") + " -> " + str(r.status, "phase"));
  for (const JobEvent& e : r.events) emit(job, e);
}

}  // namespace goodput::kube
