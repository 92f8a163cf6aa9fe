// Readers for what the API server (or a fuzzer) sends: a missing or mistyped field reads as empty,
// never as an exception. Shared by the backend (pods, nodes) and the operator (GoodputJobs).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace goodput::kube {

inline const nlohmann::json& field(const nlohmann::json& j, const char* key) {
  static const nlohmann::json kNull;
  if (!j.is_object()) return kNull;
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}
inline std::string str(const nlohmann::json& j, const char* key, const std::string& fallback = "") {
  const nlohmann::json& v = field(j, key);
  return v.is_string() ? v.get<std::string>() : fallback;
}
inline int64_t num(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = field(j, key);
  return v.is_number_integer() ? v.get<int64_t>() : 0;
}
inline const nlohmann::json& list(const nlohmann::json& j, const char* key) {
  static const nlohmann::json kEmpty = nlohmann::json::array();
  const nlohmann::json& v = field(j, key);
  return v.is_array() ? v : kEmpty;
}

}  // namespace goodput::kube
