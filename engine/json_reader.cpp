#include "engine/json_reader.h"

#include <cmath>

namespace goodput {

ConfigReader::ConfigReader(const nlohmann::json& j, std::string where) : j_(j), where_(std::move(where)) {
  if (!j_.is_object()) throw ConfigError((where_.empty() ? std::string("configuration") : where_) + ": must be a JSON object");
}

void ConfigReader::fail(const char* key, const std::string& what) const {
  throw ConfigError("field '" + (where_.empty() ? std::string() : where_ + ".") + key + "' " + what);
}

std::string ConfigReader::text(const char* key, const std::string& fallback) {
  known_.insert(key);
  auto it = j_.find(key);
  if (it == j_.end()) return fallback;
  if (!it->is_string()) fail(key, "must be a string");
  return it->get<std::string>();
}

int64_t ConfigReader::integer(const char* key, int64_t fallback, int64_t min, int64_t max) {
  known_.insert(key);
  auto it = j_.find(key);
  if (it == j_.end()) return fallback;
  if (!it->is_number_integer()) fail(key, "must be an integer");
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(max))
    fail(key, "must be between " + std::to_string(min) + " and " + std::to_string(max));
  const int64_t v = it->get<int64_t>();
  if (v < min || v > max) fail(key, "must be between " + std::to_string(min) + " and " + std::to_string(max));
  return v;
}

bool ConfigReader::boolean(const char* key, bool fallback) {
  known_.insert(key);
  auto it = j_.find(key);
  if (it == j_.end()) return fallback;
  if (!it->is_boolean()) fail(key, "must be true or false");
  return it->get<bool>();
}

double ConfigReader::number(const char* key, double fallback, double min, double max) {
  known_.insert(key);
  auto it = j_.find(key);
  if (it == j_.end()) return fallback;
  if (!it->is_number()) fail(key, "must be a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < min || v > max)
    fail(key, "must be between " + std::to_string(min) + " and " + std::to_string(max));
  return v;
}

Duration ConfigReader::duration(const char* key, Duration fallback) {
  known_.insert(key);
  auto it = j_.find(key);
  if (it == j_.end()) return fallback;
  std::optional<Duration> d;
  if (it->is_number()) d = seconds_to_ns(it->get<double>());
  else if (it->is_string()) d = parse_duration(it->get<std::string>());
  else fail(key, "must be a duration (\"90s\", \"10m\", \"2h\") or a number of seconds");
  if (!d) fail(key, "is not a valid duration: " + it->dump() + " (use \"90s\", \"10m\", \"1h30m\" or seconds >= 0)");
  return *d;
}

const nlohmann::json* ConfigReader::child(const char* key) {
  known_.insert(key);
  auto it = j_.find(key);
  return it == j_.end() ? nullptr : &*it;
}

void ConfigReader::finish() const {
  for (auto it = j_.begin(); it != j_.end(); ++it)
    if (!known_.count(it.key())) fail(it.key().c_str(), "is not a known setting");
}

}  // namespace goodput
