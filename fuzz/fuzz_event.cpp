// Fuzzes event decoding (what `goodput report` reads back from a log): decode, fold, re-encode,
// and draw the timeline the HTML report shows.
#include <cstdint>
#include <string>

#include "engine/event_json.h"
#include "engine/job_state.h"
#include "report/timeline.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const goodput::Event e = goodput::event_from_line(std::string(reinterpret_cast<const char*>(data), size));
    const std::string line = goodput::event_to_line(e);
    if (goodput::event_to_line(goodput::event_from_line(line)) != line) __builtin_trap();
    goodput::JobState s;
    goodput::TimelineBuilder timeline;
    const goodput::Event start{1, 0, goodput::JobStarted{"f", 4, 8, 1'000'000'000, 0, 1, 1, 1, "p"}};
    s.apply(start);
    timeline.add(start, s);
    goodput::Event next = e;
    next.seq = 2;
    next.time = std::max<int64_t>(0, e.time);
    s.apply(next);
    timeline.add(next, s);
    (void)timeline.finish(s);
    if (s.productive() + s.losses_total() != s.wall()) __builtin_trap();
  } catch (const goodput::EventDecodeError&) {
  }
  return 0;
}
