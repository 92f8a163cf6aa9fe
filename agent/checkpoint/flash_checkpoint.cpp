#include "agent/checkpoint/flash_checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
// libxxhash's runtime dispatch: XXH3 on AVX2/AVX-512 where the CPU has them, about twice the
// scalar speed; the hash values are the same on every path.
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

namespace goodput::ckpt {
namespace {

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

uint64_t align64(uint64_t v) { return (v + 63) & ~uint64_t{63}; }

// A save started on the object while it was being read: not damage, just too late. Try the newest again.
struct Overwritten : CheckpointError {
  Overwritten() : CheckpointError("overwritten while reading") {}
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string sys_error(const std::string& what) { return what + ": " + std::strerror(errno); }

nlohmann::json manifest_json(const Manifest& m) {
  nlohmann::json j;
  j["format_version"] = m.format_version;
  j["job"] = m.job;
  j["rank"] = m.rank;
  j["world_size"] = m.world_size;
  j["step"] = m.step;
  j["data_bytes"] = m.data_bytes;
  j["buffers"] = nlohmann::json::array();
  for (const BufferInfo& b : m.buffers)
    j["buffers"].push_back({{"name", b.name}, {"dtype", b.dtype}, {"shape", b.shape}, {"offset", b.offset},
                            {"nbytes", b.nbytes}, {"xxh3", b.xxh3}});
  return j;
}

Manifest manifest_from(const std::string& text) {
  Manifest m;
  try {
    const auto j = nlohmann::json::parse(text);
    m.format_version = j.at("format_version").get<uint32_t>();
    m.job = j.at("job").get<std::string>();
    m.rank = j.at("rank").get<int32_t>();
    m.world_size = j.at("world_size").get<int32_t>();
    m.step = j.at("step").get<int64_t>();
    m.data_bytes = j.at("data_bytes").get<uint64_t>();
    for (const auto& b : j.at("buffers")) {
      BufferInfo i;
      i.name = b.at("name").get<std::string>();
      i.dtype = b.at("dtype").get<std::string>();
      i.shape = b.at("shape").get<std::vector<int64_t>>();
      i.offset = b.at("offset").get<uint64_t>();
      i.nbytes = b.at("nbytes").get<uint64_t>();
      i.xxh3 = b.at("xxh3").get<uint64_t>();
      if (i.offset > m.data_bytes || i.nbytes > m.data_bytes - i.offset)
        throw CheckpointError("buffer '" + i.name + "' lies outside the data section");
      m.buffers.push_back(std::move(i));
    }
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(std::string("manifest is not valid: ") + e.what());
  }
  if (m.format_version != kFormatVersion)
    throw CheckpointError("format version " + std::to_string(m.format_version) + ", this build reads " +
                          std::to_string(kFormatVersion));
  return m;
}

uint32_t load_state(const Header* h) {
  return std::atomic_ref<uint32_t>(const_cast<Header*>(h)->state).load(std::memory_order_acquire);
}
void store_state(Header* h, uint32_t v) { std::atomic_ref<uint32_t>(h->state).store(v, std::memory_order_release); }

// Checks the header and the manifest of a checkpoint image that starts at `base` and is `size`
// bytes long (the data is checked by the caller, fused with its copy).
Manifest check_manifest(const Header& h, const uint8_t* manifest) {
  if (XXH3_64bits(manifest, h.manifest_bytes) != h.manifest_xxh3) throw CheckpointError("manifest checksum mismatch");
  Manifest m = manifest_from(std::string(reinterpret_cast<const char*>(manifest), h.manifest_bytes));
  if (m.step != h.step || m.data_bytes != h.data_bytes) throw CheckpointError("header and manifest disagree");
  return m;
}

bool manifest_in_bounds(const Header& h, uint64_t size) {
  return h.manifest_offset >= kHeaderBytes && h.manifest_offset <= size && h.manifest_bytes <= size - h.manifest_offset;
}

// The header's version field names a format this build does not read: another version's
// checkpoint, or a damaged header? The manifest, checksummed apart from the header, tells: if it
// verifies and says this build's format, the header is what changed.
[[noreturn]] void version_mismatch(const Header& h, const uint8_t* manifest) {
  if (manifest && XXH3_64bits(manifest, h.manifest_bytes) == h.manifest_xxh3) {
    const auto j = nlohmann::json::parse(manifest, manifest + h.manifest_bytes, nullptr, false);
    if (j.is_object() && j.value("format_version", -1) == static_cast<int>(kFormatVersion))
      throw CheckpointError("damaged header: its format version field reads " + std::to_string(h.version) +
                            " where its manifest (checksum verified) says " + std::to_string(kFormatVersion));
  }
  throw CheckpointError("format version " + std::to_string(h.version) + ", this build reads " + std::to_string(kFormatVersion));
}

// `manifest`: the manifest's bytes where the caller has them (for a clearer message), or null.
void check_header(const Header& h, uint64_t size, const uint8_t* manifest = nullptr) {
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) throw CheckpointError("not a Goodput checkpoint (bad magic)");
  if (h.version != kFormatVersion) version_mismatch(h, manifest);
  if (!manifest_in_bounds(h, size) || h.data_bytes > h.manifest_offset - kHeaderBytes)
    throw CheckpointError("truncated: header promises " + std::to_string(h.manifest_offset + h.manifest_bytes) +
                          " bytes, found " + std::to_string(size));
}

Manifest check_image(const uint8_t* base, uint64_t size, const Header& h) {
  check_header(h, size, manifest_in_bounds(h, size) ? base + h.manifest_offset : nullptr);
  return check_manifest(h, base + h.manifest_offset);
}

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

std::vector<uint64_t> buffer_sizes(const Manifest& m) {
  std::vector<uint64_t> s;
  for (const BufferInfo& b : m.buffers) s.push_back(b.nbytes);
  return s;
}

void check_sums(const Manifest& m, const std::vector<uint64_t>& got) {
  for (size_t i = 0; i < m.buffers.size(); ++i)
    if (got[i] != m.buffers[i].xxh3) throw CheckpointError("checksum mismatch in buffer '" + m.buffers[i].name + "'");
}

// Checksums every buffer where it lies; throws naming the first one that is wrong.
void verify_in_place(const Manifest& m, const uint8_t* data) {
  check_sums(m, for_chunks(buffer_sizes(m), [&](uint32_t b, uint64_t off, uint64_t n) {
               return XXH3_64bits(data + m.buffers[b].offset + off, n);
             }));
}

// Anonymous memory backed by huge pages where the kernel allows: a restore's destination is fresh
// memory, and faulting it in 4 KiB at a time costs more than the copy on some machines.
std::shared_ptr<uint8_t> huge_alloc(uint64_t bytes) {
  const uint64_t size = std::max<uint64_t>((bytes + (2u << 20) - 1) & ~uint64_t((2u << 20) - 1), 2u << 20);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw CheckpointError("out of memory for " + std::to_string(bytes) + " bytes");
  ::madvise(p, size, MADV_HUGEPAGE);
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [size](uint8_t* q) { ::munmap(q, size); });
}

// ---- shared memory -------------------------------------------------------------------------------

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

// Opens an existing object read-only; nullptr if it does not exist or is too small to hold a header.
std::shared_ptr<ShmMap> open_shm(const std::string& name, bool writable) {
  const int fd = ::shm_open(name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) {
    if (errno == ENOENT) return nullptr;
    throw CheckpointError(sys_error("shm_open " + name));
  }
  auto m = std::make_shared<ShmMap>();
  m->fd = fd;
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw CheckpointError(sys_error("fstat " + name));
  if (static_cast<uint64_t>(st.st_size) < kHeaderBytes) return nullptr;
  m->size = static_cast<uint64_t>(st.st_size);
  void* p = ::mmap(nullptr, m->size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) throw CheckpointError(sys_error("mmap " + name));
  m->base = static_cast<uint8_t*>(p);
  return m;
}

// Opens or creates an object for writing with at least `size` bytes (it only ever grows, so a
// reader that mapped it earlier never faults).
std::shared_ptr<ShmMap> open_shm_for_write(const std::string& name, uint64_t size) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) throw CheckpointError(sys_error("shm_open " + name));
  auto m = std::make_shared<ShmMap>();
  m->fd = fd;
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw CheckpointError(sys_error("fstat " + name));
  uint64_t have = static_cast<uint64_t>(st.st_size);
  if (have < size) {
    if (have >= kHeaderBytes) {
      // Mark it as being written before it changes size, in case we die half way.
      void* h = ::mmap(nullptr, kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (h != MAP_FAILED) {
        store_state(static_cast<Header*>(h), 0);
        ::munmap(h, kHeaderBytes);
      }
    }
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) throw CheckpointError(sys_error("ftruncate " + name));
    have = size;
  }
  m->size = have;
  // Populate: one call maps every page, instead of one fault per page during the copy.
  void* p = ::mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) throw CheckpointError(sys_error("mmap " + name));
  m->base = static_cast<uint8_t*>(p);
  return m;
}

