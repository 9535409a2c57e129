// HostGroup (collectives.h): each operation is two barrier phases — every rank posts its buffer, then
// every rank reads all posted buffers in rank order (so all compute the same result) and waits until
// all have read before the buffers may change.
#include "core/collectives.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace nibble {

struct HostGroup::State {
  explicit State(int64_t n) : size(n), posted(static_cast<size_t>(n)) {}
  const int64_t size;
  std::mutex mutex;
  std::condition_variable changed;
  int64_t arrived = 0;
  uint64_t generation = 0;
  std::string stopped;  // why, once stopped
  std::vector<std::span<const uint8_t>> posted;

  // Blocks until every rank has arrived at this barrier; false (with why) once the group stopped.
  Status barrier() {
    std::unique_lock lock(mutex);
    if (!stopped.empty()) return Status::error("tensor-parallel group stopped: " + stopped);
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0, ++generation;
      changed.notify_all();
      return Status::ok();
    }
    changed.wait(lock, [&] { return generation != gen || !stopped.empty(); });
    if (generation == gen) return Status::error("tensor-parallel group stopped: " + stopped);
    return Status::ok();
  }
};

namespace {

class HostRank final : public Collectives {
 public:
  HostRank(std::shared_ptr<HostGroup::State> state, int64_t rank) : state_(std::move(state)), rank_(rank) {}
  int64_t size() const override { return state_->size; }
  int64_t rank() const override { return rank_; }

  Status all_reduce_sum(std::span<float> data) override {
    return reduce(data, [](float& acc, float v) { acc += v; });
  }
  Status all_reduce_max(std::span<float> data) override {
    return reduce(data, [](float& acc, float v) { acc = std::max(acc, v); });
  }
  Status all_gather(std::span<const uint8_t> in, std::span<uint8_t> out) override {
    if (out.size() != in.size() * static_cast<size_t>(size()))
      return Status::error("all_gather: the output holds " + std::to_string(out.size()) + " bytes, not " +
                           std::to_string(in.size() * size()));
    return exchange(in, [&] {
      for (int64_t r = 0; r < size(); ++r) {
        const auto& p = state_->posted[static_cast<size_t>(r)];
        if (p.size() != in.size()) return Status::error("all_gather: ranks posted different sizes");
        std::memcpy(out.data() + r * in.size(), p.data(), p.size());
      }
      return Status::ok();
    });
  }

 private:
  // Post `mine`, run `read` once all have posted, and wait until all have read.
  template <typename Read>
  Status exchange(std::span<const uint8_t> mine, Read&& read) {
    state_->posted[static_cast<size_t>(rank_)] = mine;
    NIB_RETURN_IF_ERROR(state_->barrier());
    const Status s = read();
    NIB_RETURN_IF_ERROR(state_->barrier());
    return s;
  }

  template <typename Op>
  Status reduce(std::span<float> data, Op op) {
    std::vector<float> result(data.size());
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(data.data()), data.size_bytes());
    NIB_RETURN_IF_ERROR(exchange(bytes, [&] {
      for (int64_t r = 0; r < size(); ++r) {
        const auto& p = state_->posted[static_cast<size_t>(r)];
        if (p.size() != bytes.size()) return Status::error("all_reduce: ranks posted different sizes");
        const float* v = reinterpret_cast<const float*>(p.data());
        if (r == 0)
          std::copy_n(v, data.size(), result.data());
        else
          for (size_t i = 0; i < data.size(); ++i) op(result[i], v[i]);
      }
      return Status::ok();
    }));
    std::copy(result.begin(), result.end(), data.begin());
    return Status::ok();
  }

  std::shared_ptr<HostGroup::State> state_;
  int64_t rank_;
};

}  // namespace

HostGroup::HostGroup(int64_t size) : state_(std::make_shared<State>(size)) {}
HostGroup::~HostGroup() = default;
int64_t HostGroup::size() const { return state_->size; }
std::unique_ptr<Collectives> HostGroup::rank(int64_t r) { return std::make_unique<HostRank>(state_, r); }

void HostGroup::stop(const std::string& why) {
  std::lock_guard lock(state_->mutex);
  if (state_->stopped.empty()) state_->stopped = why.empty() ? "a rank failed" : why;
  state_->changed.notify_all();
}

void HostGroup::reset() {
  std::lock_guard lock(state_->mutex);
  state_->stopped.clear();
  state_->arrived = 0;
}

}  // namespace nibble
