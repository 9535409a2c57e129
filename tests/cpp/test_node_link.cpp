// The control link of a tensor-parallel group over hosts (models/node_link.h), on localhost: node 0
// hands every other node the NCCL id, nodes that disagree about the model or flags are refused by
// name, a node that never joins times out, operations reach every node in order and their statuses
// come back (a failure named by node); batches survive the wire bit for bit.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <thread>

#include "models/node_link.h"
#include "test_seed.h"

using namespace nibble;
using namespace nibble::models;

namespace {

// A port nothing listens on now (the kernel's pick for port 0).
std::string free_address() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

TEST(NodeLink, AddressesParseOrSayWhy) {
  auto a = parse_node_address("10.0.0.7:5000");
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->first, "10.0.0.7");
  EXPECT_EQ(a->second, 5000);
  auto v6 = parse_node_address("[::1]:29500");
  ASSERT_TRUE(v6.is_ok());
  EXPECT_EQ(v6->first, "::1");
  for (const char* bad : {"host", ":80", "host:", "host:http", "host:70000", "host:0"}) {
    auto r = parse_node_address(bad);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_NE(r.status().message().find("is not host:port"), std::string::npos) << r.status().message();
  }
}

TEST(NodeLink, BatchesSurviveTheWire) {
  const uint64_t seed = test::test_seed("NodeLink.BatchesSurviveTheWire");
  std::mt19937_64 rng(seed);
  Batch b;
  for (int s = 0; s < 5; ++s) {
    BatchSequence q;
    for (int i = 0; i < int(rng() % 9); ++i) q.block_table.push_back(int32_t(rng() % 100000));
    q.start_position = int64_t(rng() % 131072), q.n_tokens = 1 + int64_t(rng() % 50);
    for (int64_t t = 0; t < q.n_tokens; ++t)
      b.token_ids.push_back(rng() % 4 ? int32_t(rng() % 151936) : pending_token(s));
    b.logits_rows.push_back(int64_t(b.token_ids.size()) - 1);
    b.sequences.push_back(q);
  }
  const std::vector<uint8_t> wire = encode_batch(b);
  auto back = decode_batch(wire);
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(back->token_ids, b.token_ids);
  EXPECT_EQ(back->logits_rows, b.logits_rows);
  ASSERT_EQ(back->sequences.size(), b.sequences.size());
  for (size_t i = 0; i < b.sequences.size(); ++i) {
    EXPECT_EQ(back->sequences[i].block_table, b.sequences[i].block_table);
    EXPECT_EQ(back->sequences[i].start_position, b.sequences[i].start_position);
    EXPECT_EQ(back->sequences[i].n_tokens, b.sequences[i].n_tokens);
  }
  // Every truncation, and trailing bytes, are errors (never a short batch).
  for (size_t cut = 0; cut < wire.size(); cut += 7)
    EXPECT_FALSE(decode_batch(std::vector<uint8_t>(wire.begin(), wire.begin() + cut)).is_ok()) << cut;
  std::vector<uint8_t> longer = wire;
  longer.push_back(0);
  EXPECT_FALSE(decode_batch(longer).is_ok());
  EXPECT_EQ(*decode_int(encode_int(-123456789012)), -123456789012);
  EXPECT_FALSE(decode_int({1, 2, 3}).is_ok());
}