struct SlotInfo {
  bool committed = false;
  uint64_t generation = 0;
  int64_t step = -1;
};

// Reads a header without mapping the object (mapping costs a page-table walk per page).
bool read_header(int fd, Header& h) { return ::pread(fd, &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h); }

SlotInfo peek(const std::string& name) {
  SlotInfo s;
  const int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return s;
  Header h{};
  const bool ok = read_header(fd, h);
  ::close(fd);
  if (!ok || std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.state != 1) return s;
  s.committed = true;
  s.generation = h.generation;
  s.step = h.step;
  return s;
}

// Reads `n` bytes at `off` into dst (all of them, or throws).
void pread_all(int fd, uint8_t* dst, uint64_t n, uint64_t off) {
  uint64_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, dst + done, n - done, static_cast<off_t>(off + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) throw CheckpointError("truncated while reading");
    done += static_cast<uint64_t>(got);
  }
}

// Reads a committed checkpoint out of shared memory: into a private copy, or verified in place.
// A reusable destination for copies out of shared memory.
struct Region {
  std::shared_ptr<uint8_t> data;
  uint64_t size = 0;
};

Loaded read_shm(const std::string& name, bool zero_copy, Region* reuse = nullptr, const Destinations* into = nullptr) {
  auto t0 = std::chrono::steady_clock::now();
  Loaded out;
  out.tier = Tier::Memory;
  out.source = name;
  Header snap{};
  if (zero_copy) {
    auto m = open_shm(name, false);
    if (!m) throw CheckpointError("not present");
    const Header* h = m->header();
    if (load_state(h) != 1) throw CheckpointError("not committed (a save was interrupted)");
    snap = *h;
    out.manifest = check_image(m->base, m->size, snap);
    try {
      verify_in_place(out.manifest, m->base + kHeaderBytes);
    } catch (const CheckpointError&) {
      if (load_state(h) != 1 || h->generation != snap.generation) throw Overwritten();
      throw;
    }
    if (load_state(h) != 1 || h->generation != snap.generation) throw Overwritten();
    out.keepalive_ = m;
    out.data_ = m->base + kHeaderBytes;
  } else {
    // A private copy, read through the file interface: no mapping to build for the source.
    const int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) throw CheckpointError(errno == ENOENT ? "not present" : sys_error("shm_open"));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    ::fstat(fd, &st);
    if (!read_header(fd, snap)) throw CheckpointError("truncated: no header");
    if (snap.state != 1) throw Overwritten();  // it was committed when the caller looked
    const bool in_bounds = manifest_in_bounds(snap, static_cast<uint64_t>(st.st_size));
    std::vector<uint8_t> manifest(in_bounds ? snap.manifest_bytes : 0);
    const bool read = in_bounds && ::pread(fd, manifest.data(), manifest.size(), static_cast<off_t>(snap.manifest_offset)) ==
                                       static_cast<ssize_t>(manifest.size());
    check_header(snap, static_cast<uint64_t>(st.st_size), read ? manifest.data() : nullptr);
    if (!read) throw CheckpointError("truncated manifest");
    out.manifest = check_manifest(snap, manifest.data());
    Region fresh;
    Region& buf = reuse ? *reuse : fresh;
    if (!buf.data || buf.size < snap.data_bytes) buf = Region{huge_alloc(snap.data_bytes), snap.data_bytes};
    uint8_t* dst = buf.data.get();
    const Manifest& man = out.manifest;
    std::vector<uint8_t*> where(man.buffers.size());  // each buffer's destination
    for (size_t b = 0; b < man.buffers.size(); ++b) {
      where[b] = dst + man.buffers[b].offset;
      if (!into) continue;
      const auto it = into->find(man.buffers[b].name);
      if (it != into->end() && it->second.nbytes == man.buffers[b].nbytes && it->second.data) {
        where[b] = it->second.data;
        out.placed[man.buffers[b].name] = it->second.data;
      }
    }
    const auto sums = for_chunks(buffer_sizes(man), [&](uint32_t b, uint64_t off, uint64_t n) {
      uint8_t* p = where[b] + off;
      pread_all(fd, p, n, kHeaderBytes + man.buffers[b].offset + off);
      return XXH3_64bits(p, n);
    });
    // A save that started meanwhile resets the state first: then what we read may be torn, and a
    // checksum mismatch means nothing.
    Header after{};
    if (!read_header(fd, after) || after.state != 1 || after.generation != snap.generation) throw Overwritten();
    check_sums(man, sums);
    out.keepalive_ = buf.data;
    out.data_ = dst;
  }
  out.seconds = since(t0);
  return out;
}

