// The HTTP/JSON transport of the live protocol (Boost.Beast on Asio): a single-threaded server that
// hands each request to one handler on the io_context's thread, and a blocking client with a deadline.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/io_context.hpp>

namespace goodput::live {

struct HttpRequest {
  std::string method;  // "GET", "POST"
  std::string target;  // path and query
  std::string authorization;
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  // Listens on address:port (port 0: any free port). Bodies over body_limit bytes are refused
  // with 413 before they are read.
  HttpServer(boost::asio::io_context& io, const std::string& address, uint16_t port, Handler handler,
             size_t body_limit = 1 << 20);
  ~HttpServer();
  uint16_t port() const;
  void stop();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

struct Url {
  std::string host;
  std::string port;
  static Url parse(const std::string& url);  // "http://host:port" (a trailing path is ignored)
};

// One request; nullopt when the server could not be reached or did not answer within the timeout.
std::optional<HttpResponse> http_call(const Url& url, const std::string& method, const std::string& target,
                                      const std::string& token, const std::string& body, int timeout_ms);

}  // namespace goodput::live
