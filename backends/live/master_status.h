// What a live master shows: GET /status (JSON), GET /metrics (Prometheus text), GET / (the replay
// report's page, folded from the log as it stands) and its console lines. Pure renderings of what LiveMaster knows; they
// change nothing.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "backends/live/live_master.h"
#include "net/http.h"

namespace goodput::live {

// with_nodes: also every node's line (O(world): for /status, not for a line printed every second).
nlohmann::ordered_json status_of(const LiveMaster& master, bool with_nodes = true);
// `transport`: what the HTTP server refused before any handler saw a request.
std::string metrics_of(const LiveMaster& master, const net::HttpRefusals& transport = {});
std::string page_of(const LiveMaster& master);  // reloads itself every 5 s
// The console's line for a recovery decision: the node, its diagnosis, the failure behind it (if
// `last_failure` is that node's), the action and the rule that chose it.
std::string recovery_note(const World& world, const RecoveryDecided& decision, const FailureObserved* last_failure);

}  // namespace goodput::live
