// The HTTP/JSON transport of the live protocol (Boost.Beast on Asio): a single-threaded server that
// hands each request to one handler on the io_context's thread, and a blocking client with a deadline.
#pragma once

#include <atomic>
#include <cstdint>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

namespace goodput::net {

struct HttpRequest {
  std::string method;  // "GET", "POST"
  std::string target;  // path and query
  std::string authorization;
  std::string body;
  std::string peer_address = {};  // the client's IP as this server sees it
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::string retry_after = {};  // a client's view of the Retry-After header
};

// One request read from raw bytes exactly as the server reads a connection's (the same parser and
// limits): the request, or the answer the server gives bytes it refuses (400 malformed, 413 too
// large); neither when the bytes end before the request does. For the fuzzer and tests.
struct ParsedRequest {
  std::optional<HttpRequest> request;
  std::optional<HttpResponse> refusal;
};
ParsedRequest parse_request(std::string_view bytes, size_t body_limit = 1 << 20);

// TLS for the server: a PEM certificate chain and its private key (OpenSSL).
struct TlsFiles {
  std::string cert_file;
  std::string key_file;
};

// What the server refused before any handler saw a request, by reason (for /metrics: an operator
// alerting on abuse, or on agents of a version that sends what this master does not take).
struct HttpRefusals {
  uint64_t body_too_large = 0;     // 413: Content-Length or chunks over the body limit
  uint64_t headers_too_large = 0;  // 413: headers over 16 KiB
  uint64_t malformed = 0;          // 400: bytes that are not an HTTP request
  uint64_t slow_request = 0;       // closed: a request begun but not finished within the read timeout
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  // Listens on address:port (port 0: any free port); with tls, speaks only HTTPS (TLS 1.2+).
  // Bodies over body_limit bytes are refused with 413 before they are read. A connection that
  // sends nothing, or only part of a request, for read_timeout is closed.
  HttpServer(boost::asio::io_context& io, const std::string& address, uint16_t port, Handler handler,
             size_t body_limit = 1 << 20, const TlsFiles* tls = nullptr,
             std::chrono::milliseconds read_timeout = std::chrono::seconds(30));
  ~HttpServer();
  uint16_t port() const;
  void stop();
  HttpRefusals refusals() const;  // thread-safe

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

struct Url {
  std::string host;
  std::string port;
  bool tls = false;
  static Url parse(const std::string& url);  // "http[s]://host:port" (a trailing path is ignored)
};

// One request; nullopt when the server could not be reached, failed TLS verification, or did not
// answer within the timeout. https:// verifies the server against GOODPUT_CA_FILE if set, else the
// system's trust store.
std::optional<HttpResponse> http_call(const Url& url, const std::string& method, const std::string& target,
                                      const std::string& token, const std::string& body, int timeout_ms);
// How a client trusts a server and proves itself: a CA (file or PEM; else GOODPUT_CA_FILE, else the
// system's store) and an optional client certificate. Verification is on unless `insecure`.
struct TlsClient {
  std::string ca_file;
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  bool insecure = false;
};

// The same with any request headers (name, value); a body is sent as application/json.
using Headers = std::vector<std::pair<std::string, std::string>>;
std::optional<HttpResponse> http_request(const Url& url, const std::string& method, const std::string& target,
                                         const Headers& headers, const std::string& body, int timeout_ms,
                                         const TlsClient* tls = nullptr);

// A response read as it arrives (a Kubernetes watch): on_data gets each piece of a 200 body; any
// other status's body is returned whole. Ends when the server ends the body, the connection
// drops, nothing arrives for idle_timeout_ms, or `cancel` is set (checked every 200 ms).
struct StreamResult {
  int status = 0;          // 0: no answer
  bool completed = false;  // the server ended the body cleanly
  std::string error;       // why it ended otherwise
  std::string body;        // a non-200 answer's body
  std::string retry_after;
};
StreamResult http_stream(const Url& url, const std::string& method, const std::string& target, const Headers& headers,
                         const TlsClient* tls, int idle_timeout_ms, const std::atomic<bool>& cancel,
                         const std::function<void(std::string_view)>& on_data);

// A fresh bearer token: 24 bytes of /dev/urandom as hex. Throws std::runtime_error when it cannot be read.
std::string random_token();

}  // namespace goodput::net
