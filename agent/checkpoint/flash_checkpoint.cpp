#include "agent/checkpoint/flash_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "agent/checkpoint/memory_objects.h"

namespace goodput::ckpt {

using namespace detail;

const char* tier_name(Tier t) { return t == Tier::Memory ? "memory" : "storage"; }

const uint8_t* Loaded::buffer(const std::string& name, uint64_t* nbytes) const {
  for (const BufferInfo& b : manifest.buffers)
    if (b.name == name) {
      if (nbytes) *nbytes = b.nbytes;
      const auto p = placed.find(name);
      return p != placed.end() ? p->second : data_ + b.offset;
    }
  return nullptr;
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
  const auto [target, generation] = write_target(shm_name(0), shm_name(1));
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

int FlashCheckpoint::drop_memory_after(int64_t step) {
  int dropped = 0;
  for (int which = 0; which < 2; ++which) {
    const SlotInfo s = peek(shm_name(which));
    if (!s.committed || s.step <= step) continue;
    if (const auto m = open_shm(shm_name(which), /*writable=*/true)) {
      store_state(m->header(), 0);
      ++dropped;
    }
  }
  return dropped;
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

std::optional<Loaded> FlashCheckpoint::newest_copy() {
  if (!persist_buffer_) persist_buffer_ = std::make_shared<Region>();
  // Copy at memory speed. The trainer may start a save on that object meanwhile (two saves while
  // we copy): then take the newest again. It never waits for us.
  for (int attempt = 0; attempt < 8; ++attempt) {
    const SlotInfo a = peek(shm_name(0)), b = peek(shm_name(1));
    if (!a.committed && !b.committed) return std::nullopt;
    const bool newest_a = a.committed && (!b.committed || a.generation > b.generation);
    try {
      return read_shm(shm_name(newest_a ? 0 : 1), /*zero_copy=*/false, static_cast<Region*>(persist_buffer_.get()));
    } catch (const Overwritten&) {
    }
  }
  throw CheckpointError("the trainer saved faster than a copy could be taken; will try again");
}

PersistStats FlashCheckpoint::persist() {
  PersistStats out;
  if (options_.storage_dir.empty()) throw CheckpointError("no storage directory configured");
  auto t0 = std::chrono::steady_clock::now();
  // Copy the newest committed checkpoint out at memory speed, then write it at disk speed.
  if (const auto newest = newest_in_memory(); !newest) {
    return out;
  } else if (const auto have = storage_steps(); std::find(have.begin(), have.end(), *newest) != have.end()) {
    out.step = *newest;
    return out;
  }
  std::optional<Loaded> copied = newest_copy();
  if (!copied) return out;
  Loaded& l = *copied;
  // What was copied may be newer than what was peeked: the copy's own manifest is the truth.
  const int64_t step = l.manifest.step;
  out.step = step;
  {
    const auto have = storage_steps();
    if (std::find(have.begin(), have.end(), step) != have.end()) return out;
  }
  const std::string manifest = manifest_json(l.manifest).dump();
  const Header h = image_header(l.manifest, manifest);
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

}  // namespace goodput::ckpt
