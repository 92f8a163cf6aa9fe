#include "backends/kubernetes/goodput_job.h"

#include <cstdio>

#include "backends/kubernetes/kube_client.h"
#include "backends/kubernetes/kube_json.h"
#include "backends/live/job_spec.h"
#include "engine/json_reader.h"

namespace goodput::kube {

using nlohmann::json;

std::string goodputjobs_path(const std::string& ns) {
  return std::string("/apis/goodput.dev/v1alpha1/") + (ns.empty() ? "" : "namespaces/" + ns + "/") + "goodputjobs";
}

OwnedNames owned_names(const std::string& job) { return {job + "-master", job + "-job", job + "-token", job + "-log"}; }

namespace {

std::string name_of(const json& o) { return str(field(o, "metadata"), "name"); }
std::string namespace_of(const json& o) { return str(field(o, "metadata"), "namespace", "default"); }
const json& master_of(const json& job) { return field(field(job, "spec"), "master"); }
int master_port(const json& job) {
  const json& p = field(master_of(job), "port");
  return p.is_number_integer() ? p.get<int>() : 8000;
}

// Metadata of an object the job owns: its name, the job's label and the owner reference.
json owned_meta(const json& job, const std::string& name, json labels = json::object()) {
  labels["goodput/job"] = name_of(job);
  return {{"name", name},
          {"namespace", namespace_of(job)},
          {"labels", labels},
          {"ownerReferences", json::array({owner_reference(job)})}};
}

// spec.master: checked strictly, like the rest of the spec.
void check_master(const json& master) {
  if (master.is_null()) return;
  if (!master.is_object()) throw ConfigError("field 'spec.master' must be an object");
  ConfigReader r(master, "spec.master");
  r.text("image", "");
  r.text("service_account", "");
  r.text("log_size", "");
  const std::string url = r.text("url", "");
  if (!url.empty() && url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0)
    r.fail("url", "must be an http:// or https:// URL");
  r.integer("port", 8000, 1, 65535);
  if (const json* v = r.child("log_volume"))
    if (!v->is_object() || v->empty() || v->contains("name"))
      r.fail("log_volume", "must be a Kubernetes volume source without a name, e.g. {persistentVolumeClaim: {claimName: logs}}");
  r.finish();
}

}  // namespace

json owner_reference(const json& job) {
  return {{"apiVersion", "goodput.dev/v1alpha1"},
          {"kind", "GoodputJob"},
          {"name", name_of(job)},
          {"uid", str(field(job, "metadata"), "uid")},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

std::string master_url_of(const json& job) {
  const std::string url = str(master_of(job), "url");
  if (!url.empty()) return url;
  return "http://" + owned_names(name_of(job)).master + "." + namespace_of(job) + ".svc:" +
         std::to_string(master_port(job));
}

json job_spec_of(const json& job, const json& policy_doc) {
  const std::string where = "GoodputJob " + namespace_of(job) + "/" + name_of(job) + ": ";
  try {
    const json& spec = field(job, "spec");
    if (!spec.is_object()) throw ConfigError("field 'spec' is required: the job spec");
    check_master(field(spec, "master"));
    json out = spec;
    out.erase("master");
    out.erase("policy_from");
    if (spec.contains("job")) throw ConfigError("field 'spec.job' is not for a GoodputJob: its name is the job's");
    out["job"] = name_of(job);
    if (spec.contains("policy") && !spec["policy"].is_object())
      throw ConfigError("field 'spec.policy' must be a policy object (or use spec.policy_from)");
    if (!policy_doc.is_null()) {
      if (spec.contains("policy")) throw ConfigError("field 'spec.policy_from': give spec.policy or spec.policy_from, not both");
      out["policy"] = policy_doc;
    }
    if (!field(out, "backend").is_object())
      throw ConfigError("field 'spec.backend' is required: the worker pods' shape (image, cpu, memory_mb, ...)");
    json& b = out["backend"];
    for (const char* k : {"type", "namespace", "master_url", "token_secret", "owner_references", "kubeconfig", "context"})
      if (b.contains(k))
        throw ConfigError(std::string("field 'spec.backend.") + k + "' is not for a GoodputJob: the operator sets it");
    b["type"] = "kubernetes";
    b["namespace"] = namespace_of(job);
    b["master_url"] = master_url_of(job);
    b["token_secret"] = owned_names(name_of(job)).token;
    b["owner_references"] = json::array({owner_reference(job)});
    // As `goodput run` will read it: the job spec and its policy, strictly.
    (void)live::job_spec_from_json(out, "spec", "/");
    return out;
  } catch (const ConfigError& e) {
    throw ConfigError(where + e.what());
  }
}

json config_map_for(const json& job, const json& job_spec) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", owned_meta(job, owned_names(name_of(job)).config)},
          {"data", {{"job.json", job_spec.dump(2) + "\n"}}}};
}

json token_secret_for(const json& job, const std::string& token) {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", owned_meta(job, owned_names(name_of(job)).token)},
          {"type", "Opaque"},
          {"data", {{"token", base64(token)}}}};
}