// ---- files ---------------------------------------------------------------------------------------

class PosixStorage final : public Storage {
 public:
  void write_atomic(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts) override {
    const std::string tmp = path + ".tmp";
    size_t total = 0;
    for (const auto& part : parts) total += part.second;
    // A large file bypasses the page cache (O_DIRECT, through an aligned bounce buffer): written
    // buffered, a new checkpoint file grows the page cache by its own size, which on a host whose
    // memory is in use costs more than the disk write itself (and evicts what the trainer reads).
    // A file system without O_DIRECT (tmpfs) gets buffered writes.
    int fd = total >= kDirectMin ? ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0600) : -1;
    bool direct = fd >= 0;
    if (!direct) fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) throw CheckpointError(sys_error("open " + tmp));
    auto fail = [&](const std::string& what) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      errno = e;
      throw CheckpointError(sys_error(what + " " + tmp));
    };
    bool refused = false;  // the file system took O_DIRECT at open but not at write (EINVAL)
    auto write_all = [&](const char* p, size_t left) {
      while (left > 0 && !refused) {
        const ssize_t n = ::write(fd, p, std::min<size_t>(left, size_t{1} << 30));
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno == EINVAL && direct) {
            refused = true;
            break;
          }
          fail("write");
        }
        p += n;
        left -= static_cast<size_t>(n);
      }
    };
    if (direct) {
      std::unique_ptr<char, decltype(&std::free)> bounce(static_cast<char*>(std::aligned_alloc(kDirectAlign, kBounceBytes)),
                                                          &std::free);
      if (!bounce) fail("allocate a write buffer for");
      size_t fill = 0;
      for (const auto& [data, size] : parts)
        for (size_t done = 0; done < size;) {
          const size_t n = std::min(size - done, kBounceBytes - fill);
          std::memcpy(bounce.get() + fill, static_cast<const char*>(data) + done, n);
          fill += n;
          done += n;
          if (fill == kBounceBytes) {
            write_all(bounce.get(), fill);
            fill = 0;
          }
        }
      if (fill > 0 && !refused) {  // the last block is padded for the device, and the file cut to its size
        const size_t padded = (fill + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
        std::memset(bounce.get() + fill, 0, padded - fill);
        write_all(bounce.get(), padded);
        if (!refused && ::ftruncate(fd, static_cast<off_t>(total)) != 0) fail("truncate");
      }
    }
    if (!direct || refused) {  // buffered, from the start
      if (refused && (::ftruncate(fd, 0) != 0 || ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT) != 0 ||
                      ::lseek(fd, 0, SEEK_SET) != 0))
        fail("fall back from O_DIRECT for");
      direct = refused = false;
      for (const auto& [data, size] : parts) write_all(static_cast<const char*>(data), size);
    }
    if (::fsync(fd) != 0) fail("fsync");
    if (::close(fd) != 0) {
      ::unlink(tmp.c_str());
      throw CheckpointError(sys_error("close " + tmp));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      ::unlink(tmp.c_str());
      throw CheckpointError(sys_error("rename " + tmp));
    }
    const std::string dir = std::filesystem::path(path).parent_path().string();
    const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  std::vector<uint8_t> read(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw CheckpointError(sys_error("open " + path));
    struct stat st {};
    ::fstat(fd, &st);
    std::vector<uint8_t> out(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < out.size()) {
      const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(fd);
    out.resize(got);
    return out;
  }
  std::vector<std::string> list(const std::string& dir) override {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  void remove_all(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  void make_dirs(const std::string& path) override {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) throw CheckpointError(path + ": cannot create: " + ec.message());
    ::chmod(path.c_str(), 0700);
  }
};

std::optional<int64_t> parse_step_dir(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() <= 5) return std::nullopt;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

}  // namespace

