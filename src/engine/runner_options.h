// Typed options for creating a model runner: backend, kernel choices, activation modes, KV cache
// dtype and sizing. Plain enums without CUDA, so the server and the CLI parse flags into them and
// only the runner factory maps them onto a backend.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/kernel_choice.h"
#include "formats/nvfp4.h"
#include "io/model_config.h"

namespace nibble::engine {

enum class Backend { AUTO, CPU, CUDA };  // auto: CUDA when a GPU is visible
// auto: BF16; FP32 only on the CPU (reference runs); FP8: E4M3 of the checkpoint's calibrated k/v
// scales, or of unit scale without them (vLLM's fp8_e4m3), half the bytes of BF16 to store and read.
enum class KvCacheDtype { AUTO, BF16, FP32, FP8 };
// Decode tokens' attention on the GPU: the split-KV CUDA-core kernel, or the tensor-core prefill
// kernel with one item per token (a CTA per token and KV head over its whole context).
// auto: tensor-core from 16 decode rows in a step, split-kv below (models::AUTO_TENSOR_CORE_DECODE_MIN_ROWS).
enum class DecodeAttention { AUTO, SPLIT_KV, TENSOR_CORE };
// Attention on the GPU (SGLang's --attention-backend): FlashInfer's paged kernels for every step
// (head dims 64 and 128), or nibble's own (native: tensor-core prefill + --decode-attention's
// choice). auto: FlashInfer where the head dim allows, native otherwise.
enum class AttentionBackend { AUTO, FLASHINFER, NATIVE };

std::optional<Backend> parse_backend(std::string_view name);                   // auto | cpu | cuda
std::optional<KvCacheDtype> parse_kv_cache_dtype(std::string_view name);       // auto | bf16 | fp32 | fp8 (= fp8_e4m3)
std::optional<DecodeAttention> parse_decode_attention(std::string_view name);  // auto | split-kv | tensor-core
std::optional<AttentionBackend> parse_attention_backend(std::string_view name);  // auto | flashinfer | native
const char* backend_name(Backend backend);

struct RunnerOptions {
  Backend backend = Backend::AUTO;
  DenseKernel gemm = DenseKernel::AUTO;                      // dense NVFP4 linears (CUDA)
  MoeKernel moe = MoeKernel::AUTO;                           // the MoE block (CUDA)
  AttentionBackend attention = AttentionBackend::AUTO;       // (CUDA)
  DecodeAttention decode_attention = DecodeAttention::AUTO;  // (CUDA, native attention)
  formats::ActQuant act_quant_moe = formats::ActQuant::NONE;
  formats::ActQuant act_quant_dense = formats::ActQuant::NONE;
  KvCacheDtype kv_dtype = KvCacheDtype::AUTO;
  bool cpu_kv_fp32 = false;       // kv_dtype AUTO on the CPU means fp32 (the differential tests' oracle)
  bool cpu_gpu_rounding = false;  // the CPU reference rounds to BF16 where the GPU stores BF16 (tests)
  int64_t block_size = 16;
  // KV capacity: num_kv_blocks if > 0, else kv_cache_memory_gb if > 0, else measured: on the GPU
  // gpu_memory_utilization × total memory minus what weights and workspaces take (vLLM's rule),
  // on the CPU the smaller of 1 GiB and a quarter of the available memory.
  int64_t num_kv_blocks = 0;
  double kv_cache_memory_gb = 0.0;
  double gpu_memory_utilization = 0.90;
  // CUDA: decode steps replay CUDA graphs captured at start-up unless enforce_eager (vLLM's flag).
  bool enforce_eager = false;
  // CUDA: the device (CUDA_VISIBLE_DEVICES order). How many engines of this process share the device
  // (data parallelism; on the CPU, the host): the KV cache is sized from 1/engines_on_device of the budget.
  int device = 0;
  int engines_on_device = 1;
  // The largest step the engine will run (sizes GPU workspaces).
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 8192;
  io::ConfigOverrides config_overrides;  // --hf-overrides / --rope-scaling, applied to config.json
  // One model over this many ranks (--tensor-parallel-size): Megatron's split of attention and the
  // MLPs, or with expert_parallel (--enable-expert-parallel) the experts dealt out whole. The CPU
  // reference runs each rank on a thread (io::partition says what each loads).
  int64_t tensor_parallel_size = 1;
  bool expert_parallel = false;
  // A group over nnodes hosts (the CUDA backend): this node runs tensor_parallel_size / nnodes ranks
  // on its GPUs from `device` on; node 0 listens on dist_init_addr (host:port) and drives the others.
  int nnodes = 1, node_rank = 0;
  std::string dist_init_addr;
};

}  // namespace nibble::engine
