#include "net/http.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

namespace goodput::net {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

namespace {

// The server's refusal counters, shared with its connections (which may outlive the server).
struct RefusalCounters {
  std::atomic<uint64_t> body_too_large{0}, headers_too_large{0}, malformed{0}, slow_request{0};
  void count(beast::error_code ec) {
    if (ec == http::error::body_limit) ++body_too_large;
    else if (ec == http::error::header_limit) ++headers_too_large;
    else ++malformed;
  }
};

using Parser = http::request_parser<http::string_body>;

void set_limits(Parser& p, size_t body_limit) {
  p.body_limit(body_limit);
  p.header_limit(16 * 1024);
}

// What the server answers bytes it cannot take as a request, then hangs up.
HttpResponse refusal(beast::error_code ec) {
  const bool too_big = ec == http::error::body_limit || ec == http::error::header_limit;
  return {too_big ? 413 : 400, "application/json",
          std::string(R"({"error":")") + (too_big ? "request too large" : "malformed request") + "\"}"};
}

HttpRequest request_from(const http::request<http::string_body>& req) {
  HttpRequest r;
  r.method = std::string(req.method_string());
  r.target = std::string(req.target());
  if (auto it = req.find(http::field::authorization); it != req.end()) r.authorization = std::string(it->value());
  r.body = req.body();
  return r;
}

beast::tcp_stream& lowest(beast::tcp_stream& s) { return s; }
beast::tcp_stream& lowest(TlsStream& s) { return beast::get_lowest_layer(s); }

// One connection: read a request, answer it, repeat while the client keeps it alive.
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(Stream stream, const HttpServer::Handler& handler, size_t body_limit, std::chrono::milliseconds read_timeout,
          std::shared_ptr<RefusalCounters> refusals)
      : stream_(std::move(stream)),
        handler_(handler),
        body_limit_(body_limit),
        read_timeout_(read_timeout),
        refusals_(std::move(refusals)) {}

  void start() {
    if constexpr (std::is_same_v<Stream, TlsStream>) {
      lowest(stream_).expires_after(read_timeout_);
      stream_.async_handshake(ssl::stream_base::server, [self = this->shared_from_this()](beast::error_code ec) {
        if (!ec) self->read();  // a client that does not speak TLS is simply dropped
      });
    } else {
      read();
    }
  }

 private:
  void read() {
    parser_.emplace();
    set_limits(*parser_, body_limit_);
    lowest(stream_).expires_after(read_timeout_);
    http::async_read(stream_, buffer_, *parser_, [self = this->shared_from_this()](beast::error_code ec, size_t) {
      self->on_read(ec);
    });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::connection_reset) {
      // An idle keep-alive connection timing out is normal; one that began a request and stalled is not.
      if (ec == beast::error::timeout && parser_->got_some()) ++refusals_->slow_request;
      close();
      return;
    }
    if (ec) {
      refusals_->count(ec);
      respond(refusal(ec), false);  // oversized or malformed: answer once, then hang up
      return;
    }
    const auto& req = parser_->get();
    HttpRequest r = request_from(req);
    beast::error_code peer_ec;
    const auto peer = lowest(stream_).socket().remote_endpoint(peer_ec);
    if (!peer_ec) r.peer_address = peer.address().to_string();
    HttpResponse out;
    try {
      out = handler_(r);
    } catch (const std::exception& e) {
      out = {500, "application/json", std::string(R"({"error":"internal error"})")};
    }
    respond(out, req.keep_alive());
  }

  void respond(const HttpResponse& r, bool keep_alive) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(r.status), 11);
    res->set(http::field::server, "goodput");
    res->set(http::field::content_type, r.content_type);
    res->keep_alive(keep_alive);
    res->body() = r.body;
    res->prepare_payload();
    http::async_write(stream_, *res, [self = this->shared_from_this(), res, keep_alive](beast::error_code ec, size_t) {
      if (ec || !keep_alive) return self->close();
      self->read();
    });
  }

  void close() {
    beast::error_code ec;
    lowest(stream_).socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
  const HttpServer::Handler& handler_;
  size_t body_limit_;
  std::chrono::milliseconds read_timeout_;
  std::shared_ptr<RefusalCounters> refusals_;
};

}  // namespace

