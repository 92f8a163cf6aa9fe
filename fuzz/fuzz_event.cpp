// Fuzzes event decoding (what `goodput report` reads back from a log): decode, fold, re-encode.
#include <cstdint>
#include <string>

#include "engine/event_json.h"
#include "engine/job_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const goodput::Event e = goodput::event_from_line(std::string(reinterpret_cast<const char*>(data), size));
    const std::string line = goodput::event_to_line(e);
    if (goodput::event_to_line(goodput::event_from_line(line)) != line) __builtin_trap();
    goodput::JobState s;
    s.apply(goodput::Event{1, 0, goodput::JobStarted{"f", 4, 8, 1'000'000'000, 0, 1, 1, 1, "p"}});
    goodput::Event next = e;
    next.seq = 2;
    next.time = std::max<int64_t>(0, e.time);
    s.apply(next);
    if (s.productive() + s.losses_total() != s.wall()) __builtin_trap();
  } catch (const goodput::EventDecodeError&) {
  }
  return 0;
}