json log_claim_for(const json& job) {
  if (field(master_of(job), "log_volume").is_object()) return nullptr;
  return {{"apiVersion", "v1"},
          {"kind", "PersistentVolumeClaim"},
          {"metadata", owned_meta(job, owned_names(name_of(job)).log_claim)},
          {"spec",
           {{"accessModes", {"ReadWriteOnce"}},
            {"resources", {{"requests", {{"storage", str(master_of(job), "log_size", "1Gi")}}}}}}}};
}

json service_for(const json& job) {
  const int port = master_port(job);
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", owned_meta(job, owned_names(name_of(job)).master)},
          {"spec",
           {{"selector", {{"goodput/job", name_of(job)}, {"goodput/component", "master"}}},
            {"ports", {{{"name", "api"}, {"port", port}, {"targetPort", port}}}}}}};
}

json master_pod_for(const json& job) {
  const OwnedNames names = owned_names(name_of(job));
  const json& spec = field(job, "spec");
  const json& master = master_of(job);
  const int port = master_port(job);
  const std::string image = str(master, "image", str(field(spec, "backend"), "image"));
  std::string goodput = str(field(spec, "backend"), "agent", "goodput");
  std::string quoted = "'";  // for the shell: the path as one word, whatever it holds
  for (char c : goodput) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  // A new pod resumes the job when its log is there; SIGTERM (an eviction, a drain) stops only the
  // master, its agents keep training; how it ended goes to the termination message.
  const std::string script = "if [ -f /data/run/events.db ]; then resume=--resume; fi; exec " + quoted +
                             " run /config/job.json --run-dir /data/run --listen 0.0.0.0 --port " +
                             std::to_string(port) +
                             " --detach-on-sigterm --termination-log /dev/termination-log $resume";
  json container = {
      {"name", "master"},
      {"image", image},
      {"command", {"/bin/sh", "-c"}},
      {"args", {script}},
      {"env", {{{"name", "GOODPUT_TOKEN"},
                {"valueFrom", {{"secretKeyRef", {{"name", names.token}, {"key", "token"}}}}}}}},
      {"ports", {{{"name", "api"}, {"containerPort", port}}}},
      {"readinessProbe", {{"httpGet", {{"path", "/healthz"}, {"port", port}}}}},
      {"terminationMessagePath", "/dev/termination-log"},
      {"terminationMessagePolicy", "FallbackToLogsOnError"},
      {"volumeMounts", {{{"name", "config"}, {"mountPath", "/config"}, {"readOnly", true}},
                        {{"name", "log"}, {"mountPath", "/data"}}}}};
  if (const std::string pull = str(field(spec, "backend"), "image_pull_policy"); !pull.empty())
    container["imagePullPolicy"] = pull;
  json log = field(master, "log_volume").is_object() ? master["log_volume"]
                                                     : json{{"persistentVolumeClaim", {{"claimName", names.log_claim}}}};
  log["name"] = "log";
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", owned_meta(job, names.master, {{"goodput/component", "master"}})},
          {"spec",
           {{"restartPolicy", "Never"},  // a master that ends is replaced by the operator, which reads how it ended
            {"serviceAccountName", str(master, "service_account", "goodput-master")},
            {"containers", {container}},
            {"volumes", {{{"name", "config"}, {"configMap", {{"name", names.config}}}}, log}}}}};
}

std::string camel_case(const std::string& snake) {
  std::string out;
  bool up = true;
  for (char c : snake) {
    if (c == '_' || c == '-' || c == ' ') {
      up = true;
      continue;
    }
    out += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    up = false;
  }
  return out.empty() ? "Unknown" : out;
}

