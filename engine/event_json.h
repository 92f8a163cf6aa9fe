// Event <-> JSON. The encoding is canonical (keys sorted, integers only), so equal events give equal
// bytes and the log digest is meaningful. Decoding is strict: a missing or mistyped field throws
// EventDecodeError naming the field.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include "engine/event.h"

namespace goodput {

struct EventDecodeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

nlohmann::json payload_to_json(const EventPayload& payload);
// REQUIRES: type is an event type name. Throws EventDecodeError.
EventPayload payload_from_json(std::string_view type, const nlohmann::json& j);

// One line of the canonical form: {"seq":..,"t":..,"type":..,"data":{..}}
std::string event_to_line(const Event& e);
Event event_from_line(std::string_view line);  // throws EventDecodeError

std::optional<FailureKind> failure_kind_from(std::string_view s);
std::optional<Diagnosis> diagnosis_from(std::string_view s);
std::optional<RecoveryAction> recovery_action_from(std::string_view s);
std::optional<Tier> tier_from(std::string_view s);

}  // namespace goodput
