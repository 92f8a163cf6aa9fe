// The POSIX shared-memory objects that hold flash checkpoints in host memory (internal to the flash
// checkpoint): opening and growing them, reading a header without mapping, and reading a committed
// checkpoint out of one (a private copy, a zero-copy view, or into the caller's buffers).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "agent/checkpoint/format.h"

namespace goodput::ckpt::detail {

struct ShmMap {
  int fd = -1;
  uint8_t* base = nullptr;
  uint64_t size = 0;
  ~ShmMap() {
    if (base) ::munmap(base, size);
    if (fd >= 0) ::close(fd);
  }
  Header* header() const { return reinterpret_cast<Header*>(base); }
};

// Opens an existing object; nullptr if it does not exist or is too small to hold a header.
std::shared_ptr<ShmMap> open_shm(const std::string& name, bool writable);
// Opens or creates an object for writing with at least `size` bytes (it only ever grows, so a
// reader that mapped it earlier never faults).
std::shared_ptr<ShmMap> open_shm_for_write(const std::string& name, uint64_t size);

struct SlotInfo {
  bool committed = false;
  uint64_t generation = 0;
  int64_t step = -1;
};
SlotInfo peek(const std::string& name);  // its header, without mapping it (a walk per page)
bool read_header(int fd, Header& h);
void pread_all(int fd, uint8_t* dst, uint64_t n, uint64_t off);  // all n bytes at off, or throws

// A reusable destination for copies out of shared memory.
struct Region {
  std::shared_ptr<uint8_t> data;
  uint64_t size = 0;
};
// Reads a committed checkpoint out of shared memory: into a private copy (reusing `reuse` when it
// is large enough), verified in place (zero_copy), or buffers straight into `into`.
Loaded read_shm(const std::string& name, bool zero_copy, Region* reuse = nullptr, const Destinations* into = nullptr);

// Anonymous memory backed by huge pages where the kernel allows.
std::shared_ptr<uint8_t> huge_alloc(uint64_t bytes);

}  // namespace goodput::ckpt::detail
