// A small asynchronous HTTP/1.1 client on Boost.Beast for the benchmark and eval tools: one
// connection per request, server-sent events timestamped as each arrives, any number of requests
// in flight on one io_context.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace nibble::tools {

using SteadyClock = std::chrono::steady_clock;

struct Endpoint {
  std::string host = "127.0.0.1";
  std::string port = "8000";
};
// The server from --base-url "http://host:port" (a trailing path is ignored; https is refused with a
// clear error), or from --host/--port when no URL is given.
Result<Endpoint> resolve_endpoint(const std::string& base_url, const std::string& host, int port);

struct HttpEvent {
  SteadyClock::time_point at;  // when the event's last byte was parsed
  std::string data;            // the payload after "data: "
};

struct HttpResult {
  int status = 0;     // 0: no HTTP response (see error)
  std::string error;  // transport problem
  std::string body;   // a non-chunked body
  std::vector<HttpEvent> events;
  SteadyClock::time_point started, finished;
};

using HttpDone = std::function<void(HttpResult&&)>;

// Starts a POST of a JSON body; `done` runs on the io_context's thread. `on_event` (optional) is
// called for each event as it arrives.
void http_post(boost::asio::io_context& io, const Endpoint& endpoint, const std::string& path, std::string body,
               HttpDone done, std::function<void(const HttpEvent&)> on_event = nullptr);
// Blocking GET/POST for setup calls (model name, tokenizer path).
HttpResult http_request_sync(const Endpoint& endpoint, const std::string& method, const std::string& path,
                             const std::string& body = "");
// The first model the server's /v1/models lists (what --model defaults to).
Result<std::string> first_served_model(const Endpoint& endpoint);

}  // namespace nibble::tools
