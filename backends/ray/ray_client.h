// A client for the Ray dashboard's HTTP API (default port 8265): the Jobs API (submit, get, list,
// stop, delete, logs), the version, and the State API's node list. Failures the dashboard may
// recover from (no answer, a dropped connection, 429, 5xx) are retried with exponential backoff;
// the rest are RayError with the dashboard's own words (its errors are plain text, not JSON).
#pragma once

#include <atomic>

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "net/http.h"

namespace goodput::ray {

struct RayError : std::runtime_error {
  RayError(const std::string& what, int status, bool retryable)
      : std::runtime_error(what), status(status), retryable(retryable) {}
  int status = 0;  // HTTP status; 0: no answer
  bool retryable = false;
};

// Ray's JobStatus: PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED.
struct RayJob {
  std::string submission_id;
  std::string job_id;
  std::string status;
  std::string message;
  std::string error_type;
  std::string entrypoint;
  std::string driver_node_id;
  std::optional<int> driver_exit_code;
  nlohmann::json metadata = nlohmann::json::object();
  bool terminal() const { return status == "STOPPED" || status == "SUCCEEDED" || status == "FAILED"; }
};

struct RayNode {
  std::string node_id;
  std::string node_ip;
  std::string state;  // ALIVE or DEAD
  std::string state_message;
  bool is_head_node = false;
};

struct SubmitRequest {
  std::string entrypoint;  // a shell command line
  std::string submission_id;
  std::map<std::string, std::string> env_vars;  // runtime_env.env_vars
  std::map<std::string, std::string> metadata;
  double num_cpus = 0;
  double num_gpus = 0;
  int64_t memory_bytes = 0;
  std::map<std::string, double> resources;
  nlohmann::json to_json() const;
};

// The parsers are strict about what Goodput reads and tolerant of fields it does not (Ray adds
// fields between versions). `where` names the response in errors.
RayJob parse_job(const nlohmann::json& j, const std::string& where);
std::vector<RayJob> parse_job_list(const nlohmann::json& j, const std::string& where);
std::vector<RayNode> parse_node_list(const nlohmann::json& j, const std::string& where);

struct RetryOptions {
  int attempts = 6;            // tries per call
  int first_backoff_ms = 100;  // doubles after each failed try
  int max_backoff_ms = 3000;
  int timeout_ms = 5000;       // per try
};

class RayClient {
 public:
  RayClient(const std::string& address, net::Headers headers, RetryOptions retry = {});

  std::string ray_version();
  // Submits once: a retry after a lost answer finds the job its first try created (the
  // submission_id makes a submit idempotent), so a job is never started twice.
  void submit(const SubmitRequest& request);
  std::optional<RayJob> job(const std::string& submission_id);  // nullopt: no such job (404)
  std::vector<RayJob> jobs();
  bool stop(const std::string& submission_id);    // false: it had already ended
  bool remove(const std::string& submission_id);  // only an ended job can be deleted
  std::string logs(const std::string& submission_id);
  std::vector<RayNode> nodes(int timeout_s = 5);  // the State API needs its timeout sent every time

  int64_t calls() const { return calls_; }
  int64_t retries() const { return retries_; }

 private:
  net::HttpResponse call(const std::string& method, const std::string& target, const std::string& body);
  nlohmann::json call_json(const std::string& method, const std::string& target, const std::string& body);

  std::string address_;
  net::Url url_;
  net::Headers headers_;
  RetryOptions retry_;
  std::atomic<int64_t> calls_{0};  // atomic: a provider's workers call at once
  std::atomic<int64_t> retries_{0};
};

}  // namespace goodput::ray
