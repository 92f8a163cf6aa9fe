// Fuzzes the agent API from raw bytes: one HTTP request as a client would send it, read by the
// server's own parser and limits (parse_request), then handled by a master on a virtual clock. Any
// input must be refused with 400/413 or answered; never a crash or an exception.
#include <cstdint>
#include <string>

#include "net/http.h"
#include "fuzz/fuzz_master.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace goodput;
  const net::ParsedRequest parsed =
      net::parse_request(std::string_view(reinterpret_cast<const char*>(data), size), 4096);
  if (parsed.refusal && parsed.refusal->status != 400 && parsed.refusal->status != 413) __builtin_trap();
  if (!parsed.request) return 0;
  live::JobSpec spec;
  spec.job = "fuzz";
  spec.nodes = 2;
  spec.command = {"true"};
  spec.total_steps = 100;
  fuzz::FuzzMaster f("http", spec);
  net::HttpRequest r = *parsed.request;
  if (r.target == "/") return 0;  // the page folds the whole log: slow, and covered by tests
  r.peer_address = "127.0.0.1";
  const net::HttpResponse resp = f.api->handle(r);
  if (resp.status < 200 || resp.status > 599) __builtin_trap();
  return 0;
}
