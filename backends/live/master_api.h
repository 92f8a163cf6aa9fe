// The live master's HTTP API: routing, the bearer token, who may read the status endpoints, and the
// wire format of each request. Requests are read strictly (a key the master does not know, or a
// field of the wrong type, is a 400 naming it: a mistake or an agent of another version is refused
// rather than ignored) into the typed messages of agent_protocol.h, and handed to LiveMaster. It
// keeps no job state: what it refuses, LiveMaster counts (for /metrics and the log).
//
//   GET  /healthz                   200 "ok": says nothing of the job, never wants the token
//   GET  /status, /metrics, /       the master's state (master_status.h); ReadAccess says who may
//   POST /v1/register, /v1/heartbeat, /v1/exit, /v1/shards/next, /v1/shards/complete   agents
//   POST /v1/inject, /v1/check, /v1/scale                                             operators
#pragma once

#include <functional>
#include <string>

#include "backends/live/live_master.h"
#include "net/http.h"

namespace goodput::live {

// Who may read the master's status endpoints (GET /status, / and /metrics; the agent API always
// wants the token). Auto: open on a loopback address; elsewhere /status and the page want the token
// and /metrics stays open for a Prometheus scraper.
enum class ReadAccess : uint8_t { Auto, Open, Token };

class MasterApi {
 public:
  MasterApi(LiveMaster& master, std::string token) : master_(master), token_(std::move(token)) {}

  net::HttpResponse handle(const net::HttpRequest& request);
  // How the status endpoints are served: `access` for a master listening on `listen_address`.
  void set_read_access(ReadAccess access, const std::string& listen_address);
  // Where /metrics reads the HTTP server's own refusals (requests no handler saw).
  void set_transport_refusals(std::function<net::HttpRefusals()> refusals) { transport_refusals_ = std::move(refusals); }

 private:
  LiveMaster& master_;
  std::string token_;
  bool status_needs_token_ = false, metrics_need_token_ = false;
  std::function<net::HttpRefusals()> transport_refusals_;
};

}  // namespace goodput::live
