#include "agent/replica.h"

#include <openssl/evp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <optional>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include "agent/checkpoint/format.h"
#include "agent/checkpoint/memory_objects.h"

namespace goodput::agent {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using ckpt::CheckpointError;
using ckpt::detail::Header;
using ckpt::detail::kHeaderBytes;

namespace {

constexpr char kMagic[4] = {'G', 'P', 'R', 'P'};
constexpr size_t kDigest = 32;
constexpr uint64_t kWireChunk = 4 << 20;
constexpr size_t kMaxKey = 128;
constexpr uint64_t kMaxImage = uint64_t{1} << 40;  // 1 TiB: a header promising more is refused unread
constexpr auto kIdle = std::chrono::seconds(30);   // the server's bound on each read and write

#pragma pack(push, 1)
struct Request {
  char magic[4];
  char digest[kDigest];
  char op;
  int32_t rank;
  int32_t world;
  int64_t step;
  uint16_t key_bytes;
};
struct Answer {
  uint8_t status;
  uint32_t message_bytes;
};
#pragma pack(pop)
static_assert(sizeof(Request) == 55 && sizeof(Answer) == 5);

std::string replica_digest(const std::string& token) {
  const std::string text = token + "\nreplica";
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(text.data(), text.size(), md, &len, EVP_sha256(), nullptr) != 1 || len != kDigest)
    throw std::runtime_error("SHA-256 failed");
  return std::string(reinterpret_cast<char*>(md), kDigest);
}

bool valid_key(const std::string& k) {
  return !k.empty() && k.size() <= kMaxKey && std::all_of(k.begin(), k.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
  });
}

// Reads or writes `n` bytes in chunks, each bounded by `limit`; `pace` (if set) is awaited after
// each chunk written (the sender's byte rate).
awaitable<void> read_all(beast::tcp_stream& s, uint8_t* p, uint64_t n, std::chrono::milliseconds limit) {
  for (uint64_t done = 0; done < n;) {
    const uint64_t part = std::min(kWireChunk, n - done);
    s.expires_after(limit);
    co_await asio::async_read(s, asio::buffer(p + done, part), use_awaitable);
    done += part;
  }
}

struct Pacer {
  double bytes_per_s = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  uint64_t sent = 0;
  awaitable<void> after(uint64_t bytes) {
    sent += bytes;
    if (bytes_per_s <= 0) co_return;
    const auto due = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(static_cast<double>(sent) / bytes_per_s));
    if (due <= std::chrono::steady_clock::now()) co_return;
    asio::steady_timer t(co_await asio::this_coro::executor, due);
    co_await t.async_wait(use_awaitable);
  }
};

awaitable<void> write_all(beast::tcp_stream& s, const uint8_t* p, uint64_t n, std::chrono::milliseconds limit,
                          Pacer* pace = nullptr) {
  for (uint64_t done = 0; done < n;) {
    const uint64_t part = std::min(kWireChunk, n - done);
    s.expires_after(limit);
    co_await asio::async_write(s, asio::buffer(p + done, part), use_awaitable);
    done += part;
    if (pace) co_await pace->after(part);
  }
}

awaitable<void> write_answer(beast::tcp_stream& s, bool ok, const std::string& message, std::chrono::milliseconds limit) {
  const Answer a{static_cast<uint8_t>(ok ? 0 : 1), static_cast<uint32_t>(message.size())};
  co_await write_all(s, reinterpret_cast<const uint8_t*>(&a), sizeof a, limit);
  co_await write_all(s, reinterpret_cast<const uint8_t*>(message.data()), message.size(), limit);
}

// The answer's status; a refusal throws CheckpointError with the holder's reason.
awaitable<void> read_answer(beast::tcp_stream& s, std::chrono::milliseconds limit, const std::string& who) {
  Answer a{};
  co_await read_all(s, reinterpret_cast<uint8_t*>(&a), sizeof a, limit);
  if (a.message_bytes > 64 * 1024) throw CheckpointError(who + " sent a malformed answer");
  std::string message(a.message_bytes, '\0');
  co_await read_all(s, reinterpret_cast<uint8_t*>(message.data()), message.size(), limit);
  if (a.status != 0) throw CheckpointError(who + " refused: " + message);
}