ParsedRequest parse_request(std::string_view bytes, size_t body_limit) {
  Parser p;
  set_limits(p, body_limit);
  p.eager(true);
  size_t used = 0;
  while (!p.is_done() && used < bytes.size()) {
    beast::error_code ec;
    const size_t n = p.put(asio::buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    if (ec == http::error::need_more) {
      if (n == 0) break;  // the bytes end inside the header
      continue;
    }
    if (ec) return {std::nullopt, refusal(ec)};
    if (n == 0) break;
  }
  if (!p.is_done()) return {};
  return {request_from(p.get()), std::nullopt};
}

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  Impl(asio::io_context& io, Handler h, size_t limit, std::chrono::milliseconds timeout)
      : acceptor(io), handler(std::move(h)), body_limit(limit), read_timeout(timeout) {}
  void accept() {
    acceptor.async_accept([self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
      if (!ec) {
        ::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);
        if (self->tls)
          std::make_shared<Session<TlsStream>>(TlsStream(std::move(socket), *self->tls), self->handler, self->body_limit,
                                               self->read_timeout, self->refusals)
              ->start();
        else
          std::make_shared<Session<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)), self->handler,
                                                       self->body_limit, self->read_timeout, self->refusals)
              ->start();
      }
      self->accept();
    });
  }
  tcp::acceptor acceptor;
  Handler handler;
  size_t body_limit;
  std::chrono::milliseconds read_timeout;
  std::shared_ptr<RefusalCounters> refusals = std::make_shared<RefusalCounters>();
  std::optional<ssl::context> tls;
};

HttpServer::HttpServer(asio::io_context& io, const std::string& address, uint16_t port, Handler handler,
                       size_t body_limit, const TlsFiles* tls, std::chrono::milliseconds read_timeout)
    : impl_(std::make_shared<Impl>(io, std::move(handler), body_limit, read_timeout)) {
  if (tls) {
    impl_->tls.emplace(ssl::context::tls_server);
    impl_->tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                            ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
    try {
      impl_->tls->use_certificate_chain_file(tls->cert_file);
      impl_->tls->use_private_key_file(tls->key_file, ssl::context::pem);
    } catch (const boost::system::system_error& e) {
      throw std::runtime_error("TLS: cannot use " + tls->cert_file + " / " + tls->key_file + ": " + e.what());
    }
  }
  const tcp::endpoint ep(asio::ip::make_address(address), port);
  impl_->acceptor.open(ep.protocol());
  // Processes this one starts (agents, trainers) must not inherit the listening socket: a master
  // restarted after a crash has to bind this port again while they live on.
  ::fcntl(impl_->acceptor.native_handle(), F_SETFD, FD_CLOEXEC);
  impl_->acceptor.set_option(asio::socket_base::reuse_address(true));
  beast::error_code ec;
  impl_->acceptor.bind(ep, ec);
  if (ec) throw std::runtime_error("cannot listen on " + address + ":" + std::to_string(port) + ": " + ec.message());
  impl_->acceptor.listen();
  impl_->accept();
}

HttpServer::~HttpServer() { stop(); }

uint16_t HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }

HttpRefusals HttpServer::refusals() const {
  const RefusalCounters& c = *impl_->refusals;
  return {c.body_too_large.load(), c.headers_too_large.load(), c.malformed.load(), c.slow_request.load()};
}

void HttpServer::stop() {
  beast::error_code ec;
  if (impl_->acceptor.is_open()) impl_->acceptor.close(ec);
}

