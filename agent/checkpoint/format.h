// The checkpoint format and what every part of the flash checkpoint shares (internal: the public
// interface is flash_checkpoint.h). One checkpoint of one rank, in shared memory or in a file:
//   [64-byte Header][data: the buffers back to back, 64-byte aligned][manifest: JSON]
// The header carries a magic, the format version, the commit state and generation, the step, where
// the manifest is and its XXH3 checksum; the manifest lists each buffer's name, dtype, shape,
// offset, size and checksum. A buffer's checksum is XXH3-64 over the XXH3-64s of its 1 MiB chunks,
// so chunks are copied and hashed on several cores at once (for_chunks).
#pragma once

#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
// libxxhash's runtime dispatch: XXH3 on AVX2/AVX-512 where the CPU has them, about twice the
// scalar speed; the hash values are the same on every path.
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/checkpoint/flash_checkpoint.h"

namespace goodput::ckpt::detail {


constexpr char kMagic[8] = {'G', 'P', 'C', 'K', 'P', 'T', '0', '1'};
constexpr uint64_t kHeaderBytes = 64;
constexpr uint64_t kChunk = 1 << 20;  // checksummed, copied and read in 1 MiB chunks, in parallel
constexpr uint64_t kParallelBytes = 32 << 20;  // below this, one thread
constexpr size_t kDirectMin = 8 << 20;          // files from this size are written around the page cache
constexpr size_t kDirectAlign = 4096;           // O_DIRECT: buffer, offset and length in device blocks
constexpr size_t kBounceBytes = 8 << 20;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t state;  // 0: being written (or empty), 1: committed
  uint64_t generation;
  int64_t step;
  uint64_t data_bytes;
  uint64_t manifest_offset;
  uint64_t manifest_bytes;
  uint64_t manifest_xxh3;
};
static_assert(sizeof(Header) == kHeaderBytes);

inline uint64_t align64(uint64_t v) { return (v + 63) & ~uint64_t{63}; }

// A save started on the object while it was being read: not damage, just too late. Try the newest again.
struct Overwritten : CheckpointError {
  Overwritten() : CheckpointError("overwritten while reading") {}
};

double since(std::chrono::steady_clock::time_point t0);  // seconds
std::string sys_error(const std::string& what);         // what: strerror(errno)

nlohmann::json manifest_json(const Manifest& m);
Manifest manifest_from(const std::string& text);  // throws CheckpointError naming what is wrong

// The commit state, read and written with acquire/release order (a reader in another process
// sees the data of a committed checkpoint before it sees the commit).
inline uint32_t load_state(const Header* h) {
  return std::atomic_ref<uint32_t>(const_cast<Header*>(h)->state).load(std::memory_order_acquire);
}
inline void store_state(Header* h, uint32_t v) { std::atomic_ref<uint32_t>(h->state).store(v, std::memory_order_release); }

// Checks of a checkpoint image of `size` bytes (the data is checked by the caller, fused with its
// copy, or by verify_in_place). Each throws CheckpointError saying what is wrong.
Manifest check_manifest(const Header& h, const uint8_t* manifest);
bool manifest_in_bounds(const Header& h, uint64_t size);
// `manifest`: the manifest's bytes where the caller has them (for a clearer message), or null.
void check_header(const Header& h, uint64_t size, const uint8_t* manifest = nullptr);
Manifest check_image(const uint8_t* base, uint64_t size, const Header& h);
std::vector<uint64_t> buffer_sizes(const Manifest& m);
void check_sums(const Manifest& m, const std::vector<uint64_t>& got);
void verify_in_place(const Manifest& m, const uint8_t* data);  // throws naming the first wrong buffer
// The header of a committed image laid out as a file holds it (and a replica travels): the data
// right after the header, the manifest (`manifest_text`) right after the data.
Header image_header(const Manifest& m, const std::string& manifest_text);

// Storage layout: <dir>/step-<step>/rank-<rank>.ckpt. The step a directory name says; none: not one.
std::optional<int64_t> parse_step_dir(const std::string& name);

// A buffer's checksum is XXH3-64 over the XXH3-64s of its 1 MiB chunks, so that chunks can be
// copied and hashed on several cores at once. `op(buffer, offset, bytes)` handles one chunk and
// returns its hash; the result is each buffer's checksum.
template <class Op>
std::vector<uint64_t> for_chunks(const std::vector<uint64_t>& sizes, Op op) {
  struct Chunk {
    uint32_t buffer;
    uint64_t offset, bytes;
  };
  std::vector<Chunk> chunks;
  std::vector<std::vector<uint64_t>> hashes(sizes.size());
  uint64_t total = 0;
  for (size_t b = 0; b < sizes.size(); ++b) {
    hashes[b].resize((sizes[b] + kChunk - 1) / kChunk);
    for (uint64_t off = 0; off < sizes[b]; off += kChunk)
      chunks.push_back({static_cast<uint32_t>(b), off, std::min(kChunk, sizes[b] - off)});
    total += sizes[b];
  }
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    for (size_t i = next++; i < chunks.size(); i = next++) {
      try {
        const Chunk& c = chunks[i];
        hashes[c.buffer][c.offset / kChunk] = op(c.buffer, c.offset, c.bytes);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        next = chunks.size();
      }
    }
  };
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const unsigned threads = total >= kParallelBytes ? std::min(hw, 8u) : 1u;
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  std::vector<uint64_t> out(sizes.size());
  for (size_t b = 0; b < sizes.size(); ++b) out[b] = XXH3_64bits(hashes[b].data(), hashes[b].size() * sizeof(uint64_t));
  return out;
}

}  // namespace goodput::ckpt::detail
