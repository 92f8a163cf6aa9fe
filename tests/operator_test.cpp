// The GoodputJob operator's decisions (backends/kubernetes/goodput_job.h), without a cluster: the
// job spec a GoodputJob runs, the objects it owns, and the status, master action and Events that
// each thing the operator may see leads to. The operator end to end (the real kubectl, the emulated
// API server, real masters, agents and PyTorch trainers) is GoodputOperatorTest in test_kube.py.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "backends/kubernetes/goodput_job.h"
#include "backends/kubernetes/kube_client.h"
#include "backends/live/job_spec.h"
#include "engine/json_reader.h"

using namespace goodput;
using namespace goodput::kube;
using nlohmann::json;

namespace {

// The shipped example, as the API server returns it.
json example_job() {
  std::ifstream in(std::string(GOODPUT_SOURCE_DIR) + "/examples/unified/goodputjob.yaml");
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  json j = yaml_to_json(ss.str());
  j["metadata"]["namespace"] = "training";
  j["metadata"]["uid"] = "6f1c1a4e-0000-4000-8000-000000000001";
  j["metadata"]["generation"] = 1;
  return j;
}

json pod(const std::string& phase, const std::string& uid = "pod-1") {
  return {{"metadata", {{"name", "llama-ft-master"}, {"uid", uid}}}, {"status", {{"phase", phase}}}};
}
json ended(const std::string& phase, int code, const std::string& message, const std::string& uid = "pod-1") {
  json p = pod(phase, uid);
  json term = {{"exitCode", code}, {"reason", code == 0 ? "Completed" : "Error"}};
  if (!message.empty()) term["message"] = message;
  p["status"]["containerStatuses"] = {{{"name", "master"}, {"state", {{"terminated", term}}}}};
  return p;
}
json master_status(const std::string& phase, int64_t step, int restart, int failures, const json& last = nullptr) {
  return {{"phase", phase},     {"step", step},         {"total_steps", 100000}, {"restart", restart},
          {"failures", failures}, {"goodput", 0.975},  {"world_size", 4},       {"nodes_training", phase == "training" ? 4 : 3},
          {"last_failure", last}};
}

// One pass: the status it writes is what the next pass reads.
Reconciled pass(json& job, const Observed& seen, const std::string& now = "2026-12-07T10:00:00Z") {
  Reconciled r = reconcile(job, seen, now);
  job["status"] = r.status;
  return r;
}
std::string condition(const json& status, const std::string& type, const char* key = "status") {
  for (const json& c : status["conditions"])
    if (c["type"] == type) return c.value(key, "");
  return "";
}
std::vector<std::string> reasons(const Reconciled& r) {
  std::vector<std::string> out;
  for (const JobEvent& e : r.events) out.push_back(e.type + " " + e.reason);
  return out;
}

}  // namespace

