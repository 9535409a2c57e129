// HttpServer: Beast parses requests; responses are framed here (status line, headers, then
// Content-Length or chunked). A connection always keeps one read open: it parses the next request
// while a response is pending (pipelined requests queue and are served in order), and it ends with
// an error when the client hangs up, so its request can be aborted at once.
#include "server/http_server.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>

#include "core/log.h"
#include "server/cors.h"

namespace nibble::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr auto IDLE_TIMEOUT = std::chrono::seconds(600);  // keep-alive connections without a request
constexpr uint64_t BODY_LIMIT = 64ull << 20;
constexpr uint32_t HEADER_LIMIT = 64u << 10;
constexpr size_t MAX_QUEUED = 16;  // pipelined requests parsed ahead of the one being answered

std::string status_line(int status) {
  const auto reason = http::obsolete_reason(static_cast<http::status>(status));
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason.data(), reason.size()) + "\r\n";
}

std::string error_json(int status, const std::string& message) {
  return R"({"error":{"message":")" + message + R"(","type":"BadRequestError","param":null,"code":)" +
         std::to_string(status) + "}}";
}

class Session : public std::enable_shared_from_this<Session>, public HttpResponder {
 public:
  Session(tcp::socket&& socket, const HttpHandler& handler, std::shared_ptr<HttpStats> stats,
          std::shared_ptr<const Cors> cors)
      : stream_(std::move(socket)), handler_(handler), stats_(std::move(stats)), cors_(std::move(cors)) {
    ++stats_->open_connections;
  }
  ~Session() override {
    --stats_->open_connections;
    if (responding_) --stats_->open_responses;
  }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  void respond(int status, std::string content_type, std::string body) override {
    run([this, status, content_type = std::move(content_type), body = std::move(body)]() mutable {
      if (!responding_ || streaming_) return;
      std::string head = status_line(status);
      head += "Content-Type: " + content_type + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
      head += extra_headers_;
      head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
      enqueue(head + body, true);
    });
  }

  void start_stream(int status) override {
    run([this, status] {
      if (!responding_ || streaming_) return;
      streaming_ = true;
      std::string head = status_line(status);
      head += "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
      head += extra_headers_;
      head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
      enqueue(std::move(head), false);
    });
  }

  void send_chunk(std::string data) override {
    run([this, data = std::move(data)] {
      if (!responding_ || !streaming_ || data.empty()) return;
      char size[24];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      enqueue(size + data + "\r\n", false);
    });
  }

  void end_stream() override {
    run([this] {
      if (!responding_ || !streaming_) return;
      streaming_ = false;
      enqueue("0\r\n\r\n", true);
    });
  }

  void on_disconnect(std::function<void()> callback) override {
    run([this, callback = std::move(callback)]() mutable {
      if (closed_ && responding_)
        callback();
      else
        on_disconnect_ = std::move(callback);
    });
  }

 private:
  // A parsed request waiting for its turn, or an error to answer in its place (then close).
  struct Parsed {
    HttpRequest request;
    bool keep_alive = true;
    int error_status = 0;
    std::string error_message;
    std::string access_control_method, access_control_headers;  // a CORS preflight's
  };

  template <typename F>
  void run(F&& f) {
    net::post(stream_.get_executor(), [self = shared_from_this(), f = std::forward<F>(f)]() mutable { f(); });
  }

  void read_request() {
    if (closed_ || reading_ || unreadable_ || queued_.size() >= MAX_QUEUED) return;
    reading_ = true;
    parser_.emplace();
    parser_->body_limit(BODY_LIMIT);
    parser_->header_limit(HEADER_LIMIT);
    if (!responding_) stream_.expires_after(IDLE_TIMEOUT);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  // The headers are in: a client that sent "Expect: 100-continue" waits for the interim response
  // before its body (curl and .NET for ~1 s). It goes out now unless another response is on the
  // wire; a client not answered proceeds after its own timeout, as RFC 9110 lets it.
  void on_header(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue") && !responding_ && queued_.empty() &&
        !parser_->is_done())
      enqueue("HTTP/1.1 100 Continue\r\n\r\n", false);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
  }

  void on_body(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    reading_ = false;
    const auto& message = parser_->get();
    Parsed p;
    HttpRequest& request = p.request;
    request.method = std::string(message.method_string());
    const std::string target(message.target());
    const size_t q = target.find('?');
    request.path = target.substr(0, q);
    if (q != std::string::npos) request.query = target.substr(q + 1);
    request.body = message.body();
    request.content_type = std::string(message[http::field::content_type]);
    request.authorization = std::string(message[http::field::authorization]);
    request.origin = std::string(message[http::field::origin]);
    p.access_control_method = std::string(message[http::field::access_control_request_method]);
    p.access_control_headers = std::string(message[http::field::access_control_request_headers]);
    p.keep_alive = message.keep_alive();
    accept(std::move(p));
    read_request();  // the next request, or the hang-up, while this one is answered
  }

  void on_read_error(beast::error_code ec) {
    reading_ = false;
    unreadable_ = true;  // the stream is past a request it could not parse: answer, then close
    Parsed p;
    p.keep_alive = false;
    if (ec == http::error::body_limit || ec == http::error::header_limit) {
      p.error_status = 413;
      p.error_message = "request too large";
    } else if (ec != http::error::end_of_stream && ec != http::error::partial_message &&
               ec.category() == http::make_error_code(http::error::bad_method).category()) {
      // A malformed request (Beast's parser errors) gets a 400 before the connection closes.
      p.error_status = 400;
      p.error_message = "malformed HTTP request: " + ec.message();
    } else {
      return close();  // the client went away (or idled out): abort what it asked for
    }
    accept(std::move(p));
  }

