// Event-driven HTTP/1.1 on Boost.Beast/Asio: a few io threads serve every connection (keep-alive,
// chunked server-sent events), no thread per connection. A handler gets the parsed request and a
// responder it may complete later from any thread (e.g. the engine's output callback).
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"
#include "server/cors.h"

namespace nibble::server {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // without the query
  std::string query;   // after '?', if any
  std::string body;
  std::string content_type;
  std::string authorization;
  std::string origin;  // CORS: the browser's Origin header, if any
};

// Thread-safe; every call is carried out on the connection's own executor, in call order.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  // A whole response (Content-Length framing).
  virtual void respond(int status, std::string content_type, std::string body) = 0;
  // A streamed response: headers now (chunked text/event-stream), then chunks, then the end.
  virtual void start_stream(int status = 200) = 0;
  virtual void send_chunk(std::string data) = 0;
  virtual void end_stream() = 0;
  // Called once if the client goes away before the response ended (or the write failed).
  virtual void on_disconnect(std::function<void()> callback) = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, std::shared_ptr<HttpResponder>)>;

struct HttpStats {
  std::atomic<int64_t> open_connections{0};
  std::atomic<int64_t> open_responses{0};  // requests being handled (a response not yet ended)
  std::atomic<uint64_t> requests{0};
};

class HttpServer {
 public:
  HttpServer(boost::asio::io_context& io, HttpHandler handler, std::shared_ptr<HttpStats> stats, CorsPolicy cors = {});
  ~HttpServer();
  // Binds and starts accepting; a port in use or a bad host is an error. port 0 picks a free one.
  Status listen(const std::string& host, uint16_t port);
  uint16_t port() const;
  void stop_accepting();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace nibble::server
