// What operators see (`goodput ckpt`): the objects in shared memory and the files in storage, and
// one of either read and verified.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "agent/checkpoint/memory_objects.h"

namespace goodput::ckpt {

using namespace detail;

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

}  // namespace goodput::ckpt
