// Strict readers for configuration JSON (policies, trace headers): every value is checked, unknown keys are errors, and each error
// names the field's full path.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "engine/time.h"
#include <stdexcept>

namespace goodput {

// Thrown with a message that names the field path; callers add file/line context.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& j, std::string where);
  // Each getter records the key as known; finish() rejects keys nobody asked for.
  std::string text(const char* key, const std::string& fallback);
  int64_t integer(const char* key, int64_t fallback, int64_t min, int64_t max);
  double number(const char* key, double fallback, double min, double max);
  bool boolean(const char* key, bool fallback);
  Duration duration(const char* key, Duration fallback);
  bool has(const char* key) const { return j_.contains(key); }
  const nlohmann::json* child(const char* key);
  void finish() const;
  [[noreturn]] void fail(const char* key, const std::string& what) const;
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& j_;
  std::string where_;
  std::set<std::string> known_;
};

}  // namespace goodput