Url Url::parse(const std::string& url) {
  Url u;
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  else if (rest.rfind("https://", 0) == 0) {
    rest = rest.substr(8);
    u.tls = true;
  } else if (rest.find("://") != std::string::npos) {
    throw std::invalid_argument("only http:// and https:// URLs are supported: " + url);
  }
  rest = rest.substr(0, rest.find('/'));
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon + 1 == rest.size()) throw std::invalid_argument("URL needs host:port: " + url);
  u.host = rest.substr(0, colon);
  u.port = rest.substr(colon + 1);
  return u;
}

namespace {

template <class Stream>
void exchange(Stream& stream, http::request<http::string_body>& req, beast::flat_buffer& buffer,
              http::response<http::string_body>& res, bool& ok) {
  http::async_write(stream, req, [&](beast::error_code ec, size_t) {
    if (ec) return;
    http::async_read(stream, buffer, res, [&](beast::error_code ec, size_t) { ok = !ec; });
  });
}

}  // namespace

std::optional<HttpResponse> http_call(const Url& url, const std::string& method, const std::string& target,
                                      const std::string& token, const std::string& body, int timeout_ms) {
  Headers headers;
  if (!token.empty()) headers.emplace_back("Authorization", "Bearer " + token);
  return http_request(url, method, target, headers, body, timeout_ms);
}

namespace {

// A client's TLS context: the given CA (file or PEM) or GOODPUT_CA_FILE or the system's store; a
// client certificate if given; verification always on unless `insecure` is asked for.
std::unique_ptr<ssl::context> client_context(const TlsClient* t) {
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_client);
  const char* env_ca = std::getenv("GOODPUT_CA_FILE");
  if (t && !t->ca_pem.empty()) ctx->add_certificate_authority(asio::buffer(t->ca_pem));
  else if (t && !t->ca_file.empty()) ctx->load_verify_file(t->ca_file);
  else if (env_ca && *env_ca) ctx->load_verify_file(env_ca);
  else ctx->set_default_verify_paths();
  if (t && !t->cert_pem.empty()) {
    ctx->use_certificate_chain(asio::buffer(t->cert_pem));
    ctx->use_private_key(asio::buffer(t->key_pem), ssl::context::pem);
  }
  ctx->set_verify_mode(t && t->insecure ? ssl::verify_none : ssl::verify_peer);
  return ctx;
}

// One connection, plain or TLS, connected (and handshaken) within the io_context's run.
struct Connection {
  Connection(asio::io_context& io, const Url& url, const TlsClient* t) : resolver(io) {
    if (url.tls) {
      ctx = client_context(t);
      tls.emplace(io, *ctx);
      if (!(t && t->insecure)) tls->set_verify_callback(ssl::host_name_verification(url.host));
      SSL_set_tlsext_host_name(tls->native_handle(), url.host.c_str());
    } else {
      plain.emplace(io);
    }
  }
  beast::tcp_stream& low() { return tls ? beast::get_lowest_layer(*tls) : *plain; }
  // then(ok) once connected (and the TLS handshake is done), or with ok = false.
  void open(const Url& url, std::function<void(bool)> then) {
    resolver.async_resolve(url.host, url.port, [this, then](beast::error_code ec, tcp::resolver::results_type results) {
      if (ec) return then(false);
      low().async_connect(results, [this, then](beast::error_code ec, const tcp::endpoint&) {
        if (ec) return then(false);
        if (!tls) return then(true);
        tls->async_handshake(ssl::stream_base::client, [then](beast::error_code ec) { then(!ec); });
      });
    });
  }
  template <class F> void with_stream(F&& f) {
    if (tls) f(*tls);
    else f(*plain);
  }
  tcp::resolver resolver;
  std::unique_ptr<ssl::context> ctx;
  std::optional<TlsStream> tls;
  std::optional<beast::tcp_stream> plain;
};