const char* tier_name(Tier t) { return t == Tier::Memory ? "memory" : "storage"; }

std::shared_ptr<Storage> posix_storage() { return std::make_shared<PosixStorage>(); }

const uint8_t* Loaded::buffer(const std::string& name, uint64_t* nbytes) const {
  for (const BufferInfo& b : manifest.buffers)
    if (b.name == name) {
      if (nbytes) *nbytes = b.nbytes;
      const auto p = placed.find(name);
      return p != placed.end() ? p->second : data_ + b.offset;
    }
  return nullptr;
}

Loaded read_shm_object(const std::string& name) { return read_shm(name, false); }

Loaded read_checkpoint_file(Storage& storage, const std::string& path) {
  auto t0 = std::chrono::steady_clock::now();
  auto bytes = std::make_shared<std::vector<uint8_t>>(storage.read(path));
  if (bytes->size() < kHeaderBytes)
    throw CheckpointError("truncated: " + std::to_string(bytes->size()) + " bytes, not even a header");
  Header h;
  std::memcpy(&h, bytes->data(), sizeof h);
  if (h.state != 1) throw CheckpointError("not committed");
  Manifest m = check_image(bytes->data(), bytes->size(), h);
  verify_in_place(m, bytes->data() + kHeaderBytes);
  Loaded out;
  out.manifest = std::move(m);
  out.tier = Tier::Storage;
  out.source = path;
  out.keepalive_ = bytes;
  out.data_ = bytes->data() + kHeaderBytes;
  out.seconds = since(t0);
  return out;
}

