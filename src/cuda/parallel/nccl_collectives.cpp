// nccl_collectives (device_collectives.cuh): NCCL loaded with dlopen — the few entry points tensor
// parallelism calls, resolved once — and one rank's communicator behind DeviceCollectives. NCCL's
// ring and tree all-reduces leave every rank with the same bits, which the ranks' replicated
// residual streams rely on.
#include <dlfcn.h>
#include <glob.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "cuda/parallel/device_collectives.cuh"

namespace nibble::cuda {
namespace {

struct NcclApi {
  std::string path, error;
  ncclResult_t (*get_version)(int*) = nullptr;
  ncclResult_t (*get_unique_id)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*comm_abort)(ncclComm_t) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t) = nullptr;
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
};

// Where libnccl.so.2 may be: the loader's path (LD_LIBRARY_PATH, the CUDA toolkit's lib), then the
// nvidia-nccl-cu13 wheel that PyTorch installs (nvidia/nccl/lib under a python's packages).
std::vector<std::string> nccl_candidates() {
  std::vector<std::string> paths = {"libnccl.so.2"};
  for (const char* pattern : {"/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/usr/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/opt/conda/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2"}) {
    glob_t g{};
    if (glob(pattern, 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
    globfree(&g);
  }
  return paths;
}

const NcclApi& nccl() {
  static const NcclApi api = [] {
    NcclApi a;
    void* lib = nullptr;
    for (const std::string& p : nccl_candidates())
      if ((lib = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL))) {
        a.path = p;
        break;
      }
    if (!lib) {
      a.error = "NCCL (libnccl.so.2) was not found: put its folder on LD_LIBRARY_PATH (the CUDA toolkit's lib, or "
                "the nvidia-nccl-cu13 wheel's nvidia/nccl/lib)";
      return a;
    }
    auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && a.error.empty()) a.error = std::string(a.path) + " has no " + name;
    };
    load(a.get_version, "ncclGetVersion");
    load(a.get_unique_id, "ncclGetUniqueId");
    load(a.comm_init_rank, "ncclCommInitRank");
    load(a.comm_destroy, "ncclCommDestroy");
    load(a.comm_abort, "ncclCommAbort");
    load(a.error_string, "ncclGetErrorString");
    load(a.all_reduce, "ncclAllReduce");
    load(a.all_gather, "ncclAllGather");
    load(a.broadcast, "ncclBroadcast");
    return a;
  }();
  return api;
}

Status nccl_status(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::ok();
  return Status::error(std::string("NCCL ") + what + ": " + nccl().error_string(r));
}

class Nccl final : public DeviceCollectives {
 public:
  Nccl(ncclComm_t comm, int64_t size, int64_t rank) : comm_(comm), size_(size), rank_(rank) {}
  ~Nccl() override {
    if (comm_) nccl().comm_destroy(comm_);
  }
  // Ends every operation in flight on this rank (the others' fail or end too); the group is unusable.
  void stop(const std::string&) override {
    if (comm_) nccl().comm_abort(comm_);
    comm_ = nullptr;
  }
  int64_t size() const override { return size_; }
  int64_t rank() const override { return rank_; }
  bool capturable() const override { return true; }

  Status all_reduce_sum(float* data, int64_t count, cudaStream_t stream) override {
    NIB_RETURN_IF_ERROR(live());
    return nccl_status(nccl().all_reduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, comm_, stream),
                       "all-reduce (sum)");
  }
  Status all_reduce_max(float* data, int64_t count, cudaStream_t stream) override {
    NIB_RETURN_IF_ERROR(live());
    return nccl_status(nccl().all_reduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclMax, comm_, stream),
                       "all-reduce (max)");
  }
  Status all_gather(const void* in, void* out, int64_t bytes, cudaStream_t stream) override {
    NIB_RETURN_IF_ERROR(live());
    return nccl_status(nccl().all_gather(in, out, static_cast<size_t>(bytes), ncclUint8, comm_, stream), "all-gather");
  }
  Status broadcast(void* data, int64_t bytes, cudaStream_t stream) override {
    NIB_RETURN_IF_ERROR(live());
    return nccl_status(nccl().broadcast(data, data, static_cast<size_t>(bytes), ncclUint8, 0, comm_, stream),
                       "broadcast");
  }

 private:
  Status live() const {
    return comm_ ? Status::ok() : Status::error("the tensor-parallel group was stopped after a rank failed");
  }
  ncclComm_t comm_ = nullptr;
  int64_t size_ = 0, rank_ = 0;
};

}  // namespace

Result<std::string> nccl_version() {
  const NcclApi& api = nccl();
  if (!api.error.empty()) return Status::error(api.error);
  int v = 0;
  NIB_RETURN_IF_ERROR(nccl_status(api.get_version(&v), "version"));
  // NCCL_VERSION_CODE since 2.9: major · 10000 + minor · 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) + " (" +
         api.path + ")";
}

Result<NcclId> nccl_unique_id() {
  const NcclApi& api = nccl();
  if (!api.error.empty()) return Status::error(api.error);
  ncclUniqueId id;
  NIB_RETURN_IF_ERROR(nccl_status(api.get_unique_id(&id), "unique id"));
  NcclId out;
  static_assert(sizeof(out.bytes) == sizeof(id.internal));
  std::memcpy(out.bytes, id.internal, sizeof(out.bytes));
  return out;
}

Result<std::unique_ptr<DeviceCollectives>> nccl_collectives(const NcclId& id, int64_t size, int64_t rank) {
  const NcclApi& api = nccl();
  if (!api.error.empty()) return Status::error(api.error);
  ncclUniqueId nid;
  std::memcpy(nid.internal, id.bytes, sizeof(nid.internal));
  ncclComm_t comm = nullptr;
  NIB_RETURN_IF_ERROR(nccl_status(api.comm_init_rank(&comm, static_cast<int>(size), nid, static_cast<int>(rank)),
                                  ("communicator of rank " + std::to_string(rank) + " of " + std::to_string(size))
                                      .c_str()));
  return std::unique_ptr<DeviceCollectives>(std::make_unique<Nccl>(comm, size, rank));
}

}  // namespace nibble::cuda
