// Fuzzes the trace loader: any input is either a trace or a TraceError, never a crash.
#include <cstdint>
#include <string>

#include "sim/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    goodput::Trace t = goodput::parse_trace(std::string(reinterpret_cast<const char*>(data), size), "fuzz.jsonl");
    // What loads must write and load again to the same thing.
    const std::string once = goodput::write_trace(t);
    if (goodput::write_trace(goodput::parse_trace(once, "again.jsonl")) != once) __builtin_trap();
  } catch (const goodput::TraceError&) {
  }
  return 0;
}