FlashCheckpoint::FlashCheckpoint(Options o) : options_(std::move(o)) {
  if (options_.rank < 0 || options_.world_size < 1 || options_.rank >= options_.world_size)
    throw CheckpointError("rank " + std::to_string(options_.rank) + " is outside a world of " +
                          std::to_string(options_.world_size));
  if (options_.shm_prefix.empty()) options_.shm_prefix = "/goodput-" + options_.job;
  if (options_.shm_prefix[0] != '/' || options_.shm_prefix.find('/', 1) != std::string::npos)
    throw CheckpointError("shm prefix must be one '/'-led name: " + options_.shm_prefix);
  if (!options_.storage) options_.storage = posix_storage();
  if (options_.keep < 1) options_.keep = 1;
}

std::string FlashCheckpoint::shm_name(int which) const {
  return options_.shm_prefix + "-r" + std::to_string(options_.rank) + (which == 0 ? "-a" : "-b");
}

std::string FlashCheckpoint::step_dir(int64_t step) const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%012lld", static_cast<long long>(step));
  return options_.storage_dir + "/" + buf;
}

std::string FlashCheckpoint::rank_file(int64_t step, int32_t rank) const {
  char buf[32];
  std::snprintf(buf, sizeof buf, "/rank-%05d.ckpt", rank);
  return step_dir(step) + buf;
}

SaveStats FlashCheckpoint::save(int64_t step, const std::vector<BufferView>& buffers) {
  auto t0 = std::chrono::steady_clock::now();
  Manifest m;
  m.job = options_.job;
  m.rank = options_.rank;
  m.world_size = options_.world_size;
  m.step = step;
  uint64_t off = 0;
  for (const BufferView& b : buffers) {
    if (b.nbytes && !b.data) throw CheckpointError("buffer '" + b.name + "' has no data");
    m.buffers.push_back(BufferInfo{b.name, b.dtype, b.shape, off, b.nbytes, ~uint64_t{0}});
    off = align64(off + b.nbytes);
  }
  m.data_bytes = off;
  // The manifest's size with the widest checksums bounds the real one.
  const uint64_t manifest_max = manifest_json(m).dump().size() + 64;

  // Write the object that does not hold the newest committed checkpoint.
  const SlotInfo a = peek(shm_name(0)), b = peek(shm_name(1));
  const int target = (a.committed && (!b.committed || a.generation > b.generation)) ? 1 : 0;
  const uint64_t generation = std::max(a.generation, b.generation) + 1;
  // Keep the mapping between saves: building it costs more than the copy on some machines. A
  // mapping whose object was unlinked (the agent cleared memory) or is too small is replaced.
  const uint64_t need = kHeaderBytes + m.data_bytes + manifest_max;
  auto shm = std::static_pointer_cast<ShmMap>(write_maps_[target]);
  struct stat st {};
  if (!shm || shm->size < need || ::fstat(shm->fd, &st) != 0 || st.st_nlink == 0) {
    write_maps_[target].reset();
    shm = open_shm_for_write(shm_name(target), need);
    write_maps_[target] = shm;
  }
  Header* h = shm->header();
  store_state(h, 0);  // from here on, this object holds nothing loadable

  uint8_t* data = shm->base + kHeaderBytes;
  // Copy each chunk, then hash it from the destination while it is still in cache.
  const auto sums = for_chunks(buffer_sizes(m), [&](uint32_t b, uint64_t off, uint64_t n) {
    uint8_t* dst = data + m.buffers[b].offset + off;
    std::memcpy(dst, static_cast<const uint8_t*>(buffers[b].data) + off, n);
    return XXH3_64bits(dst, n);
  });
  for (size_t i = 0; i < sums.size(); ++i) m.buffers[i].xxh3 = sums[i];
  const std::string manifest = manifest_json(m).dump();
  const uint64_t manifest_offset = kHeaderBytes + m.data_bytes;
  std::memcpy(shm->base + manifest_offset, manifest.data(), manifest.size());
  std::memcpy(h->magic, kMagic, sizeof kMagic);
  h->version = kFormatVersion;
  h->generation = generation;
  h->step = step;
  h->data_bytes = m.data_bytes;
  h->manifest_offset = manifest_offset;
  h->manifest_bytes = manifest.size();
  h->manifest_xxh3 = XXH3_64bits(manifest.data(), manifest.size());
  store_state(h, 1);  // commit: last, with release order
  SaveStats s;
  s.bytes = m.data_bytes;
  s.seconds = since(t0);
  s.object = shm_name(target);
  return s;
}

