#include "agent/node_check.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <Eigen/Dense>
#include <openssl/evp.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

namespace goodput::agent {

using Clock = std::chrono::steady_clock;

// ---- compute ---------------------------------------------------------------------------------------

ComputeResult compute_probe(std::chrono::milliseconds duration, double work_factor, bool corrupt) {
  constexpr int n = 256;
  // Entries in -2..2: a product's element is a sum of 256 terms of at most 4, exact in float.
  Eigen::MatrixXf a(n, n), b(n, n), c(n, n);
  std::vector<int32_t> exact(static_cast<size_t>(n) * n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      a(i, j) = static_cast<float>((i * 7 + j * 3) % 5 - 2);
      b(i, j) = static_cast<float>((i * 5 + j * 11) % 5 - 2);
    }
  for (int i = 0; i < n; ++i)  // the reference, in integers
    for (int j = 0; j < n; ++j) {
      int32_t s = 0;
      for (int k = 0; k < n; ++k) s += ((i * 7 + k * 3) % 5 - 2) * ((k * 5 + j * 11) % 5 - 2);
      exact[static_cast<size_t>(i) * n + j] = s;
    }
  ComputeResult r;
  int64_t counted = 0;
  double owed = 0;  // extra products still to do (work_factor)
  const auto start = Clock::now();
  const auto until = start + duration;
  do {
    c.noalias() = a * b;
    for (owed += std::max(work_factor, 1.0) - 1; owed >= 1; owed -= 1) c.noalias() = a * b;
    if (corrupt) c(17, 42) += 1;
    ++counted;
    for (int i = 0; i < n && r.ok; ++i)
      for (int j = 0; j < n; ++j)
        if (c(i, j) != static_cast<float>(exact[static_cast<size_t>(i) * n + j])) {
          r.ok = false;
          r.error = "matrix product differs from the exact result at (" + std::to_string(i) + "," + std::to_string(j) +
                    "): " + std::to_string(c(i, j)) + " instead of " + std::to_string(exact[static_cast<size_t>(i) * n + j]);
          break;
        }
  } while (r.ok && Clock::now() < until);
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  r.mflops = static_cast<int64_t>(2.0 * n * n * n * static_cast<double>(counted) / std::max(s, 1e-9) / 1e6);
  return r;
}

// ---- link ------------------------------------------------------------------------------------------

namespace {

constexpr char kMagic[4] = {'G', 'P', 'L', 'P'};
constexpr size_t kDigest = 32;

std::string probe_digest(const std::string& token) {
  const std::string text = token + "\nlink-probe";
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(text.data(), text.size(), md, &len, EVP_sha256(), nullptr) != 1 || len != kDigest)
    throw std::runtime_error("SHA-256 is not available");
  return std::string(reinterpret_cast<char*>(md), len);
}

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Waits until fd is readable (or writable) or the deadline passes.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

bool read_all(int fd, char* out, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    if (!wait_for(fd, POLLIN, deadline)) return false;
    const ssize_t r = ::recv(fd, out, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return false;
    out += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool write_all(int fd, const char* data, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    if (!wait_for(fd, POLLOUT, deadline)) return false;
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

void put_u64(char* out, uint64_t v) {
  for (int i = 7; i >= 0; --i, v >>= 8) out[i] = static_cast<char>(v & 0xff);
}
uint64_t get_u64(const char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(in[i]);
  return v;
}

constexpr int64_t kMaxProbeBytes = int64_t{1} << 32;  // a client cannot make the server read forever

}  // namespace

LinkProbeServer::LinkProbeServer(const std::string& token) : digest_(probe_digest(token)) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) throw std::runtime_error(std::string("link probe: socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof addr;
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 16) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    throw std::runtime_error("link probe: cannot listen: " + why);
  }
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { serve(); });
}

LinkProbeServer::~LinkProbeServer() {
  quit_ = true;
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
}

void LinkProbeServer::serve() {
  std::vector<char> buf(1 << 20);
  while (!quit_) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) continue;
    Fd conn(c);
    if (down_) continue;  // closed unanswered
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    char head[4 + kDigest + 8];
    if (!read_all(c, head, sizeof head, deadline) || std::memcmp(head, kMagic, 4) != 0 ||
        std::string(head + 4, kDigest) != digest_)
      continue;
    const uint64_t want = get_u64(head + 4 + kDigest);
    if (want > static_cast<uint64_t>(kMaxProbeBytes)) continue;
    uint64_t got = 0;
    while (got < want && !quit_) {
      if (!wait_for(c, POLLIN, deadline)) break;
      const ssize_t r = ::recv(c, buf.data(), std::min<uint64_t>(buf.size(), want - got), 0);
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (r <= 0) break;
      got += static_cast<uint64_t>(r);
    }
    char ack[8];
    put_u64(ack, got);
    write_all(c, ack, sizeof ack, deadline);
  }
}

LinkResult link_probe(const std::string& host, uint16_t port, const std::string& token, int64_t bytes,
                      std::chrono::milliseconds timeout) {
  LinkResult r;
  auto fail = [&](const std::string& why) {
    r.ok = false;
    r.error = "link to " + host + ":" + std::to_string(port) + ": " + why;
    return r;
  };
  if (bytes <= 0 || bytes > kMaxProbeBytes) return fail("probe size out of range");
  const auto deadline = Clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int e = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); e != 0)
    return fail(std::string("cannot resolve: ") + ::gai_strerror(e));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);
  Fd s(::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (s.fd < 0) return fail(std::string("socket: ") + std::strerror(errno));
  if (::connect(s.fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS)
    return fail(std::string("connect: ") + std::strerror(errno));
  if (!wait_for(s.fd, POLLOUT, deadline)) return fail("connect timed out");
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) return fail(std::string("connect: ") + std::strerror(err));
  const auto start = Clock::now();
  std::string head(kMagic, 4);
  head += probe_digest(token);
  char count[8];
  put_u64(count, static_cast<uint64_t>(bytes));
  head.append(count, 8);
  if (!write_all(s.fd, head.data(), head.size(), deadline)) return fail("closed by the peer");
  const std::vector<char> chunk(1 << 20, '\x5a');
  for (int64_t left = bytes; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(chunk.size())));
    if (!write_all(s.fd, chunk.data(), n, deadline))
      return fail("sending stopped after " + std::to_string(bytes - left) + " of " + std::to_string(bytes) + " bytes");
    left -= static_cast<int64_t>(n);
  }
  char ack[8];
  if (!read_all(s.fd, ack, sizeof ack, deadline)) return fail("no acknowledgement");
  if (get_u64(ack) != static_cast<uint64_t>(bytes))
    return fail("peer received " + std::to_string(get_u64(ack)) + " of " + std::to_string(bytes) + " bytes");
  const double sec = std::chrono::duration<double>(Clock::now() - start).count();
  r.mb_per_s = static_cast<int64_t>(static_cast<double>(bytes) / std::max(sec, 1e-9) / 1e6);
  return r;
}

}  // namespace goodput::agent