http::request<http::string_body> make_request(const Url& url, const std::string& method, const std::string& target,
                                              const Headers& headers, const std::string& body) {
  http::request<http::string_body> req(http::string_to_verb(method), target, 11);
  req.set(http::field::host, url.host);
  if (!body.empty()) req.set(http::field::content_type, "application/json");
  for (const auto& [name, value] : headers) req.set(name, value);
  req.body() = body;
  req.prepare_payload();
  return req;
}

}  // namespace

std::optional<HttpResponse> http_request(const Url& url, const std::string& method, const std::string& target,
                                         const Headers& headers, const std::string& body, int timeout_ms,
                                         const TlsClient* tls) {
  asio::io_context io;
  auto req = make_request(url, method, target, headers, body);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  bool ok = false;
  Connection c(io, url, tls);
  c.low().expires_after(std::chrono::milliseconds(timeout_ms));
  c.open(url, [&](bool connected) {
    if (connected) c.with_stream([&](auto& s) { exchange(s, req, buffer, res, ok); });
  });
  io.run_for(std::chrono::milliseconds(timeout_ms + 100));
  if (!ok) return std::nullopt;
  HttpResponse out{static_cast<int>(res.result_int()), std::string(res[http::field::content_type]), res.body()};
  out.retry_after = std::string(res[http::field::retry_after]);
  return out;
}

StreamResult http_stream(const Url& url, const std::string& method, const std::string& target, const Headers& headers,
                         const TlsClient* tls, int idle_timeout_ms, const std::atomic<bool>& cancel,
                         const std::function<void(std::string_view)>& on_data) {
  asio::io_context io;
  auto req = make_request(url, method, target, headers, "");
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);  // a watch has no end
  StreamResult result;
  std::string error_body;
  char piece[16384];
  bool finished = false;
  Connection c(io, url, tls);
  auto idle = std::chrono::milliseconds(idle_timeout_ms);
  c.low().expires_after(idle);
  std::function<void()> read_body;
  c.with_stream([&](auto& s) {
    read_body = [&] {
      parser.get().body().data = piece;
      parser.get().body().size = sizeof piece;
      c.low().expires_after(idle);
      http::async_read_some(s, buffer, parser, [&](beast::error_code ec, size_t) {
        if (ec == http::error::need_buffer) ec = {};
        const size_t n = sizeof piece - parser.get().body().size;
        if (n > 0) {
          if (result.status == 200) on_data(std::string_view(piece, n));
          else if (error_body.size() < 65536) error_body.append(piece, n);
        }
        if (ec) {
          result.error = ec.message();
          finished = true;
          return;
        }
        if (parser.is_done()) {
          result.completed = true;
          finished = true;
          return;
        }
        if (cancel) {
          result.error = "cancelled";
          finished = true;
          return;
        }
        read_body();
      });
    };
  });
  c.open(url, [&](bool connected) {
    if (!connected) {
      result.error = "cannot connect";
      finished = true;
      return;
    }
    c.with_stream([&](auto& s) {
      http::async_write(s, req, [&](beast::error_code ec, size_t) {
        if (ec) {
          result.error = ec.message();
          finished = true;
          return;
        }
        http::async_read_header(s, buffer, parser, [&](beast::error_code ec, size_t) {
          if (ec) {
            result.error = ec.message();
            finished = true;
            return;
          }
          result.status = static_cast<int>(parser.get().result_int());
          result.retry_after = std::string(parser.get()[http::field::retry_after]);
          read_body();
        });
      });
    });
  });
  while (!finished && !io.stopped()) {
    io.run_for(std::chrono::milliseconds(200));
    if (cancel && !finished) {
      result.error = "cancelled";
      break;
    }
  }
  if (result.status != 200) result.body = std::move(error_body);
  return result;
}

std::string random_token() {
  unsigned char b[24];
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  const bool ok = fd >= 0 && ::read(fd, b, sizeof b) == static_cast<ssize_t>(sizeof b);
  if (fd >= 0) ::close(fd);
  if (!ok) throw std::runtime_error("cannot read /dev/urandom for a token");
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

}  // namespace goodput::net
