// The FlashInfer attention wrapper: the step's page table staged through pinned memory, FlashInfer's
// planners (host) splitting the work over CTAs, and the launch of its FA2 paged kernels
// (flashinfer_attention_hd*.cu) and, for a step's trailing prefill chunks, its SM90 one
// (flashinfer_attention_sm90.cu). FlashInfer throws flashinfer::Error: caught here, returned as Status.
#include "cuda/attention/flashinfer_attention.cuh"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "cuda/common/check.cuh"
#include "cuda/attention/flashinfer_attention_launch.cuh"
#include "cuda/attention/flashinfer_attention_sm90.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/diagnostics/step_profiler.cuh"

namespace nibble::cuda {

namespace glue = flashinfer_glue;

bool flashinfer_attention_supported(int64_t head_dim, bool kv_fp8) {
  return head_dim == 128 || (head_dim == 64 && !kv_fp8);
}

namespace {
// Query rows a request needs for the SM90 kernel (below: FA2, which packs a group's query heads into
// one tile).
constexpr int64_t SM90_MIN_ROWS = 64;
}  // namespace

struct FlashInferAttention::Impl {
  Shape shape;
  int64_t max_rows = 0, max_requests = 0, max_pages = 0;
  int sms = 0;
  // Step metadata, one block: qo_indptr [R+1], kv page indptr [R+1], last_page_len [R], page ids
  // [max_pages] (R = max_requests): fixed offsets, so a captured graph reads the next step's. The
  // pinned staging (of it and of the schedule) twice over, alternating by step: a step is planned
  // while the one before may still wait for its copies (overlapped scheduling).
  PinnedArray<int32_t> h_metas[2];
  PinnedArray<char> h_int_wss[2];
  int parity = 0;
  int32_t *h_meta = nullptr, *d_meta = nullptr;
  int64_t n = 0, rows = 0, pages = 0;
  // FlashInfer's workspaces: split-KV partial outputs (device), the FA2 and SM90 schedules (device,
  // staged in pinned memory; one each, since a step can run both kernels).
  void* float_ws = nullptr;
  void *int_ws = nullptr, *sm90_int_ws = nullptr;
  PinnedArray<char> h_sm90_int_wss[2];
  void *h_int_ws = nullptr, *h_sm90_int_ws = nullptr;  // h_int_wss[parity], h_sm90_int_wss[parity]
  size_t float_bytes = 0, int_bytes = 0, sm90_int_bytes = 0;
  flashinfer::PrefillPlanInfo info;
  // A step's trailing requests of SM90_MIN_ROWS or more rows (head dim 128) run FlashInfer's SM90
  // kernel on its own plan; requests [0, fa2_requests) run FA2. The scheduler puts the running
  // sequences (decodes) first and new prompts last, so a mixed step's prompts take the SM90 kernel
  // and its decode rows FA2's packed 16-row tiles — one FA2 plan for both made the decode rows each
  // a 128-row tile (FlashInfer picks the tile height from the step's mean query length).
  flashinfer::PrefillPlanSM90Info sm90_info;
  std::vector<int32_t> kv_lens;  // the SM90 plan's input: keys per request
  int64_t fa2_requests = 0;
  bool planned = false;
  // A mixed step's two parts side by side: FA2 (the decode rows, memory-bound) on a stream of its own
  // forked from and joined back into the step's stream, beside the SM90 kernel (the prompt,
  // compute-bound), FA2 launched first (H200, mixed steps 0.8–2.8% shorter; the SM90 kernel first
  // gained a little less).
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  ~Impl() {
    if (side) cudaStreamDestroy(side);
    if (fork) cudaEventDestroy(fork);
    if (join) cudaEventDestroy(join);
  }

  bool runs_sm90() const { return fa2_requests < n; }
  int64_t q_rows(int64_t i) const { return qo_indptr(h_meta)[i + 1] - qo_indptr(h_meta)[i]; }
  // The SM90 kernel's schedule for requests [first, n) (PrefillSM90Plan: host, then a copy on the stream).
  Status plan_sm90(int64_t first, cudaStream_t stream);
  // FA2's schedule for requests [0, fa2_requests) (PrefillPlan, likewise).
  Status plan_fa2(bool graph, cudaStream_t stream);
  // The launches of each part, by its plan.
  Status run_sm90(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache, uint16_t* out,
                  cudaStream_t stream) const;
  template <typename KV>  // the cache's element: __nv_bfloat16 or FP8 E4M3 (scaled by k_scale, v_scale)
  Status run_fa2(const uint16_t* q, const void* k_cache, const void* v_cache, uint16_t* out, cudaStream_t stream,
                 float k_scale = 1.0f, float v_scale = 1.0f) const;

