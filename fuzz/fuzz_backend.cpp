// Fuzzes what the live side reads from outside: job specs (JOB.json, with its backend section), the
// Ray dashboard's answers (job details, job lists, the State API's node list), and the Kubernetes
// API's (watch frames, pods and nodes as the backend reads them, YAML as in a kubeconfig), and a
// GoodputJob as the operator reads it (its job spec, the objects it owns, and its reconciliation
// with the input's "pod" and "master" fields as the master's pod and /status). A parsed object or a
// ConfigError / RayError / KubeError out, never a crash.
#include <cstdint>
#include <string>

#include "backends/kubernetes/goodput_job.h"
#include "backends/kubernetes/kube_client.h"
#include "backends/kubernetes/kube_nodes.h"
#include "backends/live/job_spec.h"
#include "backends/ray/ray_client.h"
#include "engine/json_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // Every line as a watch frame (a stream cut anywhere), and what the backend reads of its object.
  for (size_t start = 0; start <= text.size();) {
    const size_t nl = std::min(text.find('\n', start), text.size());
    if (auto e = goodput::kube::parse_watch_frame(text.substr(start, nl - start))) {
      (void)goodput::kube::pod_trouble(e->object);
      (void)goodput::kube::node_trouble(e->object);
      (void)goodput::kube::pod_status(e->object);
    }
    start = nl + 1;
  }
  try {
    // As a kubeconfig: its files are never read (no file fields resolve to a real one here).
    const nlohmann::json doc = goodput::kube::yaml_to_json(std::string(text));
    const std::string dumped = doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (dumped.find("client-certificate\"") == std::string::npos && dumped.find("client-key\"") == std::string::npos)
      (void)goodput::kube::load_kubeconfig_json(doc, "/nonexistent/kubeconfig");
  } catch (const goodput::kube::KubeError&) {
  }
  auto j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  (void)goodput::kube::pod_trouble(j);
  (void)goodput::kube::node_trouble(j);
  (void)goodput::kube::pod_status(j);
  try {
    (void)goodput::ray::parse_job(j, "job");
  } catch (const goodput::ray::RayError&) {
  }
  try {
    (void)goodput::ray::parse_job_list(j, "jobs");
  } catch (const goodput::ray::RayError&) {
  }
  try {
    (void)goodput::ray::parse_node_list(j, "nodes");
  } catch (const goodput::ray::RayError&) {
  }
  // As a GoodputJob.
  try {
    (void)goodput::kube::job_spec_of(j, j.is_object() && j.contains("policy_doc") ? j["policy_doc"] : nlohmann::json());
  } catch (const goodput::ConfigError&) {
  }
  (void)goodput::kube::master_pod_for(j);
  (void)goodput::kube::service_for(j);
  (void)goodput::kube::log_claim_for(j);
  (void)goodput::kube::awaits_spec(j);
  goodput::kube::Observed seen;
  if (j.is_object() && j.contains("pod")) seen.master_pod = j["pod"];
  if (j.is_object() && j.contains("master")) seen.master = j["master"];
  if (j.is_object() && j.contains("spec_error")) seen.spec_error = "refused";
  (void)goodput::kube::reconcile(j, seen, "2026-12-07T00:00:00Z");
  // A policy given as a path would make the fuzzer read files: the policy parser has its own target.
  if (j.is_object() && j.contains("policy") && j["policy"].is_string()) j.erase("policy");
  try {
    const goodput::live::JobSpec s = goodput::live::job_spec_from_json(j, "", ".");
    (void)s.job_started();
  } catch (const goodput::ConfigError&) {
  }
  return 0;
}
