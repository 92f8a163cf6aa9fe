#include "backends/ray/ray_client.h"

#include <chrono>
#include <thread>

namespace goodput::ray {

using nlohmann::json;

namespace {

std::string text_of(const json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? std::string() : it->is_string() ? it->get<std::string>() : it->dump();
}

void need(const char* key, bool ok, const std::string& where, const char* what) {
  if (!ok) throw RayError(where + ": field '" + key + "' " + what, 0, false);
}

// IDs go into URL paths: Goodput only makes IDs of letters, digits, '-' and '_'.
const std::string& path_id(const std::string& id) {
  for (char c : id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'))
      throw std::invalid_argument("not a Ray submission id: " + id);
  return id;
}

std::string first_line(std::string s) {
  s = s.substr(0, s.find('\n'));
  return s.size() > 300 ? s.substr(0, 300) + "..." : s;
}

}  // namespace

json SubmitRequest::to_json() const {
  json j = {{"entrypoint", entrypoint}, {"submission_id", submission_id}};
  j["runtime_env"] = {{"env_vars", env_vars}};
  j["metadata"] = metadata;
  j["entrypoint_num_cpus"] = num_cpus;
  j["entrypoint_num_gpus"] = num_gpus;
  j["entrypoint_memory"] = memory_bytes;
  j["entrypoint_resources"] = resources;
  return j;
}

RayJob parse_job(const json& j, const std::string& where) {
  if (!j.is_object()) throw RayError(where + ": a job must be a JSON object", 0, false);
  RayJob r;
  r.status = text_of(j, "status");
  need("status", r.status == "PENDING" || r.status == "RUNNING" || r.status == "STOPPED" ||
                        r.status == "SUCCEEDED" || r.status == "FAILED",
       where, "must be PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED");
  r.submission_id = text_of(j, "submission_id");
  r.job_id = text_of(j, "job_id");
  r.message = text_of(j, "message");
  r.error_type = text_of(j, "error_type");
  r.entrypoint = text_of(j, "entrypoint");
  r.driver_node_id = text_of(j, "driver_node_id");
  if (const auto it = j.find("driver_exit_code"); it != j.end() && !it->is_null()) {
    need("driver_exit_code", it->is_number_integer(), where, "must be an integer or null");
    r.driver_exit_code = it->get<int>();
  }
  if (const auto it = j.find("metadata"); it != j.end() && !it->is_null()) {
    need("metadata", it->is_object(), where, "must be an object");
    r.metadata = *it;
  }
  return r;
}

std::vector<RayJob> parse_job_list(const json& j, const std::string& where) {
  if (!j.is_array()) throw RayError(where + ": the job list must be a JSON array", 0, false);
  std::vector<RayJob> out;
  for (size_t i = 0; i < j.size(); ++i) out.push_back(parse_job(j[i], where + "[" + std::to_string(i) + "]"));
  return out;
}

std::vector<RayNode> parse_node_list(const json& j, const std::string& where) {
  // The State API's envelope: {"result": bool, "msg": str, "data": {"result": ListApiResponse}}.
  if (!j.is_object() || !j.contains("result") || !j["result"].is_boolean())
    throw RayError(where + ": not a dashboard response (no boolean 'result')", 0, false);
  if (!j["result"].get<bool>()) throw RayError(where + ": the dashboard says: " + text_of(j, "msg"), 0, true);
  const json* list = nullptr;
  if (j.contains("data") && j["data"].is_object() && j["data"].contains("result") && j["data"]["result"].is_object())
    list = &j["data"]["result"];
  if (!list || !list->contains("result") || !(*list)["result"].is_array())
    throw RayError(where + ": field 'data.result.result' must be the list of nodes", 0, false);
  std::vector<RayNode> out;
  for (const json& n : (*list)["result"]) {
    if (!n.is_object()) throw RayError(where + ": a node must be a JSON object", 0, false);
    RayNode r;
    r.node_id = text_of(n, "node_id");
    r.node_ip = text_of(n, "node_ip");
    r.state = text_of(n, "state");
    r.state_message = text_of(n, "state_message");
    if (const auto it = n.find("is_head_node"); it != n.end() && !it->is_null()) {
      need("is_head_node", it->is_boolean(), where, "must be true or false");
      r.is_head_node = it->get<bool>();
    }
    if (r.node_id.empty()) throw RayError(where + ": a node has no 'node_id'", 0, false);
    if (r.state != "ALIVE" && r.state != "DEAD")
      throw RayError(where + ": node " + r.node_id + ": field 'state' must be ALIVE or DEAD", 0, false);
    out.push_back(std::move(r));
  }
  return out;
}

RayClient::RayClient(const std::string& address, net::Headers headers, RetryOptions retry)
    : address_(address), url_(net::Url::parse(address)), headers_(std::move(headers)), retry_(retry) {}

net::HttpResponse RayClient::call(const std::string& method, const std::string& target, const std::string& body) {
  int backoff = retry_.first_backoff_ms;
  for (int attempt = 1;; ++attempt) {
    ++calls_;
    const auto r = net::http_request(url_, method, target, headers_, body, retry_.timeout_ms);
    std::string why;
    int status = 0;
    if (!r) why = "no answer from the Ray dashboard at " + address_;
    else if (r->status == 429 || r->status >= 500) {
      status = r->status;
      why = "the Ray dashboard answered " + std::to_string(r->status) + ": " + first_line(r->body);
    } else {
      return *r;
    }
    if (attempt >= retry_.attempts) throw RayError(method + " " + target + ": " + why, status, true);
    ++retries_;
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff));
    backoff = std::min(backoff * 2, retry_.max_backoff_ms);
  }
}

