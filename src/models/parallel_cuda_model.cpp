// ParallelCudaModel (parallel_cuda_model.h): a worker thread a rank, bound to the rank's GPU; every
// operation runs on all ranks at once (their collectives meet each other) and returns when each rank
// has queued its part. A rank that fails stops the group's collectives, so that no rank waits forever.
#include "models/parallel_cuda_model.h"

#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "core/collectives.h"
#include "core/log.h"
#include "models/node_link.h"
#include "models/parallel_model.h"

namespace nibble::models {
namespace {

// How long nodes wait for each other at start (loading a checkpoint of hundreds of GB may come first).
constexpr double NODE_JOIN_TIMEOUT_S = 1800;

class ParallelCudaModel final : public CudaModel {
  struct Rank;

 public:
  // This node's ranks: devices.size() of group.size, from nodes.node_rank · devices.size() on.
  ParallelCudaModel(const io::ParallelConfig& group, std::vector<int> devices, const NodeGroup& nodes)
      : group_(group), devices_(std::move(devices)), nodes_(nodes), ranks_(devices_.size()) {
    for (size_t r = 0; r < ranks_.size(); ++r) threads_.emplace_back([this, r] { serve(int64_t(r)); });
  }
  ~ParallelCudaModel() override {
    if (leads()) (void)link_->send({NodeOp::QUIT, {}});
    // The models and contexts go on their own threads' devices, before the threads end.
    (void)on_all([&](Rank& k) {
      k.model.reset();
      k.collectives.reset();
      k.own_ctx.reset();
      return Status::ok();
    });
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    start_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  Status init(const std::string& path, const io::ConfigOverrides& overrides, const CudaModelOptions& options,
              cuda::DeviceContext& ctx) {
    path_ = path, overrides_ = overrides;
    const int64_t n = group_.size, first = nodes_.node_rank * int64_t(ranks_.size());
    const bool distinct = std::set<int>(devices_.begin(), devices_.end()).size() == devices_.size();
    if (!distinct && nodes_.nodes > 1)
      return Status::error("--nnodes " + std::to_string(nodes_.nodes) + ": each rank needs a GPU of its own");
    cuda::NcclId id;
    if (distinct) {
      auto version = cuda::nccl_version();
      if (!version)
        return Status::error("--tensor-parallel-size " + std::to_string(n) + ": " + version.status().message());
      log_info("tensor parallelism over " + std::to_string(n) + " GPUs through NCCL " + *version +
               (nodes_.nodes > 1 ? "; node " + std::to_string(nodes_.node_rank) + " of " +
                                       std::to_string(nodes_.nodes) + " runs ranks " + std::to_string(first) + "-" +
                                       std::to_string(first + int64_t(ranks_.size()) - 1)
                                 : std::string()));
      if (nodes_.node_rank == 0) {
        auto made = cuda::nccl_unique_id();
        if (!made) return made.status();
        id = *made;
      }
      // Node 0 hands the NCCL id to the others before any rank joins the communicator.
      std::vector<uint8_t> id_bytes(id.bytes, id.bytes + sizeof(id.bytes));
      if (nodes_.nodes > 1) {
        auto link = nodes_.node_rank == 0
                        ? NodeLink::lead(nodes_.address, nodes_.nodes, id_bytes, nodes_.key, NODE_JOIN_TIMEOUT_S)
                        : NodeLink::follow(nodes_.address, nodes_.node_rank, nodes_.key, NODE_JOIN_TIMEOUT_S, id_bytes);
        if (!link) return link.status();
        link_ = std::move(link.value());
        if (id_bytes.size() != sizeof(id.bytes)) return Status::error("node link: a malformed NCCL id");
        std::memcpy(id.bytes, id_bytes.data(), sizeof(id.bytes));
      }
    } else {
      host_group_ = std::make_shared<HostGroup>(n);
      log_warn("tensor parallelism: " + std::to_string(n) + " ranks share " +
               std::to_string(std::set<int>(devices_.begin(), devices_.end()).size()) +
               " GPU(s), so they exchange through host memory and every step runs eagerly (a test layout: give "
               "each rank a GPU of its own for speed)");
    }
    // Each rank loads its slices, joins the group (NCCL's init waits for every rank) and uploads.
    return on_all([&](Rank& k) {
      const int64_t local = &k - ranks_.data(), r = first + local;
      auto loaded = io::load_checkpoint(path, overrides, rank_part(k));
      if (!loaded) return loaded.status();
      k.checkpoint = std::move(loaded.value());
      if (distinct) {
        auto c = cuda::nccl_collectives(id, n, r);
        if (!c) return c.status();
        k.collectives = std::move(c.value());
      } else {
        k.collectives = cuda::host_staged_collectives(host_group_->rank(r), host_group_);
      }
      cuda::DeviceContext* rank_ctx = &ctx;
      if (local > 0) {
        auto c = cuda::DeviceContext::create(devices_[static_cast<size_t>(local)]);
        if (!c) return c.status();
        k.own_ctx = std::move(c.value());
        rank_ctx = k.own_ctx.get();
      }
      CudaModelOptions o = options;
      o.collectives = k.collectives.get();
      auto model = create_cuda_model(k.checkpoint, o, *rank_ctx);
      if (!model) return model.status();
      k.model = std::move(model.value());
      return Status::ok();
    });
  }

  // After init: every rank read the same layout.
  Status check_layouts() const {
    const std::string first = rank_layout_key(*ranks_[0].checkpoint);
    for (size_t r = 1; r < ranks_.size(); ++r)
      if (rank_layout_key(*ranks_[r].checkpoint) != first)
        return Status::error("rank " + std::to_string(r) + " read a different checkpoint layout from " + path_ +
                             " than rank 0 (was it replaced while loading?)");
    return Status::ok();
  }

  const io::ModelConfig& config() const override { return ranks_[0].model->config(); }
  int64_t kv_bytes_per_block() const override { return ranks_[0].model->kv_bytes_per_block(); }
  // Node 0 sends each operation to the other nodes first (their ranks run it too); those that wait
  // answer with their outcome.
  Status allocate_kv_cache(int64_t n_blocks) override {
    NIB_RETURN_IF_ERROR(to_nodes(NodeOp::ALLOCATE, encode_int(n_blocks)));
    return with_nodes(on_all([&](Rank& k) { return k.model->allocate_kv_cache(n_blocks); }));
  }
  int64_t n_kv_blocks() const override { return ranks_[0].model->n_kv_blocks(); }
  Status capture_decode_graphs(int64_t max_batch) override {
    NIB_RETURN_IF_ERROR(to_nodes(NodeOp::CAPTURE, encode_int(max_batch)));
    return with_nodes(on_all([&](Rank& k) { return k.model->capture_decode_graphs(max_batch); }));
  }
  // Each rank reads its slices of the new checkpoint (the one given is the whole model's layout check).
  Status reload(std::shared_ptr<const io::LoadedCheckpoint> checkpoint) override {
    NIB_RETURN_IF_ERROR(to_nodes(NodeOp::RELOAD, {checkpoint->path.begin(), checkpoint->path.end()}));
    return with_nodes(reload_path(checkpoint->path));
  }
  Status forward(const Batch& batch) override {
    if (leads()) {  // (the batch is encoded only for other nodes: this is every step's path)
      NIB_RETURN_IF_ERROR(link_->check_failures());
      NIB_RETURN_IF_ERROR(link_->send({NodeOp::FORWARD, encode_batch(batch)}));
    }
    return on_all([&](Rank& k) { return k.model->forward(batch); });
  }

  // Another node's ranks: node 0's operations until it quits (ok) or an operation fails here (its
  // error, which node 0 hears as well).
  Status follow() {
    for (;;) {
      auto m = link_->receive();
      if (!m) return Status::error("node 0 went away: " + m.status().message());
      Status s;
      const bool answers = m->op != NodeOp::FORWARD;
      if (m->op == NodeOp::QUIT) return Status::ok();
      if (m->op == NodeOp::ALLOCATE || m->op == NodeOp::CAPTURE) {
        auto n = decode_int(m->payload);
        s = !n                          ? n.status()
            : m->op == NodeOp::ALLOCATE ? on_all([&](Rank& k) { return k.model->allocate_kv_cache(*n); })
                                        : on_all([&](Rank& k) { return k.model->capture_decode_graphs(*n); });
      } else if (m->op == NodeOp::RELOAD) {
        s = reload_path(std::string(m->payload.begin(), m->payload.end()));
      } else if (m->op == NodeOp::FORWARD) {
        auto batch = decode_batch(m->payload);
        s = batch ? on_all([&](Rank& k) { return k.model->forward(*batch); }) : batch.status();
      } else {
        s = Status::error("node link: an unexpected message");
      }
      if (answers || !s) {
        const std::string why = s ? std::string() : s.message();
        NIB_RETURN_IF_ERROR(link_->send({NodeOp::STATUS, {why.begin(), why.end()}}));
      }
      if (!s) return s;
    }
  }

 private:
  Status reload_path(const std::string& path) {
    return on_all([&](Rank& k) {
      auto loaded = io::load_checkpoint(path, overrides_, rank_part(k));
      if (!loaded) return loaded.status();
      std::shared_ptr<const io::LoadedCheckpoint> next = std::move(loaded.value());
      NIB_RETURN_IF_ERROR(k.model->reload(next));
      k.checkpoint = std::move(next);
      return Status::ok();
    });
  }
  // Node 0 of a group over hosts.
  bool leads() const { return link_ && nodes_.node_rank == 0; }
  // Rank k's part of the group (its global rank: this node's first plus its place here).
  io::ParallelConfig rank_part(const Rank& k) const {
    io::ParallelConfig rank = group_;
    rank.rank = nodes_.node_rank * int64_t(ranks_.size()) + (&k - ranks_.data());
    return rank;
  }
  Status to_nodes(NodeOp op, std::vector<uint8_t> payload) {
    return leads() ? link_->send({op, std::move(payload)}) : Status::ok();
  }
  // This node's outcome, then (node 0) the others'.
  Status with_nodes(Status local) {
    Status others = leads() ? link_->collect_status() : Status::ok();
    return !local ? local : others;
  }

 public:
  const float* logits() const override { return ranks_[0].model->logits(); }
  int32_t* drawn_tokens() override { return ranks_[0].model->drawn_tokens(); }
  std::string profile_report() const override { return ranks_[0].model->profile_report(); }
  std::string layout() const override {
    std::string gpus;
    for (int d : devices_) gpus += (gpus.empty() ? "cuda:" : ",") + std::to_string(d);
    return std::to_string(group_.size) + (group_.expert_parallel ? " expert-parallel" : "") + " ranks" +
           (nodes_.nodes > 1 ? " over " + std::to_string(nodes_.nodes) + " nodes (this node's on " + gpus + ")"
                             : " on " + gpus) +
           (host_group_ ? " through host memory" : " through NCCL");
  }

 private:
  struct Rank {
    std::shared_ptr<const io::LoadedCheckpoint> checkpoint;
    std::unique_ptr<cuda::DeviceCollectives> collectives;
    std::unique_ptr<cuda::DeviceContext> own_ctx;  // ranks 1..n-1 (rank 0 runs on the runner's)
    std::unique_ptr<CudaModel> model;
    Status status;
  };

  // Runs fn on every rank's thread at once; the first rank's error, after every rank has returned.
  Status on_all(const std::function<Status(Rank&)>& fn) {
    {
      std::lock_guard lock(mutex_);
      task_ = &fn, running_ = static_cast<int64_t>(ranks_.size()), ++generation_;
    }
    start_.notify_all();
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return running_ == 0; });
    task_ = nullptr;
    Status first;
    for (const Rank& k : ranks_)
      if (!k.status && first) first = k.status;
    if (!first)
      for (const Rank& k : ranks_)
        if (k.collectives) k.collectives->reset();  // every rank returned: the host group may meet again
    return first;
  }

