#include "backends/live/master_api.h"

#include <algorithm>
#include <climits>

#include <boost/asio/ip/address.hpp>

#include "backends/live/master_status.h"
#include "engine/event_json.h"

namespace goodput::live {

using nlohmann::json;

namespace {

// Text from agents and request paths may hold any bytes: invalid UTF-8 is replaced, never thrown.
net::HttpResponse reply(int status, const json& body) {
  return {status, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace)};
}
net::HttpResponse error(int status, const std::string& what) { return reply(status, json{{"error", what}}); }

bool same_token(const std::string& a, const std::string& b) {  // constant time in the secret's length
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Typed access to request JSON: a missing or mistyped field is the sender's bug, answered with 400.
struct BadRequest : std::runtime_error {
  using std::runtime_error::runtime_error;
};
template <class T> T field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) throw BadRequest(std::string("field '") + key + "' is missing");
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw BadRequest(std::string("field '") + key + "' has the wrong type");
  }
}
template <class T> T field_or(const json& j, const char* key, T fallback) {
  return j.contains(key) && !j[key].is_null() ? field<T>(j, key) : fallback;
}
// A body (or the object at `where` in it) may hold these keys and no others: a key the master does
// not know is a mistake (`{"name": 5}` for `{"slots": [5]}`) or an agent of another version, and is
// refused rather than ignored.
void only_keys(const json& j, std::initializer_list<std::string_view> keys, const std::string& where = "") {
  for (const auto& [k, _] : j.items())
    if (std::find(keys.begin(), keys.end(), k) == keys.end())
      throw BadRequest("unknown field '" + where + k.substr(0, 100) + "'");
}
uint16_t port_field(const json& j, const char* key) {  // 0: not said (or not a port)
  const int64_t port = field_or<int64_t>(j, key, 0);
  return port > 0 && port < 65536 ? static_cast<uint16_t>(port) : 0;
}
std::string reason_field(const json& b) {
  std::string reason = field_or<std::string>(b, "reason", "");
  if (reason.size() > 1000) throw BadRequest("field 'reason' must be at most 1000 characters");
  return reason;
}

// The address other ranks reach a node at: what its agent says, else where its request came from
// (a pod's or a Ray node's own IP; 127.0.0.1 for local nodes).
std::string host_of(const json& body, const std::string& peer_address) {
  const auto it = body.find("host");
  if (it != body.end() && it->is_string() && !it->get<std::string>().empty()) return it->get<std::string>();
  return peer_address.empty() ? "127.0.0.1" : peer_address;
}

RegisterRequest read_register(const json& b, const std::string& peer_address) {
  only_keys(b, {"name", "pid", "host", "slot", "check_port", "rdzv_port", "replica_port"});
  RegisterRequest r;
  r.name = field<std::string>(b, "name");
  if (r.name.empty() || r.name.size() > 253) throw BadRequest("field 'name' must be 1 to 253 characters");
  r.host = host_of(b, peer_address);
  r.slot = field_or<int64_t>(b, "slot", -1);
  r.check_port = static_cast<uint16_t>(std::clamp<int64_t>(field_or<int64_t>(b, "check_port", 0), 0, 65535));
  r.rdzv_port = static_cast<uint16_t>(std::clamp<int64_t>(field_or<int64_t>(b, "rdzv_port", 0), 0, 65535));
  r.replica_port = static_cast<uint16_t>(std::clamp<int64_t>(field_or<int64_t>(b, "replica_port", 0), 0, 65535));
  return r;
}

