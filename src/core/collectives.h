// The collectives of tensor and expert parallelism on host memory, as the CPU reference's ranks
// exchange them (the GPU's NCCL communicator has the same operations on device memory). Every rank of
// a group calls each operation in the same order; results are identical on every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/status.h"

namespace nibble {

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int64_t size() const = 0;
  virtual int64_t rank() const = 0;
  // data ← Σ over ranks (summed in rank order, so every rank holds the same bits).
  virtual Status all_reduce_sum(std::span<float> data) = 0;
  // data ← the elementwise max over ranks.
  virtual Status all_reduce_max(std::span<float> data) = 0;
  // out[r · in.size() + i] ← rank r's in[i] (out holds size() · in.size() bytes).
  virtual Status all_gather(std::span<const uint8_t> in, std::span<uint8_t> out) = 0;
};

// In-process ranks, one thread each, meeting at a barrier (the CPU reference's tensor parallelism,
// and the tests of it). A rank whose group was stopped (another rank failed) gets an error instead of
// waiting forever.
class HostGroup {
 public:
  explicit HostGroup(int64_t size);
  ~HostGroup();
  HostGroup(const HostGroup&) = delete;
  HostGroup& operator=(const HostGroup&) = delete;
  int64_t size() const;
  // Rank r's endpoint (the group must outlive it).
  std::unique_ptr<Collectives> rank(int64_t r);
  // Wakes every waiting rank with an error, and every later call fails: a rank that cannot go on
  // calls it so that the others do not wait for it.
  void stop(const std::string& why);
  // Makes a stopped group usable again; only while no rank is inside an operation.
  void reset();

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace nibble
