#include "agent/checkpoint/memory_objects.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace goodput::ckpt::detail {

// Anonymous memory backed by huge pages where the kernel allows: a restore's destination is fresh
// memory, and faulting it in 4 KiB at a time costs more than the copy on some machines.
std::shared_ptr<uint8_t> huge_alloc(uint64_t bytes) {
  const uint64_t size = std::max<uint64_t>((bytes + (2u << 20) - 1) & ~uint64_t((2u << 20) - 1), 2u << 20);
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw CheckpointError("out of memory for " + std::to_string(bytes) + " bytes");
  ::madvise(p, size, MADV_HUGEPAGE);
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [size](uint8_t* q) { ::munmap(q, size); });
}

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

WriteTarget write_target(const std::string& a, const std::string& b) {
  const SlotInfo x = peek(a), y = peek(b);
  return {(x.committed && (!y.committed || x.generation > y.generation)) ? 1 : 0, std::max(x.generation, y.generation) + 1};
}

ImageWriter::ImageWriter(const std::string& a, const std::string& b, const Header& h, uint64_t max_bytes) : header_(h) {
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) throw CheckpointError("not a Goodput checkpoint (bad magic)");
  if (h.version != kFormatVersion)
    throw CheckpointError("format version " + std::to_string(h.version) + ", this build reads " + std::to_string(kFormatVersion));
  if (h.manifest_offset != kHeaderBytes + h.data_bytes || h.data_bytes > max_bytes || h.manifest_bytes > max_bytes ||
      h.data_bytes + h.manifest_bytes > max_bytes - kHeaderBytes)
    throw CheckpointError("a header promising " + std::to_string(h.data_bytes) + " data and " +
                          std::to_string(h.manifest_bytes) + " manifest bytes (at most " + std::to_string(max_bytes) +
                          " in all, the manifest right after the data)");
  size_ = kHeaderBytes + h.data_bytes + h.manifest_bytes;
  const WriteTarget t = write_target(a, b);
  name_ = t.which == 0 ? a : b;
  header_.generation = t.generation;
  map_ = open_shm_for_write(name_, size_);
  store_state(map_->header(), 0);  // from here on, this object holds nothing loadable
}

Manifest ImageWriter::commit(int32_t rank, int32_t world_size) {
  Header* h = map_->header();
  Header fields = header_;
  fields.state = 0;
  std::memcpy(static_cast<void*>(h), &fields, sizeof fields);
  const Manifest m = check_image(map_->base, size_, fields);
  if (m.rank != rank || m.world_size != world_size)
    throw CheckpointError("holds rank " + std::to_string(m.rank) + " of " + std::to_string(m.world_size) + ", not rank " +
                          std::to_string(rank) + " of " + std::to_string(world_size));
  verify_in_place(m, body());
  store_state(h, 1);  // commit: last, with release order
  return m;
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


Loaded read_shm(const std::string& name, bool zero_copy, Region* reuse, const Destinations* into) {
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
    // A save may start between the header and the manifest: a manifest that does not check out is
    // then a torn read (Overwritten: take the newest again), not a damaged checkpoint.
    auto overwritten_since = [&] {
      Header now{};
      return !read_header(fd, now) || now.state != 1 || now.generation != snap.generation;
    };
    try {
      check_header(snap, static_cast<uint64_t>(st.st_size), read ? manifest.data() : nullptr);
      if (!read) throw CheckpointError("truncated manifest");
      out.manifest = check_manifest(snap, manifest.data());
    } catch (const CheckpointError&) {
      if (overwritten_since()) throw Overwritten();
      throw;
    }
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
    if (overwritten_since()) throw Overwritten();
    check_sums(man, sums);
    out.keepalive_ = buf.data;
    out.data_ = dst;
  }
  out.seconds = since(t0);
  return out;
}

}  // namespace goodput::ckpt::detail