TEST_CASE("a GoodputJob's job spec: its name, the backend the operator sets, the policy inline, checked as goodput run checks it") {
  const json job = example_job();
  // YAML's core schema (a policy_from ConfigMap is YAML too): 1.5 is a number, "2m" text, true a boolean.
  CHECK(job["spec"]["policy"]["recovery"]["oom_memory_factor"] == 1.5);
  CHECK(job["spec"]["policy"]["checkpoint"]["interval"] == "2m");
  CHECK(yaml_to_json("a: .5\nb: -2e3\nc: True\nd: '1.5'\ne:\nf: 1.2.3") ==
        json{{"a", 0.5}, {"b", -2000.0}, {"c", true}, {"d", "1.5"}, {"e", nullptr}, {"f", "1.2.3"}});
  const json spec = job_spec_of(job, nullptr);
  CHECK(spec["job"] == "llama-ft");
  CHECK(!spec.contains("master"));
  const json& b = spec["backend"];
  CHECK(b["type"] == "kubernetes");
  CHECK(b["namespace"] == "training");
  CHECK(b["master_url"] == "http://llama-ft-master.training.svc:8000");
  CHECK(b["token_secret"] == "llama-ft-token");
  CHECK(b["owner_references"][0]["uid"] == job["metadata"]["uid"]);
  CHECK(b["owner_references"][0]["controller"] == true);
  CHECK(spec["policy"]["checkpoint"]["policy"] == "flash");
  const live::JobSpec parsed = live::job_spec_from_json(spec, "", "/");
  CHECK(parsed.kube.token_secret == "llama-ft-token");
  CHECK(parsed.kube.owner_references.size() == 1);
  CHECK(parsed.nproc_per_node == 8);

  // spec.master.url is where the agents and the operator reach the master.
  json there = job;
  there["spec"]["master"] = {{"url", "http://10.0.0.5:8123"}, {"port", 8123}};
  CHECK(job_spec_of(there, nullptr)["backend"]["master_url"] == "http://10.0.0.5:8123");

  // A policy from a ConfigMap comes inline; both at once is an error.
  json from = job;
  from["spec"].erase("policy");
  const json policy = {{"name", "restart-all"}, {"recovery", {{"policy", "restart-all"}}}};
  CHECK(job_spec_of(from, policy)["policy"] == policy);
  CHECK_THROWS_WITH_AS(job_spec_of(job, policy), doctest::Contains("give spec.policy or spec.policy_from, not both"),
                       ConfigError);
}

