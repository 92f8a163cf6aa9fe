// The file system under flash checkpoints: atomic writes (temporary name, fsync, rename, fsync of
// the directory), large files around the page cache.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "agent/checkpoint/format.h"

namespace goodput::ckpt {

using namespace detail;

namespace {

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

}  // namespace

std::shared_ptr<Storage> posix_storage() { return std::make_shared<PosixStorage>(); }

}  // namespace goodput::ckpt
