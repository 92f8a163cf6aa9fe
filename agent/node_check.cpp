#include "agent/node_check.h"

#include "agent/program.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <Eigen/Dense>
#include <nlohmann/json.hpp>
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
  // The rate is per CPU second of this thread: a machine's arithmetic, not how busy its scheduler
  // is (agents share a machine in tests; a neighbour's load is the runtime straggler check's job).
  auto cpu_seconds = [] {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  };
  const double cpu_start = cpu_seconds();
  const auto until = Clock::now() + duration;
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
  const double s = cpu_seconds() - cpu_start;
  r.mflops = static_cast<int64_t>(2.0 * n * n * n * static_cast<double>(counted) / std::max(s, 1e-9) / 1e6);
  return r;
}

// ---- link ------------------------------------------------------------------------------------------

namespace {

constexpr char kMagic[4] = {'G', 'P', 'L', 'P'};
constexpr char kCollectiveMagic[4] = {'G', 'P', 'L', 'G'};
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
    const bool collective = read_all(c, head, sizeof head, deadline) && std::memcmp(head, kCollectiveMagic, 4) == 0;
    if ((!collective && std::memcmp(head, kMagic, 4) != 0) || std::string(head + 4, kDigest) != digest_) continue;
    const uint64_t want = get_u64(head + 4 + kDigest);
    if (want > static_cast<uint64_t>(kMaxProbeBytes)) continue;
    if (collective) {
      serve_collective(c, static_cast<int64_t>(want));
      continue;
    }
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

void LinkProbeServer::set_collective(std::vector<std::string> argv, std::vector<std::string> env) {
  std::lock_guard lock(mu_);
  collective_argv_ = std::move(argv);
  collective_env_ = std::move(env);
}

void LinkProbeServer::serve_collective(int conn, int64_t bytes) {
  std::vector<std::string> argv, env;
  // The master tells every agent the program with its heartbeat answers; a partner may be asked
  // before its next heartbeat brought it: give it a moment.
  for (int i = 0; i < 60 && argv.empty() && !quit_; ++i) {
    {
      std::lock_guard lock(mu_);
      argv = collective_argv_;
      env = collective_env_;
    }
    if (argv.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const uint16_t port = free_tcp_port();
  if (argv.empty() || port == 0) return;  // closed unanswered: the client reports it
  for (const std::string& a : {std::string("--rank"), std::string("0"), std::string("--addr"), std::string("127.0.0.1"),
                               std::string("--port"), std::to_string(port), std::string("--bytes"), std::to_string(bytes),
                               std::string("--timeout"), std::string("20")})
    argv.push_back(a);
  Program p = spawn_program(argv, env);
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  const char answer[2] = {static_cast<char>(port >> 8), static_cast<char>(port & 0xff)};
  if (p.pid > 0) write_all(conn, answer, sizeof answer, deadline);
  finish_program(p, deadline);
}

namespace {

// Connects to host:port before the deadline; on failure returns -1 with the reason in `why`.
int connect_to(const std::string& host, uint16_t port, Clock::time_point deadline, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (const int e = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); e != 0) {
    why = std::string("cannot resolve: ") + ::gai_strerror(e);
    return -1;
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    why = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  int err = 0;
  if (::connect(fd, res->ai_addr, res->ai_addrlen) != 0 && errno != EINPROGRESS) {
    err = errno;
  } else if (!wait_for(fd, POLLOUT, deadline)) {
    why = "connect timed out";
  } else {
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  }
  if (err != 0) why = std::string("connect: ") + std::strerror(err);
  if (!why.empty()) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

LinkResult collective_probe(const std::string& host, uint16_t port, const std::string& token, int64_t bytes,
                            std::chrono::milliseconds timeout, const std::vector<std::string>& program,
                            const std::vector<std::string>& env) {
  LinkResult r;
  auto fail = [&](const std::string& why) {
    r.ok = false;
    r.error = "collective with " + host + ":" + std::to_string(port) + ": " + why;
    return r;
  };
  if (program.empty()) return fail("no collective probe program");
  if (bytes <= 0 || bytes > kMaxProbeBytes) return fail("probe size out of range");
  const auto deadline = Clock::now() + timeout;
  std::string why;
  Fd s(connect_to(host, port, deadline, why));
  if (s.fd < 0) return fail(why);
  std::string head(kCollectiveMagic, 4);
  head += probe_digest(token);
  char count[8];
  put_u64(count, static_cast<uint64_t>(bytes));
  head.append(count, 8);
  char answer[2];
  if (!write_all(s.fd, head.data(), head.size(), deadline) || !read_all(s.fd, answer, sizeof answer, deadline))
    return fail("the peer started no rank 0");
  const uint16_t store = static_cast<uint16_t>((static_cast<unsigned char>(answer[0]) << 8) | static_cast<unsigned char>(answer[1]));
  std::vector<std::string> argv = program;
  const auto left = std::chrono::duration_cast<std::chrono::seconds>(deadline - Clock::now()).count();
  for (const std::string& a : {std::string("--rank"), std::string("1"), std::string("--addr"), host, std::string("--port"),
                               std::to_string(store), std::string("--bytes"), std::to_string(bytes), std::string("--timeout"),
                               std::to_string(std::max<int64_t>(left - 1, 1))})
    argv.push_back(a);
  Program p = spawn_program(argv, env);
  if (p.pid < 0) return fail("cannot start " + program.front() + ": " + std::strerror(errno));
  const std::string out = finish_program(p, deadline).out;
  std::string last;
  for (size_t start = 0; start < out.size();) {
    const size_t nl = out.find('\n', start);
    const std::string line = out.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if (!line.empty()) last = line;
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  try {
    const auto j = nlohmann::json::parse(last);
    if (!j.value("ok", false)) return fail(j.value("error", std::string("failed")));
    r.mb_per_s = j.value("mb_per_s", int64_t{0});
    return r;
  } catch (const std::exception&) {
    return fail(last.empty() ? "the probe program printed no result" : "the probe program printed '" + last.substr(0, 200) + "'");
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
  std::string why;
  Fd s(connect_to(host, port, deadline, why));
  if (s.fd < 0) return fail(why);
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