TEST(NodeLink, NodeZeroDrivesTheOthers) {
  const std::string address = free_address();
  const std::vector<uint8_t> id = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<uint8_t> got[3];
  std::unique_ptr<NodeLink> followers[3];
  std::thread threads[2];
  for (int n = 1; n <= 2; ++n)  // the others may start first: they retry until node 0 listens
    threads[n - 1] = std::thread([&, n] {
      auto link = NodeLink::follow(address, n, "model|flags", 30, got[n]);
      EXPECT_TRUE(link.is_ok()) << link.status().message();
      if (link) followers[n] = std::move(link.value());
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto lead = NodeLink::lead(address, 3, id, "model|flags", 30);
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(lead.is_ok()) << lead.status().message();
  ASSERT_TRUE(followers[1] && followers[2]);
  EXPECT_EQ(got[1], id);
  EXPECT_EQ(got[2], id);

  // An operation reaches both in order; node 2 fails the one that waits, and node 0 hears which.
  Batch b;
  b.token_ids = {5, pending_token(0)};
  b.sequences = {{{0, 1}, 7, 2}};
  b.logits_rows = {1};
  ASSERT_TRUE((*lead)->send({NodeOp::FORWARD, encode_batch(b)}).is_ok());
  ASSERT_TRUE((*lead)->send({NodeOp::ALLOCATE, encode_int(4096)}).is_ok());
  for (int n = 1; n <= 2; ++n) {
    auto first = followers[n]->receive(), second = followers[n]->receive();
    ASSERT_TRUE(first.is_ok() && second.is_ok());
    EXPECT_EQ(first->op, NodeOp::FORWARD);
    EXPECT_EQ(decode_batch(first->payload)->token_ids, b.token_ids);
    EXPECT_EQ(second->op, NodeOp::ALLOCATE);
    EXPECT_EQ(*decode_int(second->payload), 4096);
    const std::string why = n == 2 ? "out of memory for the KV cache" : "";
    ASSERT_TRUE(followers[n]->send({NodeOp::STATUS, {why.begin(), why.end()}}).is_ok());
  }
  const Status s = (*lead)->collect_status();
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.message(), "node 2: out of memory for the KV cache");
  // A step that fails on another node is heard at node 0's next step, without waiting on the others.
  EXPECT_TRUE((*lead)->check_failures().is_ok());
  const std::string step_failed = "rank 3: an illegal memory access";
  ASSERT_TRUE(followers[2]->send({NodeOp::STATUS, {step_failed.begin(), step_failed.end()}}).is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ((*lead)->check_failures().message(), "node 2: rank 3: an illegal memory access");
  EXPECT_TRUE((*lead)->check_failures().is_ok());
  // A node that goes away is an error too, not a hang.
  followers[1].reset();
  ASSERT_TRUE((*lead)->send({NodeOp::CAPTURE, encode_int(8)}).is_ok());
  (void)followers[2]->receive();
  ASSERT_TRUE(followers[2]->send({NodeOp::STATUS, {}}).is_ok());
  const Status gone = (*lead)->collect_status();
  ASSERT_FALSE(gone.is_ok());
  EXPECT_NE(gone.message().find("node 1: node link: the other node closed the connection"), std::string::npos)
      << gone.message();
}

TEST(NodeLink, NodesThatDisagreeOrNeverComeAreErrors) {
  const std::string address = free_address();
  std::vector<uint8_t> id;
  Status follower;
  std::thread t([&] { follower = NodeLink::follow(address, 1, "model|flags B", 30, id).status(); });
  auto lead = NodeLink::lead(address, 2, {9}, "model|flags A", 30);
  t.join();
  ASSERT_FALSE(lead.is_ok());
  EXPECT_NE(lead.status().message().find("node 1 runs another checkpoint or other flags than node 0"),
            std::string::npos)
      << lead.status().message();
  ASSERT_FALSE(follower.is_ok());
  EXPECT_NE(follower.message().find("node 1 runs another checkpoint or other flags"), std::string::npos)
      << follower.message();
  // Two nodes expected, none comes: a timeout that says how many joined.
  auto alone = NodeLink::lead(free_address(), 2, {9}, "k", 1.5);
  ASSERT_FALSE(alone.is_ok());
  EXPECT_NE(alone.status().message().find("1 of 2 nodes joined in 1 s"), std::string::npos) << alone.status().message();
  // Node 0 never listens: the other gives up with a clear error.
  auto orphan = NodeLink::follow(free_address(), 1, "k", 1.0, id);
  ASSERT_FALSE(orphan.is_ok());
  EXPECT_NE(orphan.status().message().find("node 0 did not answer"), std::string::npos) << orphan.status().message();
}

}  // namespace
