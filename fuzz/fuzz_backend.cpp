// Fuzzes what the live side reads from outside: job specs (JOB.json, with its backend section) and
// the Ray dashboard's answers (job details, job lists, the State API's node list). JSON in; a
// JobSpec, parsed Ray objects, or a ConfigError / RayError out, never a crash.
#include <cstdint>
#include <string>

#include "backends/live/job_spec.h"
#include "backends/ray/ray_client.h"
#include "engine/json_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
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
  // A policy given as a path would make the fuzzer read files: the policy parser has its own target.
  if (j.is_object() && j.contains("policy") && j["policy"].is_string()) j.erase("policy");
  try {
    const goodput::live::JobSpec s = goodput::live::job_spec_from_json(j, "", ".");
    (void)s.job_started();
  } catch (const goodput::ConfigError&) {
  }
  return 0;
}