  int32_t* qo_indptr(int32_t* base) const { return base; }
  int32_t* kv_indptr(int32_t* base) const { return base + max_requests + 1; }
  int32_t* last_page_len(int32_t* base) const { return base + 2 * (max_requests + 1); }
  int32_t* indices(int32_t* base) const { return base + 3 * max_requests + 2; }

  void flip() {
    parity ^= 1;
    h_meta = h_metas[parity].data();
    h_int_ws = h_int_wss[parity].data();
    h_sm90_int_ws = h_sm90_int_wss[parity].data();
  }
};

FlashInferAttention::FlashInferAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FlashInferAttention::~FlashInferAttention() = default;

Result<std::unique_ptr<FlashInferAttention>> FlashInferAttention::create(const Shape& shape, int64_t max_rows,
                                                                         int64_t max_requests, int64_t max_pages,
                                                                         DeviceArena& arena) {
  if (!flashinfer_attention_supported(shape.head_dim, shape.kv_fp8))
    return Status::error("FlashInfer attention: head_dim " + std::to_string(shape.head_dim) + " is not compiled in (" +
                         (shape.kv_fp8 ? "128 with an FP8 KV cache)" : "64, 128)"));
  if (shape.n_kv_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0 || shape.page_size <= 0)
    return Status::error("FlashInfer attention: n_heads must be a multiple of n_kv_heads");
  auto impl = std::make_unique<Impl>();
  impl->shape = shape;
  NIB_RETURN_IF_ERROR(
      cuda_status(cudaStreamCreateWithFlags(&impl->side, cudaStreamNonBlocking), "FlashInfer side stream"));
  NIB_RETURN_IF_ERROR(
      cuda_status(cudaEventCreateWithFlags(&impl->fork, cudaEventDisableTiming), "FlashInfer fork event"));
  NIB_RETURN_IF_ERROR(
      cuda_status(cudaEventCreateWithFlags(&impl->join, cudaEventDisableTiming), "FlashInfer join event"));
  impl->max_rows = max_rows, impl->max_requests = max_requests, impl->max_pages = max_pages;
  const size_t meta_ints = static_cast<size_t>(3 * max_requests + 2 + max_pages);
  for (PinnedArray<int32_t>& h : impl->h_metas)
    NIB_RETURN_IF_ERROR(h.resize(meta_ints, "the FlashInfer step metadata"));
  NIB_RETURN_IF_ERROR(arena.alloc(impl->d_meta, meta_ints, "the FlashInfer page table"));
  // Split-KV partials: the planner reserves NH · ceil(P · cta_tile_q / group) rows of head_dim + 1
  // floats, P (CTAs) at most max(2 · SMs / NKV, CUDA-graph requests, query tiles), cta_tile_q ≤ 128
  // (flashinfer/attention/scheduler.cuh, PrefillPlanImpl). It only splits when P ≤ 2 · SMs / NKV or
  // for graphs, whose requests have one row each (P = requests).
  int device = 0, sms = 0;
  NIB_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  NIB_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count"));
  impl->sms = sms;
  const int64_t group = shape.n_heads / shape.n_kv_heads;
  const int64_t ctas = std::max<int64_t>(2 * sms / shape.n_kv_heads, max_requests);
  const int64_t partial_rows = (ctas * 128 + group - 1) / group;
  impl->float_bytes = static_cast<size_t>(shape.n_heads * partial_rows * (shape.head_dim + 1) * 4) + 4096;
  // The schedule: a few ints per CTA (at most one per 16 packed query rows plus one per request,
  // or the split bound above) and one per query row, 16-byte aligned pieces.
  const int64_t tiles = std::max(ctas, (max_rows * group + 15) / 16 + max_requests);
  // The SM90 schedule: 7 ints per (query tile of 128, head) work and one per SM (PrefillSM90Plan).
  const int64_t sm90_works = ((max_rows + 127) / 128 + max_requests) * shape.n_heads;
  impl->int_bytes = static_cast<size_t>(4 * (4 * tiles + max_requests + max_rows + 8) + 256);
  impl->sm90_int_bytes = static_cast<size_t>(4 * (7 * sm90_works + sms + 1) + 256);
  auto fw = arena.alloc(impl->float_bytes, "the FlashInfer split-KV workspace");
  if (!fw) return fw.status();
  impl->float_ws = *fw;
  auto iw = arena.alloc(impl->int_bytes, "the FlashInfer schedule");
  if (!iw) return iw.status();
  impl->int_ws = *iw;
  auto sw = arena.alloc(impl->sm90_int_bytes, "the FlashInfer SM90 schedule");
  if (!sw) return sw.status();
  impl->sm90_int_ws = *sw;
  for (PinnedArray<char>& h : impl->h_int_wss)
    NIB_RETURN_IF_ERROR(h.resize(impl->int_bytes, "the FlashInfer schedule"));
  for (PinnedArray<char>& h : impl->h_sm90_int_wss)
    NIB_RETURN_IF_ERROR(h.resize(impl->sm90_int_bytes, "the FlashInfer SM90 schedule"));
  impl->kv_lens.resize(static_cast<size_t>(max_requests));
  impl->flip();
  return std::unique_ptr<FlashInferAttention>(new FlashInferAttention(std::move(impl)));
}

void FlashInferAttention::clear() {
  Impl& m = *impl_;
  m.flip();
  m.n = m.rows = m.pages = 0;
  m.qo_indptr(m.h_meta)[0] = 0;
  m.kv_indptr(m.h_meta)[0] = 0;
}

Status FlashInferAttention::add(int64_t q_rows, int64_t kv_tokens, const int32_t* block_table) {
  Impl& m = *impl_;
  const int64_t ps = m.shape.page_size, n_pages = (kv_tokens + ps - 1) / ps;
  if (q_rows < 1 || kv_tokens < q_rows)
    return Status::error("FlashInfer attention: a request needs 1 ≤ query rows ≤ keys");
  if (m.n + 1 > m.max_requests || m.rows + q_rows > m.max_rows || m.pages + n_pages > m.max_pages)
    return Status::error("FlashInfer attention: the step exceeds the sizes the workspaces were made for");
  std::copy(block_table, block_table + n_pages, m.indices(m.h_meta) + m.pages);
  m.rows += q_rows, m.pages += n_pages;
  m.last_page_len(m.h_meta)[m.n] = static_cast<int32_t>(kv_tokens - (n_pages - 1) * ps);
  ++m.n;
  m.qo_indptr(m.h_meta)[m.n] = static_cast<int32_t>(m.rows);
  m.kv_indptr(m.h_meta)[m.n] = static_cast<int32_t>(m.pages);
  return Status::ok();
}

Status FlashInferAttention::Impl::plan_sm90(int64_t first, cudaStream_t stream) {
  Impl& m = *this;
  const Shape& s = m.shape;
  for (int64_t i = first; i < m.n; ++i) {
    const int64_t pages = m.kv_indptr(m.h_meta)[i + 1] - m.kv_indptr(m.h_meta)[i];
    m.kv_lens[static_cast<size_t>(i)] = static_cast<int32_t>((pages - 1) * s.page_size + m.last_page_len(m.h_meta)[i]);
  }
  // The schedule keeps each request's query and page offsets as given (absolute in the step's q, out
  // and page ids), so requests [first, n) plan from their slice of the step's arrays.
  const int64_t rows = m.rows - m.qo_indptr(m.h_meta)[first];
  try {
    const cudaError_t e = flashinfer::PrefillSM90Plan<int32_t>(
        m.float_ws, m.float_bytes, m.sm90_int_ws, m.h_sm90_int_ws, m.sm90_int_bytes, m.sm90_info,
        m.qo_indptr(m.h_meta) + first, m.kv_indptr(m.h_meta) + first, m.kv_lens.data() + first,
        static_cast<uint32_t>(rows), static_cast<uint32_t>(m.n - first), static_cast<uint32_t>(s.n_heads),
        static_cast<uint32_t>(s.n_kv_heads), static_cast<uint32_t>(s.head_dim), static_cast<uint32_t>(s.head_dim),
        static_cast<uint32_t>(s.page_size), /*causal=*/true, /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/2, stream);
    return cuda_status(e, "FlashInfer SM90 attention plan");
  } catch (const std::exception& error) {
    return Status::error(std::string("FlashInfer SM90 attention plan: ") + error.what());
  }
}

Status FlashInferAttention::Impl::plan_fa2(bool graph, cudaStream_t stream) {
  Impl& m = *this;
  const Shape& s = m.shape;
  const int64_t n = m.fa2_requests, rows = m.qo_indptr(m.h_meta)[n];
  // Split-KV (FlashInfer's planner, and its merge launch) only while the unsplit grid — a CTA per query
  // tile and KV head — would fill less than half the SMs. A function of the query rows alone, so each
  // decode graph (one per batch size) keeps its split or its absence on every replay. H200, full-size
  // Qwen3-30B-A3B, no split against split everywhere (docs/lab/perf-notebook.md): pp512 33.8k against 30.1k tok/s,
  // S_TG b64 5,317 against 5,223, b32 3,344 / 3,306, but b16 2,112 / 2,147. Small decode batches
  // split even at short contexts: no split below 768 / 1,536 keys gave tg128 390 against 398 tok/s,
  // and S_TG b1 / b4 at ~1,000 keys 333 / 944 against 376 / 1,030.
  const int64_t group = s.n_heads / s.n_kv_heads;
  int64_t tiles = 0;
  try {
    const int64_t avg_packed = graph ? group : rows * group / n;
    const int64_t cta_tile_q = flashinfer::FA2DetermineCtaTileQ(avg_packed, static_cast<uint32_t>(s.head_dim));
    for (int64_t i = 0; i < n; ++i) tiles += (m.q_rows(i) * group + cta_tile_q - 1) / cta_tile_q;
  } catch (const std::exception& error) {
    return Status::error(std::string("FlashInfer attention plan: ") + error.what());
  }
  const bool split = 2 * tiles * s.n_kv_heads < m.sms;
  // PrefillPlan leaves the fields it does not use (the split buffers' offsets without a split) as they
  // were: reset, so a decode graph's plan compares equal to its capture's whatever ran in between (a
  // long prefill or a small split batch before made every S_TG and serving decode step of ≥ 17
  // requests run eagerly).
  m.info = flashinfer::PrefillPlanInfo{};
  try {
    const cudaError_t e = flashinfer::PrefillPlan<int32_t>(
        m.float_ws, m.float_bytes, m.int_ws, m.h_int_ws, m.int_bytes, m.info, m.qo_indptr(m.h_meta),
        m.kv_indptr(m.h_meta), static_cast<uint32_t>(rows), static_cast<uint32_t>(n), static_cast<uint32_t>(s.n_heads),
        static_cast<uint32_t>(s.n_kv_heads), static_cast<uint32_t>(s.head_dim), static_cast<uint32_t>(s.head_dim),
        static_cast<uint32_t>(s.page_size), graph, /*sizeof_dtype_o=*/2, /*window_left=*/-1, /*fixed_split_size=*/-1,
        /*disable_split_kv=*/!split, /*num_colocated_ctas=*/0, /*uniform_q_len=*/graph ? 1 : 0, stream);
    return cuda_status(e, "FlashInfer attention plan");
  } catch (const std::exception& error) {
    return Status::error(std::string("FlashInfer attention plan: ") + error.what());
  }
}

Status FlashInferAttention::plan(bool graph, cudaStream_t stream) {
  Impl& m = *impl_;
  if (m.n == 0) return Status::error("FlashInfer attention: an empty step");
  m.planned = false;
  // The metadata block up to the last page id in use; the caller waits for a step before staging the
  // one after next, so a copy never reads a pinned buffer being rewritten.
  const size_t used = static_cast<size_t>(3 * m.max_requests + 2 + m.pages) * 4;
  NIB_RETURN_IF_ERROR(
      cuda_status(cudaMemcpyAsync(m.d_meta, m.h_meta, used, cudaMemcpyHostToDevice, stream), "FlashInfer page table"));
  // The trailing run of requests of SM90_MIN_ROWS rows or more: the SM90 kernel (no query-head
  // packing, so a CTA's 128 query rows are one head's: short chunks and decode rows stay on FA2's
  // packed tiles). An FP8 cache runs FA2 for all (the SM90 kernel reads FP8 K/V only with FP8 queries).
  m.fa2_requests = m.n;
  if (!graph && m.shape.head_dim == 128 && !m.shape.kv_fp8)
    while (m.fa2_requests > 0 && m.q_rows(m.fa2_requests - 1) >= SM90_MIN_ROWS) --m.fa2_requests;
  if (m.runs_sm90()) NIB_RETURN_IF_ERROR(m.plan_sm90(m.fa2_requests, stream));
  if (m.fa2_requests > 0) NIB_RETURN_IF_ERROR(m.plan_fa2(graph, stream));
  m.planned = true;
  return Status::ok();
}

std::vector<int64_t> FlashInferAttention::plan_info() const { return impl_->info.ToVector(); }

Status FlashInferAttention::Impl::run_sm90(const uint16_t* q, const uint16_t* k_cache, const uint16_t* v_cache,
                                           uint16_t* out, cudaStream_t stream) const {
  const Impl& m = *this;
  const Shape& s = m.shape;
  const flashinfer::PrefillPlanSM90Info& si = m.sm90_info;
  void* iw = m.sm90_int_ws;
  auto at = [&](int64_t offset) { return flashinfer::GetPtrFromBaseOffset<int32_t>(iw, offset); };
  flashinfer_sm90::Args a{};
  a.q = q, a.k_cache = k_cache, a.v_cache = v_cache, a.out = out;
  a.kv_indices = m.indices(m.d_meta);
  a.qo_tile_indices = at(si.qo_tile_indices_offset), a.qo_indptr = at(si.qo_indptr_offset);
  a.kv_indptr = at(si.kv_indptr_offset), a.qo_lens = at(si.qo_len_offset), a.kv_lens = at(si.kv_len_offset);
  a.head_indices = at(si.head_indices_offset), a.work_indptr = at(si.work_indptr_offset);
  a.batch_indices = at(si.batch_indices_offset);
  a.same_schedule_for_all_heads = si.same_schedule_for_all_heads;
  a.rows = m.rows;
  a.n_heads = static_cast<int>(s.n_heads), a.n_kv_heads = static_cast<int>(s.n_kv_heads);
  a.page_size = static_cast<int>(s.page_size);
  a.sm_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  a.stream = stream;
  return flashinfer_sm90::launch_paged_hd128(a);
}

template <typename KV>
Status FlashInferAttention::Impl::run_fa2(const uint16_t* q, const void* k_cache, const void* v_cache, uint16_t* out,
                                          cudaStream_t stream, float k_scale, float v_scale) const {
  const Impl& m = *this;
  const Shape& s = m.shape;
  glue::LaunchArgs<KV> a{};
  glue::PagedParams<KV>& p = a.params;
  p.q = reinterpret_cast<glue::DTypeQ*>(const_cast<uint16_t*>(q));
  p.paged_kv = flashinfer::paged_kv_t<KV, int32_t>(
      static_cast<uint32_t>(s.n_kv_heads), static_cast<uint32_t>(s.page_size), static_cast<uint32_t>(s.head_dim),
      static_cast<uint32_t>(m.fa2_requests), flashinfer::QKVLayout::kNHD, static_cast<KV*>(const_cast<void*>(k_cache)),
      static_cast<KV*>(const_cast<void*>(v_cache)), m.indices(m.d_meta), m.kv_indptr(m.d_meta),
      m.last_page_len(m.d_meta));
  p.q_indptr = m.qo_indptr(m.d_meta);
  p.o = reinterpret_cast<glue::DTypeO*>(out);
  p.lse = nullptr;
  p.group_size = flashinfer::uint_fastdiv(static_cast<uint32_t>(s.n_heads / s.n_kv_heads));
  p.sm_scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  if constexpr (std::is_same_v<KV, glue::Fp8>) p.sm_scale *= k_scale, p.v_scale = v_scale;
  p.rope_rcp_scale = 1.0, p.rope_rcp_theta = 1.0, p.logits_soft_cap = 0.0;
  p.num_qo_heads = static_cast<uint32_t>(s.n_heads);
  p.q_stride_n = static_cast<int32_t>(s.n_heads * s.head_dim);
  p.q_stride_h = static_cast<int32_t>(s.head_dim);
  p.window_left = -1;
  void* iw = m.int_ws;
  const flashinfer::PrefillPlanInfo& info = m.info;
  p.request_indices = flashinfer::GetPtrFromBaseOffset<int32_t>(iw, info.request_indices_offset);
  p.qo_tile_indices = flashinfer::GetPtrFromBaseOffset<int32_t>(iw, info.qo_tile_indices_offset);
  p.kv_tile_indices = flashinfer::GetPtrFromBaseOffset<int32_t>(iw, info.kv_tile_indices_offset);
  p.o_indptr = flashinfer::GetPtrFromBaseOffset<int32_t>(iw, info.o_indptr_offset);
  p.kv_chunk_size_ptr = flashinfer::GetPtrFromBaseOffset<int32_t>(iw, info.kv_chunk_size_ptr_offset);
  if (info.split_kv) {
    p.merge_indptr = flashinfer::GetPtrFromBaseOffset<int32_t>(iw, info.merge_indptr_offset);
    a.tmp_v = flashinfer::GetPtrFromBaseOffset<glue::DTypeO>(m.float_ws, info.v_offset);
    a.tmp_s = flashinfer::GetPtrFromBaseOffset<float>(m.float_ws, info.s_offset);
  }
  p.padded_batch_size = static_cast<uint32_t>(info.padded_batch_size);
  p.max_total_num_rows = static_cast<uint32_t>(info.total_num_rows);
  if (info.enable_cuda_graph) {
    p.block_valid_mask = flashinfer::GetPtrFromBaseOffset<bool>(iw, info.block_valid_mask_offset);
    p.total_num_rows = flashinfer::GetPtrFromBaseOffset<uint32_t>(iw, info.total_num_rows_offset);
  }
  a.cta_tile_q = info.cta_tile_q;
  a.enable_pdl = pdl_enabled();
  a.stream = stream;
  try {
    cudaError_t e = cudaErrorInvalidValue;  // create() checked the pair is compiled in
    if constexpr (std::is_same_v<KV, glue::Fp8>)
      e = glue::launch_paged<128, KV>(a);
    else
      e = s.head_dim == 128 ? glue::launch_paged<128, KV>(a) : glue::launch_paged<64, KV>(a);
    return cuda_status(e, "FlashInfer paged attention");
  } catch (const std::exception& error) {
    return Status::error(std::string("FlashInfer paged attention: ") + error.what());
  }
}

Status FlashInferAttention::run(const uint16_t* q, const void* k_cache, const void* v_cache, uint16_t* out,
                                cudaStream_t stream, float k_scale, float v_scale) const {
  const Impl& m = *impl_;
  if (!m.planned) return Status::error("FlashInfer attention: run before plan");
  // The two parts write disjoint rows of out (an FP8 cache runs FA2 only: plan()). Both running, FA2
  // goes on the side stream (never in a graph: only eager steps run the SM90 kernel).
  const bool overlap = m.fa2_requests > 0 && m.runs_sm90();
  const cudaStream_t fa2_stream = overlap ? m.side : stream;
  if (overlap) {
    NIB_RETURN_IF_ERROR(cuda_status(cudaEventRecord(m.fork, stream), "FlashInfer fork"));
    NIB_RETURN_IF_ERROR(cuda_status(cudaStreamWaitEvent(m.side, m.fork, 0), "FlashInfer fork"));
  }
  if (m.fa2_requests > 0)
    NIB_RETURN_IF_ERROR(m.shape.kv_fp8 ? m.run_fa2<glue::Fp8>(q, k_cache, v_cache, out, fa2_stream, k_scale, v_scale)
                                       : m.run_fa2<__nv_bfloat16>(q, k_cache, v_cache, out, fa2_stream));
  if (m.runs_sm90())
    NIB_RETURN_IF_ERROR(
        m.run_sm90(q, static_cast<const uint16_t*>(k_cache), static_cast<const uint16_t*>(v_cache), out, stream));
  if (overlap) {
    NIB_RETURN_IF_ERROR(cuda_status(cudaEventRecord(m.join, m.side), "FlashInfer join"));
    NIB_RETURN_IF_ERROR(cuda_status(cudaStreamWaitEvent(stream, m.join, 0), "FlashInfer join"));
  }
  return Status::ok();
}

}  // namespace nibble::cuda
