// A GoodputJob (goodput.dev/v1alpha1, deploy/crd.yaml) and what `goodput operator` makes of it:
// the job spec its master runs, the objects the job owns (the master's Pod, its Service, the
// ConfigMap with the job spec, the Secret with the agents' token, the event log's claim), and the
// resource's status. Everything here is a pure function of the resource and of what the operator
// observed, so each decision is tested without a cluster; kube_operator.h does the I/O.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace goodput::kube {

// ".../apis/goodput.dev/v1alpha1[/namespaces/NS]/goodputjobs" (ns empty: every namespace).
std::string goodputjobs_path(const std::string& ns);

// The objects a GoodputJob named `job` owns. The master's Pod has a fixed name, so a restarted or
// second operator gets 409 AlreadyExists instead of starting a second master on the same log.
struct OwnedNames {
  std::string master;     // Pod and Service <job>-master
  std::string config;     // ConfigMap <job>-job: job.json, the job spec the master runs
  std::string token;      // Secret <job>-token: key "token", the agents' (and the operator's) bearer token
  std::string log_claim;  // PersistentVolumeClaim <job>-log: the master's event log (unless spec.master.log_volume)
};
OwnedNames owned_names(const std::string& job);

// The owner reference every owned object carries (controller, blockOwnerDeletion).
nlohmann::json owner_reference(const nlohmann::json& goodputjob);
// Where the agents and the operator reach the master: spec.master.url, else its Service's DNS name.
std::string master_url_of(const nlohmann::json& goodputjob);

// The job spec (JOB.json) the master runs: the resource's spec with the job's name, the backend's
// type, namespace, master URL, token Secret and owner, and the policy inline (`policy_doc`: the
// document spec.policy_from names, already read; null when the spec has none). Then checked as
// `goodput run` will check it (job spec and policy). Throws ConfigError naming the field.
nlohmann::json job_spec_of(const nlohmann::json& goodputjob, const nlohmann::json& policy_doc);

nlohmann::json config_map_for(const nlohmann::json& goodputjob, const nlohmann::json& job_spec);
nlohmann::json token_secret_for(const nlohmann::json& goodputjob, const std::string& token);
nlohmann::json log_claim_for(const nlohmann::json& goodputjob);  // null: spec.master.log_volume is used instead
nlohmann::json service_for(const nlohmann::json& goodputjob);
// The master: `goodput run` on the ConfigMap's job.json, its event log on the log volume (resumed
// with --resume when the log is there), its token from the Secret, its end in the termination message.
nlohmann::json master_pod_for(const nlohmann::json& goodputjob);

// What the operator saw of one job on one pass.
struct Observed {
  std::string spec_error;                    // why the spec cannot run; empty: it can
  std::optional<nlohmann::json> master_pod;  // the master's Pod, if there is one
  std::optional<nlohmann::json> master;      // its /status, if it answered
};

// A Kubernetes Event about the job.
struct JobEvent {
  std::string type;  // Normal or Warning
  std::string reason;
  std::string message;
};

struct Reconciled {
  nlohmann::json status;  // the status the resource should have
  enum class Master { Keep, Create, Replace } master = Master::Keep;  // Replace: delete it, a new one resumes
  std::vector<JobEvent> events;
};
// No master was started for the job's spec yet (new, or refused for its spec and changed since):
// its spec is read and checked now. Once a master runs, the ConfigMap holds the spec it runs, and
// later edits of the resource's spec are not applied to it (status.observed_generation says which).
bool awaits_spec(const nlohmann::json& goodputjob);

// A master that fails this often (crashes, evictions, lost nodes) fails the job.
inline constexpr int kMasterRestartLimit = 10;

// The level-triggered core: from the resource (its status is what the operator last wrote) and
// what it saw, the status to write, what to do with the master, and the Events to emit.
// `now` is an RFC 3339 time, for conditions' lastTransitionTime.
Reconciled reconcile(const nlohmann::json& goodputjob, const Observed& seen, const std::string& now);

// "OutOfMemory" from "out_of_memory": a diagnosis or finish reason as a condition's reason.
std::string camel_case(const std::string& snake);

}  // namespace goodput::kube
