// NodeLink (node_link.h) over blocking TCP sockets: a message is [op u32][length u64][payload].
#include "models/node_link.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

namespace nibble::models {
namespace {

using Clock = std::chrono::steady_clock;

void put(std::vector<uint8_t>& out, const void* data, size_t bytes) {
  if (bytes == 0) return;
  const size_t at = out.size();
  out.resize(at + bytes);  // (vector::insert here trips GCC 12's -Wstringop-overflow, a false positive)
  std::memcpy(out.data() + at, data, bytes);
}
template <class T>
void put_value(std::vector<uint8_t>& out, T value) {
  put(out, &value, sizeof(value));
}

// Reads fixed-size values off a payload, failing past its end.
struct Reader {
  const std::vector<uint8_t>& in;
  size_t at = 0;
  template <class T>
  bool get(T& value) {
    if (in.size() - at < sizeof(T)) return false;
    std::memcpy(&value, in.data() + at, sizeof(T));
    at += sizeof(T);
    return true;
  }
  template <class T>
  bool get_vector(std::vector<T>& values) {
    uint64_t n = 0;
    if (!get(n) || n > (in.size() - at) / sizeof(T)) return false;
    values.resize(n);
    std::memcpy(values.data(), in.data() + at, n * sizeof(T));
    at += n * sizeof(T);
    return true;
  }
};
template <class T>
void put_vector(std::vector<uint8_t>& out, const std::vector<T>& values) {
  put_value<uint64_t>(out, values.size());
  put(out, values.data(), values.size() * sizeof(T));
}

Status write_all(int fd, const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n <= 0) return Status::error(std::string("node link: send failed: ") + std::strerror(errno));
    p += n, bytes -= static_cast<size_t>(n);
  }
  return Status::ok();
}
Status read_all(int fd, void* data, size_t bytes) {
  auto* p = static_cast<uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n == 0) return Status::error("node link: the other node closed the connection");
    if (n < 0) return Status::error(std::string("node link: receive failed: ") + std::strerror(errno));
    p += n, bytes -= static_cast<size_t>(n);
  }
  return Status::ok();
}
Status write_message(int fd, const NodeMessage& m) {
  std::vector<uint8_t> frame;
  put_value<uint32_t>(frame, static_cast<uint32_t>(m.op));
  put_value<uint64_t>(frame, m.payload.size());
  put(frame, m.payload.data(), m.payload.size());
  return write_all(fd, frame.data(), frame.size());
}
Result<NodeMessage> read_message(int fd) {
  uint32_t op = 0;
  uint64_t size = 0;
  NIB_RETURN_IF_ERROR(read_all(fd, &op, sizeof(op)));
  NIB_RETURN_IF_ERROR(read_all(fd, &size, sizeof(size)));
  if (op < uint32_t(NodeOp::HELLO) || op > uint32_t(NodeOp::QUIT) || size > (1ull << 32))
    return Status::error("node link: a malformed message (op " + std::to_string(op) + ", " + std::to_string(size) +
                         " bytes): is another program on that port?");
  NodeMessage m;
  m.op = static_cast<NodeOp>(op);
  m.payload.resize(size);
  NIB_RETURN_IF_ERROR(read_all(fd, m.payload.data(), size));
  return m;
}

// The address's IPv4/IPv6 candidates (getaddrinfo), for a passive (listening) or active socket.
Result<addrinfo*> resolve(const std::string& address, bool passive) {
  auto parts = parse_node_address(address);
  if (!parts) return parts.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(parts->first.c_str(), std::to_string(parts->second).c_str(), &hints, &found);
  if (rc != 0) return Status::error("--dist-init-addr " + address + ": " + gai_strerror(rc));
  return found;
}

void no_delay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // a step's batch leaves at once
}

