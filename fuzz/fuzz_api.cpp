// Fuzzes the live master's agent API: a sequence of requests (one per line, "PATH<TAB>BODY"), with
// the right token, against one master on a virtual clock. Any input must get an HTTP answer (never
// a crash or an exception out of handle()), and the log must stay a valid fold.
#include <cstdint>
#include <string>

#include "fuzz/fuzz_master.h"

namespace {

goodput::live::JobSpec spec(bool node_check) {
  goodput::live::JobSpec s;
  s.job = "fuzz";
  s.nodes = 2;
  s.command = {"true"};
  s.total_steps = 100;
  s.data_shards = 8;
  // Inputs that speak of checks get a master that runs the pre-flight node check (others keep
  // reaching training, as the corpus and regressions were found for).
  s.node_check.enabled = node_check;
  s.node_check.compute = 100 * goodput::kMillisecond;
  s.node_check.round_timeout = 2 * goodput::kSecond;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace goodput;
  const std::string in(reinterpret_cast<const char*>(data), size);
  fuzz::FuzzMaster f("api", spec(in.find("check") != std::string::npos));
  VirtualClock& clock = f.clock;
  live::LiveMaster& master = *f.master;
  Time now = 0;
  for (size_t start = 0; start < in.size();) {
    size_t end = in.find('\n', start);
    if (end == std::string::npos) end = in.size();
    const std::string line = in.substr(start, end - start);
    start = end + 1;
    const size_t tab = line.find('\t');
    net::HttpRequest r;
    r.target = line.substr(0, tab);
    r.method = r.target.rfind("/v1/", 0) == 0 ? "POST" : "GET";
    r.authorization = "Bearer t";
    r.body = tab == std::string::npos ? "" : line.substr(tab + 1);
    if (r.target == "/") continue;  // the page folds the whole log: slow, and covered by tests
    const net::HttpResponse resp = f.api->handle(r);
    if (resp.status < 200 || resp.status > 599) __builtin_trap();
    now += 100 * kMillisecond;
    clock.advance_to(now);
    master.tick();
  }
  const JobState& s = master.state();
  if (s.productive() + s.losses_total() != s.wall()) __builtin_trap();
  return 0;
}
