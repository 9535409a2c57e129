// http_post: resolve → connect → write → read_some until the parser is done; chunked bodies go
// through on_chunk_body so SSE events are split and timed as they arrive.
#include "tools/bench/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

namespace nibble::tools {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

class Call : public std::enable_shared_from_this<Call> {
 public:
  Call(net::io_context& io, HttpDone done, std::function<void(const HttpEvent&)> on_event)
      : resolver_(io), stream_(io), done_(std::move(done)), on_event_(std::move(on_event)) {}

  void start(const Endpoint& endpoint, const std::string& method, const std::string& path, std::string body) {
    result_.started = SteadyClock::now();
    request_.method_string(method);
    request_.target(path);
    request_.version(11);
    request_.set(http::field::host, endpoint.host);
    request_.set(http::field::content_type, "application/json");
    request_.set(http::field::connection, "close");
    request_.body() = std::move(body);
    request_.prepare_payload();
    parser_.emplace();
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    chunk_callback_ = [this](uint64_t, beast::string_view data, beast::error_code&) {
      pending_.append(data.data(), data.size());
      split_events();
      return data.size();
    };
    parser_->on_chunk_body(chunk_callback_);
    resolver_.async_resolve(endpoint.host, endpoint.port,
                            [self = shared_from_this()](beast::error_code ec, tcp::resolver::results_type results) {
                              if (ec) return self->fail("resolve: " + ec.message());
                              self->stream_.async_connect(results, [self](beast::error_code ec, auto) {
                                if (ec) return self->fail("connect: " + ec.message());
                                self->write();
                              });
                            });
  }

 private:
  void write() {
    http::async_write(stream_, request_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->fail("write: " + ec.message());
      self->read();
    });
  }

  void read() {
    http::async_read_some(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec == http::error::end_of_stream && self->parser_->is_header_done()) ec = {};
      if (ec) return self->fail("read: " + ec.message());
      if (self->parser_->is_header_done()) self->result_.status = self->parser_->get().result_int();
      if (!self->parser_->is_done()) return self->read();
      self->result_.body = self->parser_->get().body();
      self->pending_ += "\n\n";
      self->split_events();
      self->finish();
    });
  }

  // SSE: events end with a blank line; each "data: " line is one payload.
  void split_events() {
    size_t end;
    while ((end = pending_.find("\n\n")) != std::string::npos) {
      const std::string event = pending_.substr(0, end);
      pending_.erase(0, end + 2);
      size_t line_start = 0;
      while (line_start < event.size()) {
        size_t line_end = event.find('\n', line_start);
        if (line_end == std::string::npos) line_end = event.size();
        std::string line = event.substr(line_start, line_end - line_start);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.rfind("data:", 0) == 0) {
          HttpEvent e{SteadyClock::now(), line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5)};
          if (on_event_) on_event_(e);
          result_.events.push_back(std::move(e));
        }
        line_start = line_end + 1;
      }
    }
  }

  void fail(const std::string& message) {
    result_.error = message;
    finish();
  }

  void finish() {
    result_.finished = SteadyClock::now();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    auto done = std::move(done_);
    done(std::move(result_));
  }

  tcp::resolver resolver_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  std::optional<http::response_parser<http::string_body>> parser_;
  std::function<size_t(uint64_t, beast::string_view, beast::error_code&)> chunk_callback_;
  std::string pending_;
  HttpResult result_;
  HttpDone done_;
  std::function<void(const HttpEvent&)> on_event_;
};

}  // namespace

Result<Endpoint> resolve_endpoint(const std::string& url, const std::string& host, int port) {
  if (url.empty()) return Endpoint{host, std::to_string(port)};
  std::string rest = url;
  if (rest.rfind("https://", 0) == 0) return Status::error("--base-url " + url + ": https is not supported");
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  rest = rest.substr(0, rest.find('/'));
  Endpoint e;
  const size_t colon = rest.rfind(':');
  e.host = rest.substr(0, colon);
  e.port = colon == std::string::npos ? "80" : rest.substr(colon + 1);
  if (e.host.empty() || e.port.empty()) return Status::error("--base-url '" + url + "' is not http://host:port");
  return e;
}

void http_post(net::io_context& io, const Endpoint& endpoint, const std::string& path, std::string body, HttpDone done,
               std::function<void(const HttpEvent&)> on_event) {
  std::make_shared<Call>(io, std::move(done), std::move(on_event))->start(endpoint, "POST", path, std::move(body));
}

HttpResult http_request_sync(const Endpoint& endpoint, const std::string& method, const std::string& path,
                             const std::string& body) {
  net::io_context io;
  HttpResult out;
  std::make_shared<Call>(
      io, [&out](HttpResult&& r) { out = std::move(r); }, nullptr)
      ->start(endpoint, method, path, body);
  io.run();
  return out;
}

Result<std::string> first_served_model(const Endpoint& endpoint) {
  HttpResult r = http_request_sync(endpoint, "GET", "/v1/models");
  const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  if (r.status != 200 || j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].is_object())
    return Status::error("cannot read the model name from /v1/models (" +
                         (r.error.empty() ? "HTTP " + std::to_string(r.status) : r.error) + "); give --model");
  return j["data"][0].value("id", "");
}

}  // namespace nibble::tools
