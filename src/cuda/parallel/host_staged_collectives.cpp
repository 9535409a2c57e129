// host_staged_collectives (device_collectives.cuh): ranks that share a GPU meet through a HostGroup —
// wait for the stream, copy the device buffer to the host, exchange, copy back. Slow and eager; it
// exists so that the GPU model's tensor-parallel split can be checked on a one-GPU machine.
#include <vector>

#include "cuda/common/check.cuh"
#include "cuda/parallel/device_collectives.cuh"

namespace nibble::cuda {
namespace {

class HostStaged final : public DeviceCollectives {
 public:
  HostStaged(std::unique_ptr<Collectives> host, std::shared_ptr<HostGroup> group)
      : host_(std::move(host)), group_(std::move(group)) {}
  int64_t size() const override { return host_->size(); }
  int64_t rank() const override { return host_->rank(); }
  bool capturable() const override { return false; }

  Status all_reduce_sum(float* data, int64_t count, cudaStream_t stream) override {
    return round_trip(data, count, stream, [&](std::span<float> v) { return host_->all_reduce_sum(v); });
  }
  Status all_reduce_max(float* data, int64_t count, cudaStream_t stream) override {
    return round_trip(data, count, stream, [&](std::span<float> v) { return host_->all_reduce_max(v); });
  }
  Status all_gather(const void* in, void* out, int64_t bytes, cudaStream_t stream) override {
    std::vector<uint8_t> mine(static_cast<size_t>(bytes)), all(mine.size() * static_cast<size_t>(size()));
    NIB_RETURN_IF_ERROR(copy(mine.data(), in, mine.size(), cudaMemcpyDeviceToHost, stream));
    NIB_RETURN_IF_ERROR(fail_group(host_->all_gather(mine, all)));
    return copy(out, all.data(), all.size(), cudaMemcpyHostToDevice, stream);
  }
  Status broadcast(void* data, int64_t bytes, cudaStream_t stream) override {
    std::vector<uint8_t> mine(static_cast<size_t>(bytes)), all(mine.size() * static_cast<size_t>(size()));
    NIB_RETURN_IF_ERROR(copy(mine.data(), data, mine.size(), cudaMemcpyDeviceToHost, stream));
    NIB_RETURN_IF_ERROR(fail_group(host_->all_gather(mine, all)));
    return copy(data, all.data(), mine.size(), cudaMemcpyHostToDevice, stream);  // rank 0's part
  }
  void stop(const std::string& why) override { group_->stop(why); }
  void reset() override { group_->reset(); }

 private:
  // A synchronous copy on the rank's stream (the host buffer is read or written right after).
  Status copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    if (bytes == 0) return Status::ok();
    Status s = cuda_status(cudaMemcpyAsync(dst, src, bytes, kind, stream), "a tensor-parallel exchange's copy");
    if (s) s = cuda_status(cudaStreamSynchronize(stream), "a tensor-parallel exchange's copy");
    return fail_group(s);
  }
  // A rank that cannot go on stops the group, so that no other rank waits for it.
  Status fail_group(Status s) {
    if (!s) group_->stop("rank " + std::to_string(rank()) + ": " + s.message());
    return s;
  }
  template <typename Op>
  Status round_trip(float* data, int64_t count, cudaStream_t stream, Op&& op) {
    std::vector<float> host(static_cast<size_t>(count));
    NIB_RETURN_IF_ERROR(copy(host.data(), data, host.size() * 4, cudaMemcpyDeviceToHost, stream));
    NIB_RETURN_IF_ERROR(fail_group(op(std::span<float>(host))));
    return copy(data, host.data(), host.size() * 4, cudaMemcpyHostToDevice, stream);
  }

  std::unique_ptr<Collectives> host_;
  std::shared_ptr<HostGroup> group_;
};

}  // namespace

std::unique_ptr<DeviceCollectives> host_staged_collectives(std::unique_ptr<Collectives> host,
                                                           std::shared_ptr<HostGroup> group) {
  return std::make_unique<HostStaged>(std::move(host), std::move(group));
}

}  // namespace nibble::cuda
