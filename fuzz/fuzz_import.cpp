// Fuzzes the history importers (trace import --from k8s | slurm): any input is a trace that writes
// and loads again to the same thing, or a TraceError; never a crash. The first byte picks the
// importer; the rest is the file (importers read files: it is written to a scratch file).
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "import/kube_history.h"
#include "sim/trace_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::string path = "/tmp/goodput-fuzz-import-" + std::to_string(::getpid());
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data + 1),
                                                                static_cast<std::streamsize>(size - 1));
  try {
    const goodput::Trace t = data[0] % 2 ? goodput::import_slurm({path}, goodput::kSecond)
                                         : goodput::kube::import_history({path}, goodput::kSecond);
    const std::string once = goodput::write_trace(t);
    if (goodput::write_trace(goodput::parse_trace(once, "again.jsonl")) != once) __builtin_trap();
  } catch (const goodput::TraceError&) {
  }
  return 0;
}