namespace {

const char* const kConditionTypes[] = {"Running", "Recovering", "Succeeded", "Failed"};

// One condition per type; the phase's is True with its reason and message. A condition keeps its
// lastTransitionTime while its status stays.
json conditions_for(const json& old, const std::string& phase, const std::string& reason, const std::string& message,
                    const std::string& now) {
  json out = json::array();
  for (const char* type : kConditionTypes) {
    const std::string status = phase == type ? "True" : "False";
    json c = {{"type", type}, {"status", status}, {"lastTransitionTime", now}};
    for (const json& o : list(old, "conditions"))
      if (str(o, "type") == type && str(o, "status") == status) c["lastTransitionTime"] = str(o, "lastTransitionTime", now);
    if (status == "True") {
      c["reason"] = reason;
      if (!message.empty()) c["message"] = message.substr(0, 1024);
    }
    out.push_back(c);
  }
  return out;
}

std::string percent(double share) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100 * share);
  return b;
}

// The master's figures (its /status, or the summary it ended with) into the resource's status.
void take_figures(json& st, const json& m) {
  if (field(m, "step").is_number_integer()) st["step"] = m["step"];
  if (field(m, "restart").is_number_integer()) st["restarts"] = m["restart"];
  if (field(m, "goodput").is_number()) st["goodput"] = percent(m["goodput"].get<double>());
  if (field(m, "world_size").is_number_integer()) {
    st["nodes_target"] = m["world_size"];
    st["nodes_ready"] = num(m, "nodes_training");
    st["nodes"] = std::to_string(num(m, "nodes_training")) + "/" + std::to_string(num(m, "world_size"));
  }
  if (const std::string last = str(field(m, "last_failure"), "message"); !last.empty()) st["last_failure"] = last;
}

std::string condition_reason(const json& st, const char* type) {
  for (const json& c : list(st, "conditions"))
    if (str(c, "type") == type && str(c, "status") == "True") return str(c, "reason");
  return "";
}

}  // namespace

bool awaits_spec(const json& job) {
  const json& st = field(job, "status");
  if (!field(st, "observed_generation").is_number_integer()) return true;
  return str(st, "phase") == "Failed" && condition_reason(st, "Failed") == "InvalidSpec" &&
         num(st, "observed_generation") != num(field(job, "metadata"), "generation");
}