json RayClient::call_json(const std::string& method, const std::string& target, const std::string& body) {
  const net::HttpResponse r = call(method, target, body);
  if (r.status != 200)
    throw RayError(method + " " + target + ": the Ray dashboard answered " + std::to_string(r.status) + ": " +
                       first_line(r.body),
                   r.status, false);
  try {
    return json::parse(r.body);
  } catch (const json::exception&) {
    throw RayError(method + " " + target + ": the answer is not JSON: " + first_line(r.body), r.status, false);
  }
}

std::string RayClient::ray_version() {
  const json j = call_json("GET", "/api/version", "");
  if (!j.is_object() || !j.contains("ray_version") || !j["ray_version"].is_string())
    throw RayError("GET /api/version: field 'ray_version' must be a string", 200, false);
  return j["ray_version"].get<std::string>();
}

void RayClient::submit(const SubmitRequest& request) {
  path_id(request.submission_id);
  const net::HttpResponse r = call("POST", "/api/jobs/", request.to_json().dump());
  if (r.status == 200) return;
  // A try whose answer was lost may have created the job: Ray refuses the same submission_id
  // twice, and the job that is there is ours.
  if (r.status == 400 && r.body.find("already exists") != std::string::npos) {
    if (job(request.submission_id)) return;
  }
  throw RayError("submitting " + request.submission_id + ": the Ray dashboard answered " + std::to_string(r.status) +
                     ": " + first_line(r.body),
                 r.status, false);
}

std::optional<RayJob> RayClient::job(const std::string& submission_id) {
  const std::string target = "/api/jobs/" + path_id(submission_id);
  const net::HttpResponse r = call("GET", target, "");
  if (r.status == 404) return std::nullopt;
  if (r.status != 200)
    throw RayError("GET " + target + ": " + std::to_string(r.status) + ": " + first_line(r.body), r.status, false);
  try {
    return parse_job(json::parse(r.body), "GET " + target);
  } catch (const json::exception&) {
    throw RayError("GET " + target + ": the answer is not JSON: " + first_line(r.body), r.status, false);
  }
}

std::vector<RayJob> RayClient::jobs() { return parse_job_list(call_json("GET", "/api/jobs/", ""), "GET /api/jobs/"); }

namespace {
// {"stopped": bool} / {"deleted": bool}
bool flag(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_boolean())
    throw RayError(where + ": field '" + key + "' must be true or false", 200, false);
  return j[key].get<bool>();
}
}  // namespace

bool RayClient::stop(const std::string& submission_id) {
  const std::string target = "/api/jobs/" + path_id(submission_id) + "/stop";
  return flag(call_json("POST", target, ""), "stopped", "POST " + target);
}

bool RayClient::remove(const std::string& submission_id) {
  const std::string target = "/api/jobs/" + path_id(submission_id);
  return flag(call_json("DELETE", target, ""), "deleted", "DELETE " + target);
}

std::string RayClient::logs(const std::string& submission_id) {
  const std::string target = "/api/jobs/" + path_id(submission_id) + "/logs";
  const json j = call_json("GET", target, "");
  if (!j.is_object() || !j.contains("logs") || !j["logs"].is_string())
    throw RayError("GET " + target + ": field 'logs' must be a string", 200, false);
  return j["logs"].get<std::string>();
}

std::vector<RayNode> RayClient::nodes(int timeout_s) {
  const std::string target = "/api/v0/nodes?limit=10000&timeout=" + std::to_string(timeout_s);
  return parse_node_list(call_json("GET", target, ""), "GET " + target);
}

}  // namespace goodput::ray