std::optional<int64_t> FlashCheckpoint::newest_in_memory() const {
  const SlotInfo a = peek(shm_name(0)), b = peek(shm_name(1));
  if (!a.committed && !b.committed) return std::nullopt;
  if (a.committed && (!b.committed || a.generation > b.generation)) return a.step;
  return b.step;
}

std::vector<int64_t> FlashCheckpoint::memory_steps() const {
  std::vector<int64_t> out;
  for (int which = 0; which < 2; ++which)
    if (const SlotInfo s = peek(shm_name(which)); s.committed) out.push_back(s.step);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int64_t> FlashCheckpoint::storage_steps() const {
  std::vector<int64_t> out;
  if (options_.storage_dir.empty()) return out;
  char rank_name[32];
  std::snprintf(rank_name, sizeof rank_name, "rank-%05d.ckpt", options_.rank);
  for (const std::string& d : options_.storage->list(options_.storage_dir)) {
    auto step = parse_step_dir(d);
    if (!step) continue;
    const auto files = options_.storage->list(options_.storage_dir + "/" + d);
    if (std::find(files.begin(), files.end(), rank_name) != files.end()) out.push_back(*step);
  }
  return out;
}

std::vector<int64_t> FlashCheckpoint::complete_storage_steps() const {
  std::vector<int64_t> out;
  if (options_.storage_dir.empty()) return out;
  for (const std::string& d : options_.storage->list(options_.storage_dir)) {
    auto step = parse_step_dir(d);
    if (!step) continue;
    int ranks = 0;
    for (const std::string& f : options_.storage->list(options_.storage_dir + "/" + d))
      if (f.rfind("rank-", 0) == 0 && f.size() > 5 && f.substr(f.size() - 5) == ".ckpt") ++ranks;
    if (ranks >= options_.world_size) out.push_back(*step);
  }
  return out;
}

void FlashCheckpoint::remove_memory() {
  write_maps_[0].reset();
  write_maps_[1].reset();
  ::shm_unlink(shm_name(0).c_str());
  ::shm_unlink(shm_name(1).c_str());
}

std::optional<Loaded> FlashCheckpoint::load(std::optional<int64_t> want, bool zero_copy, const Destinations* into) {
  struct Candidate {
    int64_t step;
    Tier tier;
    std::string where;
  };
  std::vector<Candidate> cands;
  std::vector<std::string> skipped;
  // Memory: this rank's committed objects, if every rank committed that step in its own memory.
  for (int which = 0; which < 2 && options_.memory; ++which) {
    const SlotInfo s = peek(shm_name(which));
    if (!s.committed || (want && s.step != *want)) continue;
    bool complete = true;
    for (int32_t r = 0; r < options_.world_size && complete && options_.peers_share_memory; ++r) {
      if (r == options_.rank) continue;
      Options other = options_;
      other.rank = r;
      FlashCheckpoint peer(other);
      const SlotInfo pa = peek(peer.shm_name(0)), pb = peek(peer.shm_name(1));
      complete = (pa.committed && pa.step == s.step) || (pb.committed && pb.step == s.step);
    }
    if (complete) cands.push_back({s.step, Tier::Memory, shm_name(which)});
    else skipped.push_back(shm_name(which) + ": step " + std::to_string(s.step) + " is not committed by every rank");
  }
  for (int64_t step : complete_storage_steps())
    if (!want || step == *want) cands.push_back({step, Tier::Storage, rank_file(step, options_.rank)});
  // Newest first; at equal steps memory before storage.
  std::stable_sort(cands.begin(), cands.end(), [](const Candidate& x, const Candidate& y) {
    return x.step != y.step ? x.step > y.step : x.tier < y.tier;
  });
  for (const Candidate& c : cands) {
    try {
      Loaded l = c.tier == Tier::Memory ? read_shm(c.where, zero_copy && !into, nullptr, into)
                                        : read_checkpoint_file(*options_.storage, c.where);
      if (l.manifest.step != c.step) throw CheckpointError("holds step " + std::to_string(l.manifest.step));
      if (l.manifest.rank != options_.rank) throw CheckpointError("belongs to rank " + std::to_string(l.manifest.rank));
      l.skipped = std::move(skipped);
      return l;
    } catch (const CheckpointError& e) {
      skipped.push_back(c.where + ": " + e.what() + "; skipped");
    }
  }
  if (!skipped.empty()) {
    std::string why;
    for (const auto& s : skipped) why += "\n  " + s;
    throw CheckpointError("no valid checkpoint" + std::string(want ? " for step " + std::to_string(*want) : "") + ":" + why);
  }
  return std::nullopt;
}

uint64_t FlashCheckpoint::reserve(uint64_t data_bytes) {
  constexpr uint64_t kManifestRoom = 1 << 20;  // a save needs room for its manifest after the data
  const uint64_t size = kHeaderBytes + align64(data_bytes) + kManifestRoom;
  uint64_t allocated = 0;
  for (int which = 0; which < 2; ++which) {
    const std::string name = shm_name(which);
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) throw CheckpointError(sys_error("shm_open " + name));
    // Not ftruncate: a trainer may be growing the object at the same moment, and only a call
    // that never shrinks it is safe against that.
    const int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(size)) == 0 ? 0 : errno;
    ::close(fd);
    if (rc == EOPNOTSUPP) return 0;
    if (rc != 0) throw CheckpointError("reserve " + name + ": " + std::strerror(rc));
    allocated += size;
  }
  return allocated;
}