Request make_request(const std::string& token, char op, int32_t rank, int32_t world, int64_t step, const std::string& key) {
  if (!valid_key(key)) throw CheckpointError("replica key '" + key + "' is not 1-128 of [A-Za-z0-9._-]");
  Request r{};
  std::memcpy(r.magic, kMagic, sizeof kMagic);
  const std::string d = replica_digest(token);
  std::memcpy(r.digest, d.data(), kDigest);
  r.op = op;
  r.rank = rank;
  r.world = world;
  r.step = step;
  r.key_bytes = static_cast<uint16_t>(key.size());
  return r;
}

// Runs one client exchange to completion on a private io_context; its exception, if any, rethrown.
template <class Work> void run_client(const std::string& host, uint16_t port, std::chrono::milliseconds timeout, Work work) {
  asio::io_context io;
  std::exception_ptr failed;
  asio::co_spawn(
      io,
      [&]() -> awaitable<void> {
        tcp::resolver resolver(io);
        auto endpoints = co_await resolver.async_resolve(host, std::to_string(port), use_awaitable);
        beast::tcp_stream s(io);
        s.expires_after(timeout);
        co_await s.async_connect(endpoints, use_awaitable);
        co_await work(s);
      },
      [&](std::exception_ptr e) { failed = e; });
  io.run();
  if (!failed) return;
  try {
    std::rethrow_exception(failed);
  } catch (const CheckpointError&) {
    throw;
  } catch (const boost::system::system_error& e) {
    throw CheckpointError(host + ":" + std::to_string(port) + ": " +
                          (e.code() == beast::error::timeout ? std::string("timed out") : e.code().message()));
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// ---- the holder ------------------------------------------------------------------------------

struct ReplicaServer::Impl {
  std::string digest, holder;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  uint16_t port = 0;
  std::thread thread;

  mutable std::mutex mu;
  struct Copies {
    std::string a, b;
    bool busy = false;  // a put is writing one of them
  };
  std::map<std::pair<std::string, int32_t>, Copies> copies;  // (run key, rank) -> its objects

  Copies& copies_of(const std::string& key, int32_t rank) {
    auto [it, fresh] = copies.try_emplace({key, rank});
    if (fresh) {
      const std::string base = "/goodput-" + key + "-" + holder + "-held-r" + std::to_string(rank);
      it->second.a = base + "-a";
      it->second.b = base + "-b";
    }
    return it->second;
  }

  awaitable<void> accept() {
    while (true) {
      tcp::socket sock = co_await acceptor.async_accept(use_awaitable);
      asio::co_spawn(io, serve(std::move(sock)), asio::detached);
    }
  }

  awaitable<void> serve(tcp::socket sock) {
    beast::tcp_stream s(std::move(sock));
    const std::chrono::milliseconds limit = kIdle;
    try {
      Request r{};
      co_await read_all(s, reinterpret_cast<uint8_t*>(&r), sizeof r, limit);
      // A stranger (a wrong digest) gets nothing back, not even a refusal.
      if (std::memcmp(r.magic, kMagic, sizeof kMagic) != 0 || std::string(r.digest, kDigest) != digest) co_return;
      if (r.key_bytes > kMaxKey) co_return;
      std::string key(r.key_bytes, '\0');
      co_await read_all(s, reinterpret_cast<uint8_t*>(key.data()), key.size(), limit);
      std::string refusal;
      if (!valid_key(key)) refusal = "a malformed run key";
      else if (r.world < 1 || r.rank < 0 || r.rank >= r.world) refusal = "rank " + std::to_string(r.rank) + " outside a world of " + std::to_string(r.world);
      else if (r.op != 'P' && r.op != 'G') refusal = "unknown operation";
      if (!refusal.empty()) {
        co_await write_answer(s, false, refusal, limit);
        co_return;
      }
      if (r.op == 'P') co_await put(s, key, r, limit);
      else co_await get(s, key, r, limit);
    } catch (const std::exception&) {
      // The peer went away or stalled past the limit: its transfer failed, and it knows.
    }
  }

  awaitable<void> put(beast::tcp_stream& s, const std::string& key, const Request& r, std::chrono::milliseconds limit) {
    Header h{};
    co_await read_all(s, reinterpret_cast<uint8_t*>(&h), sizeof h, limit);
    Copies* c = nullptr;  // map entries are never erased: the pointer stays valid
    bool mine = false;
    {
      std::lock_guard lock(mu);
      c = &copies_of(key, r.rank);
      if (!c->busy) c->busy = mine = true;
    }
    if (!mine) {
      co_await write_answer(s, false, "another copy of rank " + std::to_string(r.rank) + " is being written", limit);
      co_return;
    }
    struct Release {
      Impl* self;
      Copies* c;
      ~Release() {
        std::lock_guard lock(self->mu);
        c->busy = false;
      }
    } release{this, c};
    std::string error;
    std::optional<ckpt::detail::ImageWriter> w;
    try {
      w.emplace(c->a, c->b, h, kMaxImage);
    } catch (const CheckpointError& e) {
      error = e.what();
    }
    if (!w) {
      co_await write_answer(s, false, error, limit);
      co_return;
    }
    co_await read_all(s, w->body(), w->body_bytes(), limit);
    try {
      w->commit(r.rank, r.world);
    } catch (const CheckpointError& e) {
      error = std::string("the copy failed its check here: ") + e.what();
    }
    co_await write_answer(s, error.empty(), error, limit);
  }

  awaitable<void> get(beast::tcp_stream& s, const std::string& key, const Request& r, std::chrono::milliseconds limit) {
    std::string name, error;
    {
      std::lock_guard lock(mu);
      const Copies& c = copies_of(key, r.rank);
      for (const std::string& n : {c.a, c.b})
        if (const auto slot = ckpt::detail::peek(n); slot.committed && slot.step == r.step) name = n;
    }
    std::optional<ckpt::Loaded> copy;
    if (name.empty()) {
      error = "holds no copy of rank " + std::to_string(r.rank) + " at step " + std::to_string(r.step);
    } else {
      try {  // verified here too: a holder does not hand out bytes it knows are wrong
        copy = ckpt::detail::read_shm(name, /*zero_copy=*/false);
        if (copy->manifest.step != r.step || copy->manifest.rank != r.rank || copy->manifest.world_size != r.world)
          throw CheckpointError("holds rank " + std::to_string(copy->manifest.rank) + " of " +
                                std::to_string(copy->manifest.world_size) + " at step " + std::to_string(copy->manifest.step));
      } catch (const CheckpointError& e) {
        copy.reset();
        error = "its copy of rank " + std::to_string(r.rank) + " at step " + std::to_string(r.step) + " failed its check: " + e.what();
      }
    }
    co_await write_answer(s, copy.has_value(), error, limit);
    if (!copy) co_return;
    const std::string manifest = ckpt::detail::manifest_json(copy->manifest).dump();
    const Header h = ckpt::detail::image_header(copy->manifest, manifest);
    co_await write_all(s, reinterpret_cast<const uint8_t*>(&h), sizeof h, limit);
    co_await write_all(s, copy->data(), copy->manifest.data_bytes, limit);
    co_await write_all(s, reinterpret_cast<const uint8_t*>(manifest.data()), manifest.size(), limit);
  }
};

ReplicaServer::ReplicaServer(const std::string& token, std::string holder) : impl_(std::make_unique<Impl>()) {
  impl_->digest = replica_digest(token);
  impl_->holder = std::move(holder);
  tcp::endpoint any(tcp::v4(), 0);
  impl_->acceptor.open(any.protocol());
  impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
  impl_->acceptor.bind(any);
  impl_->acceptor.listen();
  impl_->port = impl_->acceptor.local_endpoint().port();
  asio::co_spawn(impl_->io, impl_->accept(), asio::detached);
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

ReplicaServer::~ReplicaServer() {
  impl_->io.stop();
  impl_->thread.join();
  remove_all();
}

uint16_t ReplicaServer::port() const { return impl_->port; }

std::vector<HeldReplica> ReplicaServer::held() const {
  std::vector<HeldReplica> out;
  std::lock_guard lock(impl_->mu);
  for (const auto& [id, c] : impl_->copies)
    for (const std::string& n : {c.a, c.b})
      if (const auto slot = ckpt::detail::peek(n); slot.committed) out.push_back({id.second, slot.step});
  std::sort(out.begin(), out.end(), [](const HeldReplica& x, const HeldReplica& y) {
    return std::pair(x.rank, x.step) < std::pair(y.rank, y.step);
  });
  return out;
}

int ReplicaServer::corrupt() {
  int spoiled = 0;
  std::lock_guard lock(impl_->mu);
  for (const auto& [id, c] : impl_->copies)
    for (const std::string& n : {c.a, c.b}) {
      const auto m = ckpt::detail::open_shm(n, /*writable=*/true);
      if (!m || ckpt::detail::load_state(m->header()) != 1 || m->header()->data_bytes == 0) continue;
      m->base[kHeaderBytes] ^= 0x5a;
      ++spoiled;
    }
  return spoiled;
}

void ReplicaServer::remove_all() {
  std::lock_guard lock(impl_->mu);
  for (const auto& [id, c] : impl_->copies) {
    ::shm_unlink(c.a.c_str());
    ::shm_unlink(c.b.c_str());
  }
}

// ---- the sender and the fetching node ---------------------------------------------------------

ReplicaTransfer send_replica(const ckpt::Loaded& image, const std::string& key, const std::string& host, uint16_t port,
                             const std::string& token, double bytes_per_s, std::chrono::milliseconds timeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const ckpt::Manifest& m = image.manifest;
  const Request r = make_request(token, 'P', m.rank, m.world_size, -1, key);
  const std::string manifest = ckpt::detail::manifest_json(m).dump();
  const Header h = ckpt::detail::image_header(m, manifest);
  ReplicaTransfer out;
  out.step = m.step;
  run_client(host, port, timeout, [&](beast::tcp_stream& s) -> awaitable<void> {
    Pacer pace{bytes_per_s};
    co_await write_all(s, reinterpret_cast<const uint8_t*>(&r), sizeof r, timeout);
    co_await write_all(s, reinterpret_cast<const uint8_t*>(key.data()), key.size(), timeout);
    co_await write_all(s, reinterpret_cast<const uint8_t*>(&h), sizeof h, timeout);
    co_await write_all(s, image.data(), m.data_bytes, timeout, &pace);
    co_await write_all(s, reinterpret_cast<const uint8_t*>(manifest.data()), manifest.size(), timeout);
    co_await read_answer(s, timeout, "holder " + host + ":" + std::to_string(port));
  });
  out.bytes = sizeof r + key.size() + sizeof h + m.data_bytes + manifest.size();
  out.seconds = seconds_since(t0);
  return out;
}

ReplicaTransfer fetch_replica(ckpt::FlashCheckpoint& dest, const std::string& key, int64_t step, const std::string& host,
                              uint16_t port, const std::string& token, std::chrono::milliseconds timeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const ckpt::Options& o = dest.options();
  const Request r = make_request(token, 'G', o.rank, o.world_size, step, key);
  const std::string who = "holder " + host + ":" + std::to_string(port);
  ReplicaTransfer out;
  run_client(host, port, timeout, [&](beast::tcp_stream& s) -> awaitable<void> {
    co_await write_all(s, reinterpret_cast<const uint8_t*>(&r), sizeof r, timeout);
    co_await write_all(s, reinterpret_cast<const uint8_t*>(key.data()), key.size(), timeout);
    co_await read_answer(s, timeout, who);
    Header h{};
    co_await read_all(s, reinterpret_cast<uint8_t*>(&h), sizeof h, timeout);
    ckpt::detail::ImageWriter w(dest.shm_name(0), dest.shm_name(1), h, kMaxImage);
    co_await read_all(s, w.body(), w.body_bytes(), timeout);
    const ckpt::Manifest m = [&] {
      try {
        return w.commit(o.rank, o.world_size);
      } catch (const CheckpointError& e) {
        throw CheckpointError("the copy from " + who + " failed its check: " + e.what());
      }
    }();
    if (m.step != step) throw CheckpointError(who + " sent step " + std::to_string(m.step) + ", not " + std::to_string(step));
    out.step = m.step;
    out.bytes = sizeof h + w.body_bytes();
  });
  out.seconds = seconds_since(t0);
  return out;
}

}  // namespace goodput::agent