std::vector<uint8_t> hello_payload(const std::vector<uint8_t>& nccl_id, const std::string& key) {
  std::vector<uint8_t> out;
  put_vector(out, nccl_id);
  put_vector(out, std::vector<uint8_t>(key.begin(), key.end()));
  return out;
}
Status read_hello(const NodeMessage& m, std::vector<uint8_t>& nccl_id, std::string& key) {
  Reader r{m.payload};
  std::vector<uint8_t> key_bytes;
  if (m.op != NodeOp::HELLO || !r.get_vector(nccl_id) || !r.get_vector(key_bytes))
    return Status::error("node link: the first message was not a greeting");
  key.assign(key_bytes.begin(), key_bytes.end());
  return Status::ok();
}
std::string key_mismatch(int node, const std::string& mine, const std::string& theirs) {
  return "node " + std::to_string(node) + " runs another checkpoint or other flags than node 0 (" +
         theirs.substr(0, 200) + " against " + mine.substr(0, 200) +
         "): start every node with the same model and flags";
}

}  // namespace

std::vector<uint8_t> encode_batch(const Batch& b) {
  std::vector<uint8_t> out;
  put_vector(out, b.token_ids);
  put_vector(out, b.logits_rows);
  put_value<uint64_t>(out, b.sequences.size());
  for (const BatchSequence& s : b.sequences) {
    put_vector(out, s.block_table);
    put_value(out, s.start_position);
    put_value(out, s.n_tokens);
  }
  return out;
}

Result<Batch> decode_batch(const std::vector<uint8_t>& payload) {
  Reader r{payload};
  Batch b;
  uint64_t n = 0;
  bool ok = r.get_vector(b.token_ids) && r.get_vector(b.logits_rows) && r.get(n) && n <= payload.size();
  for (uint64_t i = 0; ok && i < n; ++i) {
    BatchSequence& s = b.sequences.emplace_back();
    ok = r.get_vector(s.block_table) && r.get(s.start_position) && r.get(s.n_tokens);
  }
  if (!ok || r.at != payload.size()) return Status::error("node link: a malformed batch");
  return b;
}

std::vector<uint8_t> encode_int(int64_t value) {
  std::vector<uint8_t> out;
  put_value(out, value);
  return out;
}
Result<int64_t> decode_int(const std::vector<uint8_t>& payload) {
  int64_t v = 0;
  if (payload.size() != sizeof(v)) return Status::error("node link: a malformed number");
  std::memcpy(&v, payload.data(), sizeof(v));
  return v;
}

Result<std::pair<std::string, uint16_t>> parse_node_address(const std::string& address) {
  const size_t colon = address.rfind(':');
  const std::string bad = "--dist-init-addr '" + address + "' is not host:port";
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return Status::error(bad);
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port = address.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 || std::stoi(port) < 1 ||
      std::stoi(port) > 65535)
    return Status::error(bad + " (port 1-65535)");
  return std::make_pair(host, static_cast<uint16_t>(std::stoi(port)));
}

NodeLink::~NodeLink() {
  for (int fd : sockets_) ::close(fd);
}

Result<std::unique_ptr<NodeLink>> NodeLink::lead(const std::string& address, int nodes,
                                                 const std::vector<uint8_t>& nccl_id, const std::string& key,
                                                 double timeout_s) {
  auto found = resolve(address, true);
  if (!found) return found.status();
  int listener = -1;
  for (addrinfo* a = *found; a && listener < 0; a = a->ai_next) {
    listener = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    const int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (listener >= 0 && (::bind(listener, a->ai_addr, a->ai_addrlen) != 0 || ::listen(listener, nodes) != 0))
      ::close(listener), listener = -1;
  }
  freeaddrinfo(*found);
  if (listener < 0) return Status::error("--dist-init-addr " + address + ": cannot listen: " + std::strerror(errno));
  std::unique_ptr<NodeLink> link(new NodeLink());
  link->nodes_ = nodes;
  std::vector<int> by_node(static_cast<size_t>(nodes), -1);
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  Status failed;
  for (int joined = 1; joined < nodes && failed;) {
    timeval tv{1, 0};
    fd_set ready;
    FD_ZERO(&ready);
    FD_SET(listener, &ready);
    if (::select(listener + 1, &ready, nullptr, nullptr, &tv) <= 0) {
      if (Clock::now() > deadline)
        failed = Status::error("--dist-init-addr " + address + ": " + std::to_string(joined) + " of " +
                               std::to_string(nodes) + " nodes joined in " + std::to_string(int(timeout_s)) + " s");
      continue;
    }
    const int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) continue;
    no_delay(fd);
    // The other node speaks first: its rank and key; node 0 answers with the id and its own key.
    auto hello = read_message(fd);
    std::vector<uint8_t> rank_bytes;
    std::string theirs;
    Status read = hello ? read_hello(*hello, rank_bytes, theirs) : hello.status();
    int node = -1;
    if (read && rank_bytes.size() == sizeof(int32_t)) std::memcpy(&node, rank_bytes.data(), sizeof(int32_t));
    if (!read || node < 1 || node >= nodes || by_node[size_t(node)] >= 0) {
      ::close(fd);  // a stray connection, or a node rank twice: ignored (the rightful one may still come)
      continue;
    }
    if (theirs != key) failed = Status::error(key_mismatch(node, key, theirs));
    Status sent = write_message(fd, {NodeOp::HELLO, hello_payload(nccl_id, key)});
    if (failed && !sent) failed = sent;
    by_node[size_t(node)] = fd, ++joined;
  }
  ::close(listener);
  for (int n = 1; n < nodes; ++n)
    if (by_node[size_t(n)] >= 0) link->sockets_.push_back(by_node[size_t(n)]);
  if (!failed) return failed;
  return link;
}