Reconciled reconcile(const json& job, const Observed& seen, const std::string& now) {
  const json old = field(job, "status").is_object() ? job["status"] : json::object();
  const std::string was = str(old, "phase");
  const int64_t generation = num(field(job, "metadata"), "generation");
  Reconciled r;
  r.status = old;
  json& st = r.status;
  auto set_phase = [&](const std::string& phase, const std::string& reason, const std::string& message) {
    st["phase"] = phase;
    st["conditions"] = conditions_for(old, phase, reason, message, now);
  };
  auto event = [&](const char* type, const std::string& reason, const std::string& message) {
    r.events.push_back({type, reason, message.substr(0, 1024)});
  };

  // A job that ended stays ended; one refused for its spec is looked at again once the spec changes.
  if ((was == "Succeeded" || was == "Failed") && !awaits_spec(job)) return r;
  const bool refused = was == "Failed";  // past the line above, a Failed job is one refused for its spec
  if (!seen.spec_error.empty()) {
    set_phase("Failed", "InvalidSpec", seen.spec_error);
    st["observed_generation"] = generation;  // refused; told once per edit of the spec
    event("Warning", "InvalidSpec", seen.spec_error + " (no master was started)");
    return r;
  }

  if (!seen.master_pod) {
    r.master = Reconciled::Master::Create;
    if (was.empty() || refused) {
      st["observed_generation"] = generation;  // the spec the master runs (the ConfigMap is written once)
      set_phase("Pending", "MasterCreated", "the master's pod is created");
      event("Normal", "MasterCreated", "created the job's master " + owned_names(name_of(job)).master);
    } else if (str(old, "master_uid").empty() || str(old, "master_uid") != str(old, "replaced_master_uid")) {
      // Not the operator's replacement of a master that ended (told then): deleted by someone, or lost.
      event("Warning", "MasterRecreated", "the master's pod was gone: a new one resumes the job from its event log");
    }
    return r;
  }
  const json& pod = *seen.master_pod;
  if (const std::string uid = str(field(pod, "metadata"), "uid"); !uid.empty()) st["master_uid"] = uid;
  if (!field(field(pod, "metadata"), "deletionTimestamp").is_null()) return r;  // going: then it is created anew
  const std::string pod_phase = str(field(pod, "status"), "phase");

  if (pod_phase == "Succeeded" || pod_phase == "Failed") {
    static const json kNone;
    const json& cs = list(field(pod, "status"), "containerStatuses");
    const json& term = cs.empty() ? kNone : field(field(cs[0], "state"), "terminated");
    const bool ended = term.is_object();
    const int64_t exit_code = ended ? num(term, "exitCode") : -1;
    const std::string message = str(term, "message");
    const json summary = json::parse(message, nullptr, false);
    if (summary.is_object()) take_figures(st, summary);
    if (pod_phase == "Succeeded" && exit_code == 0) {
      const std::string done = "completed " + std::to_string(num(st, "step")) + " steps; goodput " +
                               str(st, "goodput", "?") + ", " + std::to_string(num(st, "restarts")) + " restarts";
      set_phase("Succeeded", "Completed", done);
      event("Normal", "Succeeded", done);
      return r;
    }
    if (exit_code == 1 || exit_code == 2) {  // the job ended without completing, or its spec is bad: final
      std::string why = str(summary, "error");
      if (why.empty() && !str(st, "last_failure").empty()) why = "last failure: " + str(st, "last_failure");
      if (why.empty()) why = message.empty() ? "the master exited with code " + std::to_string(exit_code) : message;
      const std::string reason =
          exit_code == 2 ? "MasterRefusedSpec" : camel_case(str(summary, "finish_reason", "master_failed"));
      set_phase("Failed", reason, why);
      event("Warning", "Failed", reason + ": " + why);
      return r;
    }
    // Anything else (a crash, an OOM kill, exit 3: the master left with the job on, an eviction, a
    // lost node) is the master's trouble, not the job's: a new master resumes from the log.
    std::string how = ended ? "exit code " + std::to_string(exit_code) : "no exit status";
    if (const std::string reason = str(term, "reason"); !reason.empty()) how += ", " + reason;
    if (const std::string reason = str(field(pod, "status"), "reason"); !reason.empty()) how += ", " + reason;
    const std::string uid = str(field(pod, "metadata"), "uid");
    if (str(old, "replaced_master_uid") != uid) {  // not counted yet (the operator may have stopped after counting)
      const int64_t n = num(old, "master_restarts") + 1;
      st["master_restarts"] = n;
      st["replaced_master_uid"] = uid;
      if (n > kMasterRestartLimit) {
        const std::string why = "the master failed " + std::to_string(n) + " times; the last: " + how;
        set_phase("Failed", "MasterFailed", why);
        event("Warning", "Failed", "MasterFailed: " + why);
        return r;
      }
      event("Warning", "MasterRestarted", "the master ended (" + how + "): a new one resumes the job from its event log");
    }
    r.master = Reconciled::Master::Replace;
    return r;
  }

  if (pod_phase != "Running" || !seen.master) {  // scheduled, starting, or not answering (yet)
    if (was.empty() || was == "Pending")
      set_phase(pod_phase == "Running" ? "Starting" : "Pending", pod_phase == "Running" ? "MasterStarting" : "MasterPending",
                pod_phase == "Running" ? "the master is starting" : "the master's pod waits to be scheduled and started");
    return r;
  }

  // The master answers: its view of the job.
  const json& m = *seen.master;
  take_figures(st, m);
  const std::string phase = str(m, "phase");
  const std::string step_text = "step " + std::to_string(num(m, "step")) + " of " + std::to_string(num(m, "total_steps"));
  const std::string last = str(st, "last_failure");
  const bool new_failure = !last.empty() && last != str(old, "last_failure");
  if (new_failure) event("Warning", "Recovering", last);
  if (phase == "training") {
    set_phase("Running", "Training", step_text + " on " + str(st, "nodes") + " nodes");
    if (was == "Recovering" || new_failure)
      event("Normal", "Recovered", "training again at " + step_text + " (restart " + std::to_string(num(m, "restart")) + ")");
    else if (was != "Running")
      event("Normal", "Running", "training on " + str(st, "nodes") + " nodes");
  } else if (phase == "finished" || phase == "gave_up") {
    // The master is ending; its pod's exit says how (above). Until then, what it says.
    const std::string reason = str(m, "finish_reason", phase);
    if (reason == "completed") {
      set_phase("Running", "Completing", step_text + ": the job is complete, the master ends");
    } else {
      const std::string why = reason + (last.empty() ? "" : "; last failure: " + last);
      set_phase("Failed", camel_case(reason), why);
      event("Warning", "Failed", camel_case(reason) + ": " + why);
    }
  } else if (num(m, "failures") > 0) {
    const std::string diagnosis = str(field(m, "last_failure"), "diagnosis", "failure");
    set_phase("Recovering", camel_case(diagnosis), last.empty() ? phase : last);
  } else {
    set_phase("Starting", camel_case(phase), "the job is starting: " + phase);
  }
  return r;
}

}  // namespace goodput::kube
