// The collectives of tensor parallelism on device memory, queued on the rank's stream: NCCL between
// GPUs, and for ranks sharing one GPU (NCCL refuses two ranks on a device) an exchange through host
// memory. Every rank calls each operation in the same order; every rank ends with the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/collectives.h"
#include "core/status.h"

namespace nibble::cuda {

class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  virtual int64_t size() const = 0;
  virtual int64_t rank() const = 0;
  // Whether the operations may be captured in a CUDA graph (NCCL's may; the host exchange waits).
  virtual bool capturable() const = 0;
  // data[count] (fp32, device) ← the sum over the ranks.
  virtual Status all_reduce_sum(float* data, int64_t count, cudaStream_t stream) = 0;
  // data[count] ← the elementwise maximum over the ranks.
  virtual Status all_reduce_max(float* data, int64_t count, cudaStream_t stream) = 0;
  // out[r · bytes + i] ← rank r's in[i] (device; out holds size() · bytes).
  virtual Status all_gather(const void* in, void* out, int64_t bytes, cudaStream_t stream) = 0;
  // data[bytes] ← rank 0's.
  virtual Status broadcast(void* data, int64_t bytes, cudaStream_t stream) = 0;
  // A rank that cannot go on: the others must not wait for it. The host exchange wakes them with an
  // error (and reset() makes it usable for the next step); NCCL's communicator is aborted for good.
  virtual void stop(const std::string& why) = 0;
  virtual void reset() {}
};

// Ranks on one GPU (a test layout: NCCL refuses it): each operation waits for the stream, copies to
// the host, meets the other ranks through `host` (a HostGroup rank), and copies back. Not capturable.
std::unique_ptr<DeviceCollectives> host_staged_collectives(std::unique_ptr<Collectives> host,
                                                           std::shared_ptr<HostGroup> group);

// NCCL's communicator of one rank. The unique id comes from nccl_unique_id() on one rank and reaches
// every other (a thread's copy in one process; --dist-init-addr across hosts). NCCL is loaded at run
// time (libnccl.so.2: LD_LIBRARY_PATH, or PyTorch's nvidia-nccl wheel beside a python3 on PATH), so a
// one-GPU nibble runs where it is absent.
struct NcclId {
  char bytes[128] = {};  // ncclUniqueId (NCCL_UNIQUE_ID_BYTES)
};
Result<NcclId> nccl_unique_id();
// Joins the communicator on the current device; blocks until every rank has joined.
Result<std::unique_ptr<DeviceCollectives>> nccl_collectives(const NcclId& id, int64_t size, int64_t rank);
// "2.28.9 (/path/libnccl.so.2)", or why NCCL could not be loaded.
Result<std::string> nccl_version();

}  // namespace nibble::cuda