  // A request is answered now when nothing is pending, else after those before it.
  void accept(Parsed p) {
    if (responding_ || !queued_.empty())
      queued_.push_back(std::move(p));
    else
      dispatch(std::move(p));
  }

  void dispatch(Parsed p) {
    keep_alive_ = p.keep_alive;
    responding_ = true;
    ++stats_->open_responses;
    stream_.expires_never();  // a response may stream for a long time
    extra_headers_.clear();
    if (p.error_status) return respond(p.error_status, "application/json", error_json(p.error_status, p.error_message));
    ++stats_->requests;
    const HttpRequest& request = p.request;
    if (cors_ && !request.origin.empty()) {
      if (request.method == "OPTIONS" && !p.access_control_method.empty()) {
        std::string headers;
        auto [status, text] =
            cors_->preflight(request.origin, p.access_control_method, p.access_control_headers, headers);
        extra_headers_ = std::move(headers);
        return respond(status, "text/plain; charset=utf-8", text);
      }
      extra_headers_ = cors_->simple_headers(request.origin);
    }
    handler_(request, shared_from_this());
  }

  void enqueue(std::string data, bool ends_response) {
    outbox_.push_back({std::move(data), ends_response});
    if (!writing_) write_next();
  }

  void write_next() {
    if (outbox_.empty() || closed_) return;
    writing_ = true;
    net::async_write(stream_, net::buffer(outbox_.front().data),
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_written(ec); });
  }

  void on_written(beast::error_code ec) {
    writing_ = false;
    if (closed_) return outbox_.clear();  // close() ran while this write was in flight
    if (ec) return close();
    const bool ended = outbox_.front().ends_response;
    outbox_.pop_front();
    if (ended) {
      responding_ = false;
      --stats_->open_responses;
      on_disconnect_ = nullptr;
      if (!keep_alive_) return close();
      if (!queued_.empty()) {  // the next pipelined request's turn
        Parsed next = std::move(queued_.front());
        queued_.pop_front();
        dispatch(std::move(next));
      } else if (reading_) {
        stream_.expires_after(IDLE_TIMEOUT);  // the open read now waits for the next request
      }
      read_request();  // if the queue had stopped it
    }
    write_next();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    queued_.clear();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    if (!writing_) outbox_.clear();  // else the write in flight still reads its buffer
    if (responding_ && on_disconnect_) {
      auto callback = std::move(on_disconnect_);
      on_disconnect_ = nullptr;
      callback();
    }
  }

  struct Piece {
    std::string data;
    bool ends_response;
  };
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  const HttpHandler& handler_;
  std::shared_ptr<HttpStats> stats_;
  std::shared_ptr<const Cors> cors_;  // null: no CORS
  std::deque<Piece> outbox_;
  std::deque<Parsed> queued_;
  std::string extra_headers_;  // the current response's CORS headers
  std::function<void()> on_disconnect_;
  bool keep_alive_ = true, responding_ = false, streaming_ = false, reading_ = false, writing_ = false, closed_ = false,
       unreadable_ = false;
};

}  // namespace

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  Impl(net::io_context& io, HttpHandler h, std::shared_ptr<HttpStats> s, CorsPolicy c)
      : io(io),
        acceptor(net::make_strand(io)),
        retry(acceptor.get_executor()),
        handler(std::move(h)),
        stats(std::move(s)),
        cors(c.enabled ? std::make_shared<const Cors>(std::move(c)) : nullptr) {}

  void accept() {
    acceptor.async_accept(net::make_strand(io), [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
      if (!self->acceptor.is_open()) return;
      if (!ec) {
        socket.set_option(tcp::no_delay(true), ec);  // SSE tokens go out at once
        std::make_shared<Session>(std::move(socket), self->handler, self->stats, self->cors)->start();
        return self->accept();
      }
      // Out of descriptors or similar: say so and retry shortly instead of spinning.
      log_warn("accept failed: " + ec.message());
      self->retry.expires_after(std::chrono::milliseconds(100));
      self->retry.async_wait([self](beast::error_code) { self->accept(); });
    });
  }

  net::io_context& io;
  tcp::acceptor acceptor;
  net::steady_timer retry;
  HttpHandler handler;
  std::shared_ptr<HttpStats> stats;
  std::shared_ptr<const Cors> cors;
};

HttpServer::HttpServer(net::io_context& io, HttpHandler handler, std::shared_ptr<HttpStats> stats, CorsPolicy cors)
    : impl_(std::make_shared<Impl>(io, std::move(handler), std::move(stats), std::move(cors))) {}

HttpServer::~HttpServer() { stop_accepting(); }

Status HttpServer::listen(const std::string& host, uint16_t port) {
  beast::error_code ec;
  const auto address = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) return Status::error("--host '" + host + "' is not an IP address (" + ec.message() + ")");
  const tcp::endpoint endpoint(address, port);
  tcp::acceptor& a = impl_->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(4096, ec);
  if (ec) return Status::error("cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message());
  impl_->accept();
  return Status::ok();
}

uint16_t HttpServer::port() const {
  beast::error_code ec;
  return impl_->acceptor.local_endpoint(ec).port();
}

void HttpServer::stop_accepting() {
  net::dispatch(impl_->acceptor.get_executor(), [impl = impl_] {
    beast::error_code ignored;
    impl->acceptor.close(ignored);
  });
}

}  // namespace nibble::server