PersistStats FlashCheckpoint::persist() {
  PersistStats out;
  if (options_.storage_dir.empty()) throw CheckpointError("no storage directory configured");
  auto t0 = std::chrono::steady_clock::now();
  if (!persist_buffer_) persist_buffer_ = std::make_shared<Region>();
  // Copy the newest committed checkpoint out at memory speed, then write it at disk speed. The
  // trainer may start a save on that object meanwhile (two saves while we copy): then take the
  // newest again. It never waits for us.
  std::optional<Loaded> copied;
  int64_t step = -1;
  for (int attempt = 0; attempt < 8 && !copied; ++attempt) {
    const SlotInfo a = peek(shm_name(0)), b = peek(shm_name(1));
    if (!a.committed && !b.committed) return out;
    const bool newest_a = a.committed && (!b.committed || a.generation > b.generation);
    step = newest_a ? a.step : b.step;
    out.step = step;
    const auto have = storage_steps();
    if (std::find(have.begin(), have.end(), step) != have.end()) return out;
    try {
      copied = read_shm(shm_name(newest_a ? 0 : 1), /*zero_copy=*/false, static_cast<Region*>(persist_buffer_.get()));
    } catch (const Overwritten&) {
    }
  }
  if (!copied) throw CheckpointError("the trainer saved faster than a copy could be taken; will try again");
  Loaded& l = *copied;
  // What was copied may be newer than what was peeked: the copy's own manifest is the truth.
  step = l.manifest.step;
  out.step = step;
  {
    const auto have = storage_steps();
    if (std::find(have.begin(), have.end(), step) != have.end()) return out;
  }
  const std::string manifest = manifest_json(l.manifest).dump();
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kFormatVersion;
  h.state = 1;
  h.generation = 0;
  h.step = step;
  h.data_bytes = l.manifest.data_bytes;
  h.manifest_offset = kHeaderBytes + l.manifest.data_bytes;
  h.manifest_bytes = manifest.size();
  h.manifest_xxh3 = XXH3_64bits(manifest.data(), manifest.size());
  const std::string dir = step_dir(step);
  options_.storage->make_dirs(dir);
  out.path = rank_file(step, options_.rank);
  try {
    options_.storage->write_atomic(out.path, {{&h, sizeof h}, {l.data(), l.manifest.data_bytes}, {manifest.data(), manifest.size()}});
  } catch (...) {
    // A full or failing disk: leave no empty step directory behind (another rank's file, or its
    // write in progress, keeps it).
    try {
      if (options_.storage->list(dir).empty()) options_.storage->remove_all(dir);
    } catch (...) {
    }
    throw;
  }
  out.written = true;
  out.bytes = sizeof h + l.manifest.data_bytes + manifest.size();

  // Keep the newest `keep` complete steps, and anything newer than the oldest of them.
  const auto complete = complete_storage_steps();
  if (static_cast<int>(complete.size()) > options_.keep) {
    const int64_t oldest_kept = complete[complete.size() - static_cast<size_t>(options_.keep)];
    for (const std::string& d : options_.storage->list(options_.storage_dir)) {
      auto s = parse_step_dir(d);
      if (s && *s < oldest_kept) options_.storage->remove_all(options_.storage_dir + "/" + d);
    }
  }
  out.seconds = since(t0);
  return out;
}