TrainerReport read_trainer(const json& t) {
  only_keys(t, {"restart", "phase", "pid", "step", "progress_age_ms", "saves", "save_blocking_ns", "saved_step", "done",
                "storage_steps", "stopped", "loaded", "loss", "work_median_s", "work_mad_s", "exit", "processes", "ranks"},
            "trainer.");
  TrainerReport r;
  r.restart = field<int32_t>(t, "restart");
  r.phase = field<std::string>(t, "phase");
  r.pid = field_or<int64_t>(t, "pid", 0);
  r.step = field_or<int64_t>(t, "step", 0);
  r.progress_age_ms = field_or<int64_t>(t, "progress_age_ms", 0);
  r.stopped = field_or<bool>(t, "stopped", false);
  r.done = field_or<bool>(t, "done", false);
  if (t.contains("loss") && t["loss"].is_number()) r.loss = t["loss"].get<double>();
  r.work_median_s = field_or<double>(t, "work_median_s", -1);
  r.work_mad_s = field_or<double>(t, "work_mad_s", -1);
  r.saves = field_or<int64_t>(t, "saves", 0);
  r.save_blocking_ns = field_or<int64_t>(t, "save_blocking_ns", 0);
  r.saved_step = field_or<int64_t>(t, "saved_step", -1);
  r.storage_steps = field_or<std::vector<int64_t>>(t, "storage_steps", {});
  if (const auto l = t.find("loaded"); l != t.end() && l->is_object()) {
    const auto tier = tier_from(field<std::string>(*l, "tier"));
    if (!tier) throw BadRequest("field 'loaded.tier' must be none, memory, peer or storage");
    r.loaded = CheckpointLoaded{field<int64_t>(*l, "step"), *tier, field<int64_t>(*l, "ns")};
  }
  if (const auto x = t.find("exit"); x != t.end() && x->is_object()) {
    only_keys(*x, {"code", "signal", "reason", "done", "age_ms", "local_rank", "rank"}, "trainer.exit.");
    r.exit = TrainerReport::Exit{field_or<int32_t>(*x, "code", 0),         field_or<int32_t>(*x, "signal", 0),
                                 field_or<std::string>(*x, "reason", ""),  field_or<bool>(*x, "done", false),
                                 field_or<int64_t>(*x, "age_ms", 0),       field_or<int32_t>(*x, "local_rank", -1),
                                 field_or<int32_t>(*x, "rank", -1)};
  }
  r.processes = field_or<int32_t>(t, "processes", 1);
  if (r.processes < 1 || r.processes > 1024) throw BadRequest("field 'trainer.processes' must be 1 to 1024");
  if (const auto ranks = t.find("ranks"); ranks != t.end()) {
    if (!ranks->is_array() || ranks->size() != static_cast<size_t>(r.processes))
      throw BadRequest("field 'trainer.ranks' must be a list of one report per process ('trainer.processes')");
    for (const json& p : *ranks)
      if (!p.is_object()) throw BadRequest("field 'trainer.ranks' must hold objects");
    r.ranks = *ranks;  // shown as it came in /status; nothing is decided on it
  }
  return r;
}

AgentReport read_heartbeat(const json& b, const std::string& peer_address) {
  only_keys(b, {"node", "trainer", "check", "check_port", "rdzv_port", "persist_error", "host", "leaving", "replica_port",
                "held", "replica_error", "fetch_error"});
  AgentReport r;
  const int64_t node = field<int64_t>(b, "node");
  r.node = node > INT32_MAX ? -1 : static_cast<NodeId>(node);
  r.host = host_of(b, peer_address);
  r.check_port = port_field(b, "check_port");
  r.rdzv_port = port_field(b, "rdzv_port");
  r.persist_error = field_or<std::string>(b, "persist_error", "").substr(0, 1000);
  r.replica_port = port_field(b, "replica_port");
  r.replica_error = field_or<std::string>(b, "replica_error", "").substr(0, 1000);
  r.fetch_error = field_or<std::string>(b, "fetch_error", "").substr(0, 2000);
  if (const auto h = b.find("held"); h != b.end()) {
    // The copies of other nodes' checkpoints this node holds: [[rank, step], ...].
    if (!h->is_array() || h->size() > 65536) throw BadRequest("field 'held' must be a list of [rank, step] pairs");
    for (const json& e : *h) {
      if (!e.is_array() || e.size() != 2 || !e[0].is_number_integer() || !e[1].is_number_integer() || e[0].get<int64_t>() < 0 ||
          e[0].get<int64_t>() > INT32_MAX)
        throw BadRequest("field 'held' must be a list of [rank, step] pairs");
      r.held.emplace_back(e[0].get<int32_t>(), e[1].get<int64_t>());
    }
    std::sort(r.held.begin(), r.held.end());
  }
  if (const auto c = b.find("check"); c != b.end() && c->is_object()) {
    only_keys(*c, {"round", "id", "compute_mflops", "compute_ok", "link_mb_per_s", "link_ok", "error"}, "check.");
    CheckReport cr;
    cr.mflops = std::max<int64_t>(field_or<int64_t>(*c, "compute_mflops", 0), 0);
    cr.compute_ok = field_or<bool>(*c, "compute_ok", false);
    if (c->contains("link_ok")) cr.link_ok = field<bool>(*c, "link_ok");
    cr.link = std::max<int64_t>(field_or<int64_t>(*c, "link_mb_per_s", 0), 0);
    cr.error = field_or<std::string>(*c, "error", "").substr(0, 1000);
    r.check = std::make_pair(field_or<int64_t>(*c, "id", 0), std::move(cr));
  }
  if (b.contains("leaving")) r.leaving = field<std::string>(b, "leaving").substr(0, 300);
  if (const auto t = b.find("trainer"); t != b.end() && t->is_object()) r.trainer = read_trainer(*t);
  return r;
}

json read_check(LiveMaster& m, const json& b) {
  only_keys(b, {"slots", "all", "fault", "reason", "now"});
  // Which nodes, said explicitly: a body that names none (or the wrong key) must not stop the
  // whole world for a check.
  const bool all = field_or<bool>(b, "all", false);
  if (all == b.contains("slots")) throw BadRequest("give either 'slots' (a list of slot numbers) or \"all\": true");
  std::vector<int32_t> slots;
  if (const auto it = b.find("slots"); it != b.end()) {
    if (!it->is_array()) throw BadRequest("field 'slots' must be a list of slot numbers");
    for (const json& s : *it) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() > 1'000'000)
        throw BadRequest("field 'slots' must be a list of slot numbers");
      slots.push_back(static_cast<int32_t>(s.get<int64_t>()));
    }
    if (slots.empty()) throw BadRequest("field 'slots' is empty (\"all\": true checks every node)");
  }
  const std::string reason = reason_field(b);
  try {
    return m.request_check(slots, field_or<std::string>(b, "fault", ""), reason, field_or<bool>(b, "now", false));
  } catch (const std::invalid_argument& e) {
    throw ApiError(409, e.what());
  }
}

