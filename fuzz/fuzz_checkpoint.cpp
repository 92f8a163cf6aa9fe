// Fuzzes checkpoint files as read from storage: header, manifest and checksums must reject any
// damage with a CheckpointError; nothing is ever read outside the file.
#include <cstdint>
#include <string>
#include <vector>

#include "agent/checkpoint/flash_checkpoint.h"

namespace {
class OneFile final : public goodput::ckpt::Storage {
 public:
  std::vector<uint8_t> bytes;
  void write_atomic(const std::string&, const std::vector<std::pair<const void*, size_t>>&) override {}
  std::vector<uint8_t> read(const std::string&) override { return bytes; }
  std::vector<std::string> list(const std::string&) override { return {}; }
  void remove_all(const std::string&) override {}
  void make_dirs(const std::string&) override {}
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  OneFile f;
  f.bytes.assign(data, data + size);
  try {
    const auto l = goodput::ckpt::read_checkpoint_file(f, "fuzz.ckpt");
    for (const auto& b : l.manifest.buffers) {
      uint64_t n = 0;
      const uint8_t* p = l.buffer(b.name, &n);
      volatile uint8_t sink = n ? p[n - 1] : 0;  // in bounds, or ASan says otherwise
      (void)sink;
    }
  } catch (const goodput::ckpt::CheckpointError&) {
  }
  return 0;
}
