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
SlotInfo peek(const std::string& name);
// Of a rank's two objects (a, b), the one a new checkpoint goes to: the one that does not hold the
// newest committed checkpoint, with the generation the new one takes.
struct WriteTarget {
  int which = 0;  // 0: a, 1: b
  uint64_t generation = 1;
};
WriteTarget write_target(const std::string& a, const std::string& b);

// A whole checkpoint image, as a file holds it (header, data, manifest), written into a rank's
// objects a and b as it arrives from elsewhere (a replica from a peer): the constructor picks the
// write target and marks it uncommitted; the caller fills body() (the data, then the manifest);
// commit() checks the header, the manifest (of rank `rank` of a world of `world_size`) and every
// buffer's checksum in place and commits it as the newest, or throws CheckpointError saying what is wrong. Until a commit the other object
// still holds the newest committed checkpoint, untouched.
class ImageWriter {
 public:
  // max_bytes: the largest image accepted (the header says how large this one is).
  ImageWriter(const std::string& a, const std::string& b, const Header& header, uint64_t max_bytes);
  uint8_t* body() { return map_->base + kHeaderBytes; }
  uint64_t body_bytes() const { return size_ - kHeaderBytes; }
  Manifest commit(int32_t rank, int32_t world_size);
  const std::string& object() const { return name_; }

 private:
  std::string name_;
  Header header_;
  uint64_t size_ = 0;
  std::shared_ptr<ShmMap> map_;
};  // its header, without mapping it (a walk per page)
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
