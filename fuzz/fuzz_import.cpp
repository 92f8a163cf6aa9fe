// Fuzzes the history importers (trace import --from k8s | slurm | pai2020 | acme): any input is a
// trace that writes and loads again to the same thing, or a TraceError; never a crash. The first
// byte picks the importer ('0' Kubernetes, '1' sacct, '2' PAI 2020 instances, '3' an AcmeTrace job
// trace, '4' AcmeTrace's cluster summary, row "Kalos"; modulo 8, the rest Kubernetes); the rest is
// the file (importers read files: it is written to a scratch file). A builder's traces split by job
// size are checked the same way.
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "import/kube_history.h"
#include "sim/trace_import.h"

namespace {

void round_trip(const goodput::Trace& t) {
  const std::string once = goodput::write_trace(t);
  if (goodput::write_trace(goodput::parse_trace(once, "again.jsonl")) != once) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::string path = "/tmp/goodput-fuzz-import-" + std::to_string(::getpid());
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data + 1),
                                                                static_cast<std::streamsize>(size - 1));
  try {
    const int which = data[0] % 8;
    if (which == 4) {
      round_trip(goodput::import_acme_summary(path, "Kalos", 8, nullptr));
      return 0;
    }
    const goodput::TraceBuilder b = which == 1   ? goodput::import_slurm({path})
                                    : which == 2 ? goodput::import_pai2020({path})
                                    : which == 3 ? goodput::import_acme({path})
                                                 : goodput::kube::import_history({path});
    round_trip(b.build(goodput::kSecond));
    for (int32_t n : b.sizes()) round_trip(b.build(goodput::kSecond, n));
  } catch (const goodput::TraceError&) {
  }
  return 0;
}