  void serve(int64_t r) {
    cudaSetDevice(devices_[static_cast<size_t>(r)]);
    Rank& k = ranks_[static_cast<size_t>(r)];
    uint64_t seen = 0;
    for (;;) {
      const std::function<Status(Rank&)>* task = nullptr;
      {
        std::unique_lock lock(mutex_);
        start_.wait(lock, [&] { return quit_ || generation_ != seen; });
        if (quit_) return;
        seen = generation_, task = task_;
      }
      k.status = (*task)(k);
      if (!k.status)  // the others must not wait for this rank in a collective
        for (Rank& other : ranks_)
          if (other.collectives) other.collectives->stop("rank " + std::to_string(r) + ": " + k.status.message());
      std::lock_guard lock(mutex_);
      if (--running_ == 0) done_.notify_all();
    }
  }

  io::ParallelConfig group_;
  std::vector<int> devices_;
  NodeGroup nodes_;
  std::unique_ptr<NodeLink> link_;
  std::string path_;
  io::ConfigOverrides overrides_;
  std::shared_ptr<HostGroup> host_group_;
  std::vector<Rank> ranks_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<Status(Rank&)>* task_ = nullptr;
  uint64_t generation_ = 0;
  int64_t running_ = 0;
  bool quit_ = false;
};

// The group's ranks are the nodes' GPUs: devices.size() a node.
Status check_split(const io::ParallelConfig& group, const std::vector<int>& devices, const NodeGroup& nodes) {
  if (group.size < 2 || nodes.nodes < 1 || static_cast<int64_t>(devices.size()) * nodes.nodes != group.size)
    return Status::error("--tensor-parallel-size " + std::to_string(group.size) + " over " +
                         std::to_string(nodes.nodes) + " node(s): " + std::to_string(devices.size()) +
                         " GPUs a node do not make it");
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<CudaModel>> create_parallel_cuda_model(const std::string& path,
                                                              const io::ConfigOverrides& overrides,
                                                              const io::ParallelConfig& group,
                                                              const std::vector<int>& devices,
                                                              const CudaModelOptions& options, cuda::DeviceContext& ctx,
                                                              const NodeGroup& nodes) {
  NIB_RETURN_IF_ERROR(check_split(group, devices, nodes));
  auto model = std::make_unique<ParallelCudaModel>(group, devices, nodes);
  NIB_RETURN_IF_ERROR(model->init(path, overrides, options, ctx));
  NIB_RETURN_IF_ERROR(model->check_layouts());
  return std::unique_ptr<CudaModel>(std::move(model));
}

Status follow_node(const std::string& path, const io::ConfigOverrides& overrides, const io::ParallelConfig& group,
                   const std::vector<int>& devices, const CudaModelOptions& options, cuda::DeviceContext& ctx,
                   const NodeGroup& nodes) {
  if (nodes.node_rank < 1 || nodes.node_rank >= nodes.nodes)
    return Status::error("--node-rank " + std::to_string(nodes.node_rank) + " is not in 1.." +
                         std::to_string(nodes.nodes - 1));
  NIB_RETURN_IF_ERROR(check_split(group, devices, nodes));
  ParallelCudaModel model(group, devices, nodes);
  NIB_RETURN_IF_ERROR(model.init(path, overrides, options, ctx));
  NIB_RETURN_IF_ERROR(model.check_layouts());
  log_info("node " + std::to_string(nodes.node_rank) + " joined; following node 0");
  return model.follow();
}

}  // namespace nibble::models