json read_scale(LiveMaster& m, const json& b) {
  only_keys(b, {"group", "count", "reason"});
  const std::string reason = reason_field(b);
  const int64_t count = field<int64_t>(b, "count");
  if (count < 0 || count > kMaxNodes) throw BadRequest("field 'count' must be from 0 to " + std::to_string(kMaxNodes));
  try {
    return m.request_scale(field<std::string>(b, "group"), static_cast<int32_t>(count), reason);
  } catch (const std::invalid_argument& e) {
    throw ApiError(409, e.what());
  }
}

json read_inject(LiveMaster& m, const json& b) {
  only_keys(b, {"fault", "slot", "local_rank"});
  try {
    return m.inject(field<std::string>(b, "fault"), field<int32_t>(b, "slot"), field_or<int32_t>(b, "local_rank", 0));
  } catch (const std::invalid_argument& e) {
    throw BadRequest(e.what());
  }
}

}  // namespace

void MasterApi::set_read_access(ReadAccess access, const std::string& listen_address) {
  boost::system::error_code ec;
  const auto addr = boost::asio::ip::make_address(listen_address, ec);
  const bool loopback = !ec && addr.is_loopback();
  status_needs_token_ = access == ReadAccess::Token || (access == ReadAccess::Auto && !loopback);
  metrics_need_token_ = access == ReadAccess::Token;
}

net::HttpResponse MasterApi::handle(const net::HttpRequest& req) {
  const std::string path = req.target.substr(0, req.target.find('?'));
  const bool authorized = same_token(req.authorization, "Bearer " + token_);
  auto refuse_token = [&] {
    master_.refused_token(req.peer_address);
    return error(401, "missing or wrong bearer token");
  };
  if (req.method == "GET" && path == "/healthz") return {200, "text/plain", "ok\n"};
  if (req.method == "GET" && (path == "/status" || path == "/metrics" || path == "/")) {
    if (!authorized && (path == "/metrics" ? metrics_need_token_ : status_needs_token_)) return refuse_token();
    // ?nodes=0: without the node table (a 10,000-node job's is a megabyte, and pollers need the counts).
    if (path == "/status") return reply(200, status_of(master_, req.target.find("nodes=0") == std::string::npos));
    if (path == "/metrics")
      return {200, "text/plain; version=0.0.4",
              metrics_of(master_, transport_refusals_ ? transport_refusals_() : net::HttpRefusals{})};
    return {200, "text/html; charset=utf-8", page_of(master_)};
  }
  if (path.rfind("/v1/", 0) != 0) return error(404, "no such endpoint: " + path);
  if (!authorized) return refuse_token();
  if (req.method != "POST") return error(405, "use POST");
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::exception&) {
    master_.refused_request();
    return error(400, "body is not valid JSON");
  }
  if (!body.is_object()) {
    master_.refused_request();
    return error(400, "body must be a JSON object");
  }
  try {
    if (path == "/v1/register") return reply(200, master_.register_node(read_register(body, req.peer_address)));
    if (path == "/v1/heartbeat" || path == "/v1/exit")
      return reply(200, master_.heartbeat(read_heartbeat(body, req.peer_address)));
    if (path == "/v1/shards/next") {
      only_keys(body, {"node", "restart", "request", "local_rank"});
      const int64_t local_rank = field_or<int64_t>(body, "local_rank", 0);
      if (local_rank < 0 || local_rank > 1023) throw BadRequest("field 'local_rank' must be 0 to 1023");
      return reply(200, master_.next_shard(field<int32_t>(body, "node"), field<int32_t>(body, "restart"),
                                           field_or<int64_t>(body, "request", -1), static_cast<int32_t>(local_rank)));
    }
    if (path == "/v1/shards/complete") {
      only_keys(body, {"node", "restart", "step", "shards"});
      return reply(200, master_.complete_shards(field<int32_t>(body, "node"), field<int64_t>(body, "step"),
                                                field<std::vector<int64_t>>(body, "shards")));
    }
    if (path == "/v1/inject") return reply(200, read_inject(master_, body));
    if (path == "/v1/check") return reply(200, read_check(master_, body));
    if (path == "/v1/scale") return reply(200, read_scale(master_, body));
    return error(404, "no such endpoint: " + path);
  } catch (const BadRequest& e) {
    master_.refused_request();
    return error(400, e.what());
  } catch (const ApiError& e) {
    return error(e.status, e.what());
  }
}

}  // namespace goodput::live