// ---- operators ----------------------------------------------------------------------------------

std::vector<ObjectInfo> list_shm(const std::string& prefix) {
  std::vector<ObjectInfo> out;
  const std::string stem = prefix.empty() || prefix[0] != '/' ? prefix : prefix.substr(1);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string file = e.path().filename().string();
    if (file.rfind(stem, 0) != 0) continue;
    ObjectInfo info;
    info.name = "/" + file;
    const int fd = ::shm_open(info.name.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) continue;
    struct stat st {};
    ::fstat(fd, &st);
    info.bytes = static_cast<uint64_t>(st.st_size);
    Header h{};
    constexpr char kNothing[sizeof kMagic] = {};
    if (read_header(fd, h) && std::memcmp(h.magic, kNothing, sizeof kMagic) == 0) {
      info.error = "empty (reserved for the next save)";
    } else if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
      info.error = "not a Goodput checkpoint";
    } else if (h.state != 1) {
      info.error = "not committed (empty, or a save was interrupted)";
    } else {
      info.valid = true;
      info.step = h.step;
      info.generation = h.generation;
      std::vector<uint8_t> manifest(h.manifest_bytes);
      if (::pread(fd, manifest.data(), manifest.size(), static_cast<off_t>(h.manifest_offset)) ==
          static_cast<ssize_t>(manifest.size())) {
        try {
          const Manifest m = check_manifest(h, manifest.data());
          info.rank = m.rank;
          info.world_size = m.world_size;
        } catch (const CheckpointError& ex) {
          info.valid = false;
          info.error = ex.what();
        }
      }
    }
    ::close(fd);
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.name < b.name; });
  return out;
}

std::vector<ObjectInfo> list_storage(Storage& storage, const std::string& dir, bool verify) {
  std::vector<ObjectInfo> out;
  for (const std::string& d : storage.list(dir)) {
    auto step = parse_step_dir(d);
    if (!step) continue;
    for (const std::string& f : storage.list(dir + "/" + d)) {
      if (f.rfind("rank-", 0) != 0) continue;
      ObjectInfo info;
      info.name = dir + "/" + d + "/" + f;
      info.step = *step;
      try {
        if (verify) {
          const Loaded l = read_checkpoint_file(storage, info.name);
          info.rank = l.manifest.rank;
          info.world_size = l.manifest.world_size;
          if (l.manifest.step != *step) throw CheckpointError("holds step " + std::to_string(l.manifest.step));
        } else {
          // Header and manifest only.
          const auto bytes = storage.read(info.name);
          if (bytes.size() < kHeaderBytes) throw CheckpointError("truncated: not even a header");
          Header h;
          std::memcpy(&h, bytes.data(), sizeof h);
          const Manifest m = check_image(bytes.data(), bytes.size(), h);
          info.rank = m.rank;
          info.world_size = m.world_size;
        }
        info.valid = true;
      } catch (const CheckpointError& e) {
        info.error = e.what();
      }
      std::error_code ec;
      info.bytes = static_cast<uint64_t>(std::filesystem::file_size(info.name, ec));
      out.push_back(std::move(info));
    }
  }
  return out;
}

// ---- AsyncPersister ------------------------------------------------------------------------------

AsyncPersister::AsyncPersister(FlashCheckpoint& c, std::function<void(const std::string&)> on_error)
    : ckpt_(c), on_error_(std::move(on_error)), thread_([this] { loop(); }) {}

AsyncPersister::~AsyncPersister() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void AsyncPersister::request() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = true;  // several requests while one write runs become one more write
  }
  cv_.notify_all();
}

void AsyncPersister::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !pending_ && !running_; });
}

std::string AsyncPersister::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

void AsyncPersister::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || pending_; });
    if (stop_ && !pending_) return;
    pending_ = false;
    running_ = true;
    lock.unlock();
    std::string error;
    try {
      const PersistStats s = ckpt_.persist();
      if (s.written) {
        persisted_step_ = s.step;
        ++writes_;
      }
    } catch (const std::exception& e) {
      error = std::string("persist failed: ") + e.what();
      if (on_error_) on_error_(error);
    }
    lock.lock();
    if (!error.empty()) last_error_ = error;
    running_ = false;
    cv_.notify_all();
  }
}

}  // namespace goodput::ckpt