Result<std::unique_ptr<NodeLink>> NodeLink::follow(const std::string& address, int node_rank, const std::string& key,
                                                   double timeout_s, std::vector<uint8_t>& nccl_id) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  int fd = -1;
  while (fd < 0) {  // node 0 may start later
    auto found = resolve(address, false);
    if (!found) return found.status();
    for (addrinfo* a = *found; a && fd < 0; a = a->ai_next) {
      fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd >= 0 && ::connect(fd, a->ai_addr, a->ai_addrlen) != 0) ::close(fd), fd = -1;
    }
    freeaddrinfo(*found);
    if (fd >= 0) break;
    if (Clock::now() > deadline)
      return Status::error("--dist-init-addr " + address + ": node 0 did not answer in " +
                           std::to_string(int(timeout_s)) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  no_delay(fd);
  std::unique_ptr<NodeLink> link(new NodeLink());
  link->sockets_ = {fd};
  const int32_t rank = node_rank;
  std::vector<uint8_t> rank_bytes(sizeof(rank));
  std::memcpy(rank_bytes.data(), &rank, sizeof(rank));
  NIB_RETURN_IF_ERROR(write_message(fd, {NodeOp::HELLO, hello_payload(rank_bytes, key)}));
  auto hello = read_message(fd);
  if (!hello) return hello.status();
  std::string theirs;
  NIB_RETURN_IF_ERROR(read_hello(*hello, nccl_id, theirs));
  if (theirs != key) return Status::error(key_mismatch(node_rank, theirs, key));
  return link;
}

Status NodeLink::send(const NodeMessage& message) {
  for (int fd : sockets_) NIB_RETURN_IF_ERROR(write_message(fd, message));
  return Status::ok();
}

Result<NodeMessage> NodeLink::receive() { return read_message(sockets_.at(0)); }

Status NodeLink::check_failures() {
  for (size_t i = 0; i < sockets_.size(); ++i) {
    pollfd p{sockets_[i], POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) continue;
    auto m = read_message(sockets_[i]);  // (a closed connection reads as an error too)
    const std::string why = !m ? m.status().message() : std::string(m->payload.begin(), m->payload.end());
    return Status::error("node " + std::to_string(i + 1) + ": " + (why.empty() ? "an unexpected status" : why));
  }
  return Status::ok();
}

Status NodeLink::collect_status() {
  Status first;
  for (size_t i = 0; i < sockets_.size(); ++i) {
    auto m = read_message(sockets_[i]);
    Status s = !m                        ? m.status()
               : m->op != NodeOp::STATUS ? Status::error("node link: expected a status")
               : m->payload.empty()      ? Status::ok()
                                         : Status::error(std::string(m->payload.begin(), m->payload.end()));
    if (!s && first) first = Status::error("node " + std::to_string(i + 1) + ": " + s.message());
  }
  return first;
}

}  // namespace nibble::models
