// Invariants checked in production code and kept on in release builds (as TigerBeetle keeps its
// assertions): each is cheap, and a broken one is a bug in Goodput, never bad input. It throws an
// InvariantError naming the condition, where it is and what was found, so the live master stops
// (and resumes from its log) instead of acting on a state it does not understand, and the VOPR
// reports it with the seed that reproduces it.
#pragma once

#include <stdexcept>
#include <string>

namespace goodput {

struct InvariantError : std::logic_error {
  using std::logic_error::logic_error;
};

[[noreturn]] inline void invariant_failed(const char* condition, const char* file, int line, const std::string& detail) {
  throw InvariantError(std::string("invariant broken at ") + file + ":" + std::to_string(line) + ": " + condition +
                       (detail.empty() ? "" : " (" + detail + ")"));
}

}  // namespace goodput

// `detail` is evaluated only when the condition fails.
#define GOODPUT_INVARIANT(condition, detail)                                          \
  do {                                                                                \
    if (!(condition)) [[unlikely]]                                                    \
      ::goodput::invariant_failed(#condition, __FILE__, __LINE__, (detail));          \
  } while (0)
