#include "engine/time.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace goodput {

std::optional<Duration> seconds_to_ns(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 9.2e9) return std::nullopt;
  return static_cast<Duration>(std::llround(seconds * 1e9));
}

std::optional<Duration> parse_duration(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::string s(text);
  const char* p = s.c_str();
  const char* end = p + s.size();
  long double total_ns = 0;
  bool any = false;
  while (p < end) {
    char* num_end = nullptr;
    long double v = std::strtold(p, &num_end);
    if (num_end == p || v < 0 || !std::isfinite(static_cast<double>(v))) return std::nullopt;
    p = num_end;
    long double unit = 1e9L;  // bare number: seconds
    if (p < end) {
      if (end - p >= 2 && p[0] == 'm' && p[1] == 's') { unit = 1e6L; p += 2; }
      else if (end - p >= 2 && p[0] == 'u' && p[1] == 's') { unit = 1e3L; p += 2; }
      else if (end - p >= 2 && p[0] == 'n' && p[1] == 's') { unit = 1L; p += 2; }
      else if (*p == 's') { unit = 1e9L; ++p; }
      else if (*p == 'm') { unit = 60e9L; ++p; }
      else if (*p == 'h') { unit = 3600e9L; ++p; }
      else if (*p == 'd') { unit = 86400e9L; ++p; }
      else return std::nullopt;
    } else if (any) {
      return std::nullopt;  // "1h30" is ambiguous
    }
    total_ns += v * unit;
    any = true;
  }
  if (!any || total_ns > 9.2e18L) return std::nullopt;
  return static_cast<Duration>(std::llround(static_cast<double>(total_ns)));
}

std::string format_duration(Duration d) {
  std::string sign = d < 0 ? "-" : "";
  if (d < 0) d = -d;
  // Round to the tenth of a second shown first, so 59.96 s reads 00:01:00.0, not 00:00:60.0.
  constexpr Duration kTenth = 100 * kMillisecond;
  d = d > INT64_MAX - kTenth ? d : (d + kTenth / 2) / kTenth * kTenth;
  const int64_t days = d / kDay;
  const int64_t h = (d % kDay) / kHour;
  const int64_t m = (d % kHour) / kMinute;
  const double s = static_cast<double>(d % kMinute) / 1e9;
  char buf[64];
  if (days > 0)
    std::snprintf(buf, sizeof buf, "%s%lldd %02lld:%02lld:%04.1f", sign.c_str(), (long long)days, (long long)h,
                  (long long)m, s);
  else
    std::snprintf(buf, sizeof buf, "%s%02lld:%02lld:%04.1f", sign.c_str(), (long long)h, (long long)m, s);
  return buf;
}

std::string format_seconds(Duration d) {
  char buf[48];
  const char* sign = d < 0 ? "-" : "";
  const uint64_t a = d < 0 ? static_cast<uint64_t>(-(d + 1)) + 1 : static_cast<uint64_t>(d);
  std::snprintf(buf, sizeof buf, "%s%llu.%09llu", sign, (unsigned long long)(a / kSecond),
                (unsigned long long)(a % kSecond));
  return buf;
}

}  // namespace goodput
