// The control link of a tensor-parallel group spread over hosts (--nnodes): node 0 listens on
// --dist-init-addr, every other node connects; node 0 hands each the group's NCCL id, then every model
// operation its ranks run (so the other nodes' ranks run the same ones), and the others answer the
// operations that wait. Bootstrap and control only: the ranks' tensors move through NCCL.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "models/batch.h"

namespace nibble::models {

enum class NodeOp : uint32_t {
  HELLO = 1,     // node 0 → others: the NCCL id and node 0's key; others → node 0: their key
  ALLOCATE = 2,  // KV blocks (int64)
  CAPTURE = 3,   // decode graphs up to a batch (int64)
  RELOAD = 4,    // a checkpoint path
  FORWARD = 5,   // a Batch
  STATUS = 6,    // others → node 0: an operation's outcome (empty: ok; else the error)
  QUIT = 7,      // node 0 is done
};

struct NodeMessage {
  NodeOp op = NodeOp::STATUS;
  std::vector<uint8_t> payload;
};

// Batch and int64 payloads (little-endian, as every host of a group is).
std::vector<uint8_t> encode_batch(const Batch& batch);
Result<Batch> decode_batch(const std::vector<uint8_t>& payload);
std::vector<uint8_t> encode_int(int64_t value);
Result<int64_t> decode_int(const std::vector<uint8_t>& payload);

// "host:port" (a name or an IPv4 address, as SGLang's --dist-init-addr) → its parts, or an error.
Result<std::pair<std::string, uint16_t>> parse_node_address(const std::string& address);

class NodeLink {
 public:
  ~NodeLink();
  NodeLink(const NodeLink&) = delete;
  NodeLink& operator=(const NodeLink&) = delete;

  // Node 0: listens on `address` until nodes - 1 others have connected (at most timeout_s), sends each
  // HELLO (nccl_id + key) and checks each one's key against `key` (a difference is an error naming the
  // node: its checkpoint or flags differ).
  static Result<std::unique_ptr<NodeLink>> lead(const std::string& address, int nodes,
                                                const std::vector<uint8_t>& nccl_id, const std::string& key,
                                                double timeout_s);
  // Node node_rank > 0: connects to node 0 (retrying until timeout_s), reads its HELLO, answers with
  // `key`; nccl_id receives node 0's. A key that differs from node 0's is an error here too.
  static Result<std::unique_ptr<NodeLink>> follow(const std::string& address, int node_rank, const std::string& key,
                                                  double timeout_s, std::vector<uint8_t>& nccl_id);

  int nodes() const { return nodes_; }
  // Node 0: a message to every other node. Others: to node 0.
  Status send(const NodeMessage& message);
  // Others: node 0's next message.
  Result<NodeMessage> receive();
  // Node 0: every other node's STATUS of the operation just sent; an error names the first node that
  // failed (or went away).
  Status collect_status();
  // Node 0, before each step: a STATUS another node sent unasked (a step of its failed) as an error
  // naming it; ok when none is waiting (never blocks).
  Status check_failures();

 private:
  NodeLink() = default;
  int nodes_ = 1;
  std::vector<int> sockets_;  // node 0: one per other node (node order); others: node 0's
};

}  // namespace nibble::models