TEST_CASE("what the schema cannot refuse, the operator does, naming the job and the field") {
  auto refused = [](const std::function<void(json&)>& change) {
    json job = example_job();
    change(job);
    try {
      (void)job_spec_of(job, nullptr);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  // Inside the policy (x-kubernetes-preserve-unknown-fields): an unknown key.
  CHECK(refused([](json& j) { j["spec"]["policy"]["recovery"]["max_restart"] = 3; }).find("GoodputJob training/llama-ft: ") == 0);
  CHECK(refused([](json& j) { j["spec"]["policy"]["recovery"]["max_restart"] = 3; }).find("max_restart") != std::string::npos);
  // A replica group's backend (also preserve-unknown).
  CHECK(refused([](json& j) {
          j["spec"]["replicas"] = {{{"type", "worker"}, {"count", 2}, {"backend", {{"memroy_mb", 1}}}}};
          j["spec"].erase("nodes");
        }).find("memroy_mb") != std::string::npos);
  // What the operator sets is not the user's.
  CHECK(refused([](json& j) { j["spec"]["backend"]["kubeconfig"] = "/root/.kube/config"; })
            .find("field 'spec.backend.kubeconfig' is not for a GoodputJob") != std::string::npos);
  CHECK(refused([](json& j) { j["spec"]["job"] = "other"; }).find("field 'spec.job'") != std::string::npos);
  CHECK(refused([](json& j) { j["spec"]["master"]["url"] = "ftp://x"; }).find("field 'spec.master.url'") != std::string::npos);
  CHECK(refused([](json& j) { j["spec"]["master"]["logs"] = 1; }).find("spec.master.logs") != std::string::npos);
  CHECK(refused([](json& j) { j["spec"]["backend"].erase("image"); }).find("image") != std::string::npos);
  CHECK(refused([](json&) {}) == "accepted");
}

TEST_CASE("the objects a GoodputJob owns: the master's pod resumes from its log volume, reads its token from the Secret") {
  json job = example_job();
  const json uid = job["metadata"]["uid"];
  const json p = master_pod_for(job);
  CHECK(p["metadata"]["name"] == "llama-ft-master");
  CHECK(p["metadata"]["labels"]["goodput/component"] == "master");
  CHECK(p["metadata"]["labels"]["goodput/job"] == "llama-ft");
  CHECK(p["metadata"]["ownerReferences"][0]["uid"] == uid);
  const json& c = p["spec"]["containers"][0];
  CHECK(c["image"] == "registry.example/goodput-trainer:1");  // backend.image unless master.image
  const std::string script = c["args"][0];
  CHECK(script.find("if [ -f /data/run/events.db ]; then resume=--resume; fi; exec '/usr/local/bin/goodput' run "
                    "/config/job.json --run-dir /data/run --listen 0.0.0.0 --port 8000 --detach-on-sigterm "
                    "--termination-log /dev/termination-log $resume") == 0);
  CHECK(c["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "llama-ft-token");
  CHECK(c["terminationMessagePolicy"] == "FallbackToLogsOnError");
  CHECK(p["spec"]["restartPolicy"] == "Never");
  CHECK(p["spec"]["serviceAccountName"] == "goodput-master");
  CHECK(p["spec"]["volumes"][0] == json{{"name", "config"}, {"configMap", {{"name", "llama-ft-job"}}}});
  CHECK(p["spec"]["volumes"][1] == json{{"name", "log"}, {"persistentVolumeClaim", {{"claimName", "llama-ft-log"}}}});
  CHECK(log_claim_for(job)["spec"]["resources"]["requests"]["storage"] == "1Gi");
  CHECK(service_for(job)["spec"]["selector"] == json{{"goodput/job", "llama-ft"}, {"goodput/component", "master"}});
  const json secret = token_secret_for(job, "s3cret");
  CHECK(secret["data"]["token"] == "czNjcmV0");
  CHECK(secret["metadata"]["ownerReferences"][0]["uid"] == uid);
  const json spec = job_spec_of(job, nullptr);
  CHECK(json::parse(config_map_for(job, spec)["data"]["job.json"].get<std::string>()) == spec);

  // A log volume the spec names: no claim of its own.
  job["spec"]["master"] = {{"log_volume", {{"persistentVolumeClaim", {{"claimName", "shared-logs"}}}}}, {"port", 9000}};
  CHECK(log_claim_for(job).is_null());
  const json q = master_pod_for(job);
  CHECK(q["spec"]["volumes"][1] == json{{"persistentVolumeClaim", {{"claimName", "shared-logs"}}}, {"name", "log"}});
  CHECK(q["spec"]["containers"][0]["ports"][0]["containerPort"] == 9000);
}

TEST_CASE("a job's life as the operator sees it: created, running, a failure and its recovery, a master lost, completed") {
  json job = example_job();
  CHECK(awaits_spec(job));
  Reconciled r = pass(job, {});
  CHECK(r.master == Reconciled::Master::Create);
  CHECK(job["status"]["phase"] == "Pending");
  CHECK(job["status"]["observed_generation"] == 1);
  CHECK(reasons(r) == std::vector<std::string>{"Normal MasterCreated"});
  CHECK_FALSE(awaits_spec(job));  // from now on the ConfigMap holds the spec the master runs

  r = pass(job, {"", pod("Pending"), std::nullopt});
  CHECK((r.master == Reconciled::Master::Keep && job["status"]["phase"] == "Pending" && r.events.empty()));
  r = pass(job, {"", pod("Running"), std::nullopt});
  CHECK(job["status"]["phase"] == "Starting");
  r = pass(job, {"", pod("Running"), master_status("rendezvous", 0, 0, 0)});
  CHECK(job["status"]["phase"] == "Starting");
  r = pass(job, {"", pod("Running"), master_status("training", 120, 0, 0)}, "2026-12-07T10:01:00Z");
  CHECK(job["status"]["phase"] == "Running");
  CHECK(job["status"]["nodes"] == "4/4");
  CHECK(job["status"]["step"] == 120);
  CHECK(job["status"]["goodput"] == "97.5%");
  CHECK(condition(job["status"], "Running") == "True");
  CHECK(condition(job["status"], "Running", "lastTransitionTime") == "2026-12-07T10:01:00Z");
  CHECK(reasons(r) == std::vector<std::string>{"Normal Running"});
  r = pass(job, {"", pod("Running"), master_status("training", 180, 0, 0)}, "2026-12-07T10:02:00Z");
  CHECK(r.events.empty());
  CHECK(condition(job["status"], "Running", "lastTransitionTime") == "2026-12-07T10:01:00Z");  // still True since then

  const json oom = {{"diagnosis", "out_of_memory"}, {"action", "relaunch_with_more_memory"},
                    {"message", "node llama-ft-worker-2 (slot 2): out_of_memory (node_lost: reason=OOMKilled) -> "
                                "relaunch_with_more_memory [oom]"}};
  r = pass(job, {"", pod("Running"), master_status("scheduling", 180, 0, 1, oom)});
  CHECK(job["status"]["phase"] == "Recovering");
  CHECK(condition(job["status"], "Recovering", "reason") == "OutOfMemory");
  CHECK(condition(job["status"], "Running") == "False");
  CHECK(job["status"]["nodes"] == "3/4");
  CHECK(reasons(r) == std::vector<std::string>{"Warning Recovering"});
  CHECK(r.events[0].message.find("OOMKilled") != std::string::npos);
  r = pass(job, {"", pod("Running"), master_status("scheduling", 180, 0, 1, oom)});
  CHECK(r.events.empty());  // the same failure is told once
  r = pass(job, {"", pod("Running"), master_status("training", 200, 1, 1, oom)});
  CHECK(job["status"]["phase"] == "Running");
  CHECK(job["status"]["restarts"] == 1);
  CHECK(reasons(r) == std::vector<std::string>{"Normal Recovered"});

  // The master's pod crashed (a SIGKILL: exit 137): replaced once, counted once even if seen twice.
  r = pass(job, {"", ended("Failed", 137, ""), std::nullopt});
  CHECK(r.master == Reconciled::Master::Replace);
  CHECK(job["status"]["master_restarts"] == 1);
  CHECK(reasons(r) == std::vector<std::string>{"Warning MasterRestarted"});
  CHECK(job["status"]["phase"] == "Running");  // the job itself trains on
  r = pass(job, {"", ended("Failed", 137, ""), std::nullopt});
  CHECK((r.master == Reconciled::Master::Replace && r.events.empty() && job["status"]["master_restarts"] == 1));
  // Gone because the operator deleted it: made again, resuming from the log, already told.
  r = pass(job, {"", std::nullopt, std::nullopt});
  CHECK(r.master == Reconciled::Master::Create);
  CHECK(r.events.empty());
  // Gone because someone deleted it (or its node went): made again, and said.
  r = pass(job, {"", pod("Running", "pod-1b"), std::nullopt});
  CHECK(job["status"]["master_uid"] == "pod-1b");
  r = pass(job, {"", std::nullopt, std::nullopt});
  CHECK(r.master == Reconciled::Master::Create);
  CHECK(reasons(r) == std::vector<std::string>{"Warning MasterRecreated"});
  CHECK(job["status"]["observed_generation"] == 1);
  // Being deleted: wait for it to go.
  json going = pod("Running", "pod-2");
  going["metadata"]["deletionTimestamp"] = "2026-12-07T10:05:00Z";
  CHECK(pass(job, {"", going, std::nullopt}).master == Reconciled::Master::Keep);

  // Completed: the master's termination message holds the final figures.
  const json summary = {{"exit", 0}, {"phase", "finished"}, {"finish_reason", "completed"}, {"step", 100000},
                        {"restart", 1}, {"goodput", 0.9612}, {"world_size", 4}, {"nodes_training", 0}, {"last_failure", oom}};
  r = pass(job, {"", ended("Succeeded", 0, summary.dump(), "pod-2"), std::nullopt});
  CHECK(job["status"]["phase"] == "Succeeded");
  CHECK(job["status"]["step"] == 100000);
  CHECK(job["status"]["goodput"] == "96.1%");
  CHECK(condition(job["status"], "Succeeded", "reason") == "Completed");
  CHECK(reasons(r) == std::vector<std::string>{"Normal Succeeded"});
  // And stays so: nothing more is done or said.
  const json before = job["status"];
  r = pass(job, {"", std::nullopt, std::nullopt});
  CHECK((r.master == Reconciled::Master::Keep && r.events.empty() && job["status"] == before));
}

TEST_CASE("how a job fails: a bad spec starts no master until it changes; the master's own verdicts; a master that keeps failing") {
  json job = example_job();
  Reconciled r = pass(job, {"GoodputJob training/llama-ft: field 'spec.policy.recovery.max_restart' is unknown", std::nullopt, std::nullopt});
  CHECK(r.master == Reconciled::Master::Keep);
  CHECK(job["status"]["phase"] == "Failed");
  CHECK(condition(job["status"], "Failed", "reason") == "InvalidSpec");
  CHECK(condition(job["status"], "Failed", "message").find("max_restart") != std::string::npos);
  CHECK(reasons(r) == std::vector<std::string>{"Warning InvalidSpec"});
  CHECK_FALSE(awaits_spec(job));  // the same spec again: left alone
  CHECK(pass(job, {"x", std::nullopt, std::nullopt}).events.empty());
  job["metadata"]["generation"] = 2;  // edited: looked at again
  CHECK(awaits_spec(job));
  json still_bad = job;  // and refused again if still bad, told again
  CHECK(reasons(pass(still_bad, {"field 'spec.nodes' ...", std::nullopt, std::nullopt})) ==
        std::vector<std::string>{"Warning InvalidSpec"});
  CHECK(still_bad["status"]["observed_generation"] == 2);
  r = pass(job, {});
  CHECK(r.master == Reconciled::Master::Create);
  CHECK(job["status"]["phase"] == "Pending");
  CHECK(job["status"]["observed_generation"] == 2);

  // The master ended the job without completing it (exit 1): its finish reason and last failure.
  json gave_up = job;
  const json summary = {{"exit", 1}, {"finish_reason", "gave_up"}, {"step", 400},
                        {"last_failure", {{"diagnosis", "hardware"}, {"message", "node w-1 (slot 1): hardware ..."}}}};
  r = pass(gave_up, {"", ended("Failed", 1, summary.dump()), std::nullopt});
  CHECK(gave_up["status"]["phase"] == "Failed");
  CHECK(condition(gave_up["status"], "Failed", "reason") == "GaveUp");
  CHECK(condition(gave_up["status"], "Failed", "message") == "last failure: node w-1 (slot 1): hardware ...");
  CHECK(r.master == Reconciled::Master::Keep);
  // A spec the master itself refused (exit 2): its error; a termination message that is not JSON (the log's tail) as it is.
  json refused = job;
  pass(refused, {"", ended("Failed", 2, R"({"exit":2,"error":"spec: field 'nodes' ..."})"), std::nullopt});
  CHECK(condition(refused["status"], "Failed", "reason") == "MasterRefusedSpec");
  CHECK(condition(refused["status"], "Failed", "message") == "spec: field 'nodes' ...");
  json crashed = job;
  pass(crashed, {"", ended("Failed", 1, "terminate called after throwing"), std::nullopt});
  CHECK(condition(crashed["status"], "Failed", "message") == "terminate called after throwing");

  // A master that keeps failing fails the job after kMasterRestartLimit replacements.
  for (int i = 1; i <= kMasterRestartLimit; ++i) {
    r = pass(job, {"", ended("Failed", 3, "", "pod-" + std::to_string(i)), std::nullopt});
    REQUIRE(r.master == Reconciled::Master::Replace);
  }
  r = pass(job, {"", ended("Failed", 137, "", "pod-last"), std::nullopt});
  CHECK(r.master == Reconciled::Master::Keep);
  CHECK(job["status"]["phase"] == "Failed");
  CHECK(condition(job["status"], "Failed", "reason") == "MasterFailed");
  CHECK_FALSE(awaits_spec(job));
}

TEST_CASE("camel_case turns diagnoses and finish reasons into condition reasons") {
  CHECK(camel_case("out_of_memory") == "OutOfMemory");
  CHECK(camel_case("gave_up") == "GaveUp");
  CHECK(camel_case("") == "Unknown");
}
