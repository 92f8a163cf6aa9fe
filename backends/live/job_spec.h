// A live job as a user writes it (JOB.json): the training command, the world, the cost model the
// report is computed under, the policy, and the supervision timeouts.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/event.h"
#include "engine/time.h"

namespace goodput::live {

struct JobSpec {
  std::string job;
  int32_t nodes = 1;
  std::vector<std::string> command;  // argv of one trainer; run without a shell
  std::map<std::string, std::string> env;
  int64_t total_steps = 0;
  Duration step_time = 100 * kMillisecond;  // expected step time: the report's cost model
  int32_t accelerators_per_node = 1;
  int64_t checkpoint_bytes_per_node = 0;
  int64_t memory_bandwidth_bytes_per_s = 2'000'000'000;
  int64_t storage_bandwidth_bytes_per_s = 200'000'000;
  nlohmann::json policy;  // a policy document; null: the default policy
  std::string policy_name = "default";
  std::string storage_dir;            // empty: <run dir>/checkpoints
  int64_t data_shards = 0;            // 0: no data-shard service
  int64_t memory_limit_mb = 0;        // address-space limit of each trainer (prlimit); 0: none
  Duration heartbeat_interval = 250 * kMillisecond;
  Duration heartbeat_timeout = 5 * kSecond;
  Duration hang_timeout = 30 * kSecond;  // a trainer that reports nothing this long is hung
  Duration failure_settle = 300 * kMillisecond;  // collect the exits one failure causes, then diagnose
  double straggler_factor = 1.5;  // a rank doing this many times the typical rank's work per step; 0: off

  JobStarted job_started() const;
};

// Strict: unknown keys and bad values are errors naming the file and field. A relative policy
// path is read relative to the spec file.
JobSpec load_job_spec(const std::string& path);
JobSpec job_spec_from_json(const nlohmann::json& j, const std::string& where, const std::string& base_dir);

}  // namespace goodput::live
