// Integer time for the engine. Time is nanoseconds since the job's epoch (the first event);
// floating-point time never enters the engine, so runs reproduce bit for bit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace goodput {

using Time = int64_t;      // ns since the job's epoch
using Duration = int64_t;  // ns

constexpr Duration kNanosecond = 1;
constexpr Duration kMicrosecond = 1'000;
constexpr Duration kMillisecond = 1'000'000;
constexpr Duration kSecond = 1'000'000'000;
constexpr Duration kMinute = 60 * kSecond;
constexpr Duration kHour = 60 * kMinute;
constexpr Duration kDay = 24 * kHour;

// Parses "90s", "10m", "1h30m", "2d", "250ms", "1.5h" or a plain number of seconds ("42", "0.5").
// Returns nullopt on anything else (negative values included).
std::optional<Duration> parse_duration(std::string_view text);

// Seconds (finite, >= 0, at most ~292 years) to ns, rounded to the nearest ns.
std::optional<Duration> seconds_to_ns(double seconds);

// "1d 02:03:04.5" style for people; exact "12.345678901" seconds for machines.
std::string format_duration(Duration d);
std::string format_seconds(Duration d);

inline double to_seconds(Duration d) { return static_cast<double>(d) / 1e9; }

}  // namespace goodput
