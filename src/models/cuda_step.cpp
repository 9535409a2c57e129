// StepInputs (cuda_step.h): the step block's layout, the batch checks and the staging.
#include "models/cuda_step.h"

#include <algorithm>
#include <string>

#include "cuda/attention/attention.cuh"
#include "cuda/common/check.cuh"

namespace nibble::models {
namespace {

// Where each array of a step's metadata sits in its block, for a step of T tokens (the padded size
// for a graph): fixed by T, so a graph's captured pointers hold for every replay of its size; the
// block tables last, so a step copies only the rows of its sequences (and the padding row).
class StepLayout {
 public:
  StepLayout(int64_t T, int64_t max_blocks_per_seq) : T_(size_t(T)), per_seq_(size_t(max_blocks_per_seq)) {}
  int32_t* ids(uint8_t* b) const { return reinterpret_cast<int32_t*>(b); }
  int32_t* positions(uint8_t* b) const { return ids(b) + T_; }
  int32_t* token_seq(uint8_t* b) const { return positions(b) + T_; }
  int32_t* rows(uint8_t* b) const { return token_seq(b) + T_; }  // (logits rows: at most T)
  int32_t* decode_rows(uint8_t* b) const { return rows(b) + T_; }
  int64_t* slots(uint8_t* b) const { return reinterpret_cast<int64_t*>(b + align16(5 * 4 * T_)); }
  int4* items(uint8_t* b) const { return reinterpret_cast<int4*>(b + items_at()); }
  int32_t* block_tables(uint8_t* b) const { return reinterpret_cast<int32_t*>(b + items_at() + 16 * T_); }
  // The bytes up to the end of S sequences' block tables and the padding row, or up to the tables'
  // start (a step whose attention does not read them).
  size_t bytes(int64_t S, bool tables) const {
    return items_at() + 16 * T_ + (tables ? (size_t(S) + 1) * per_seq_ * 4 : 0);
  }

 private:
  static size_t align16(size_t n) { return (n + 15) / 16 * 16; }
  size_t items_at() const { return align16(align16(5 * 4 * T_) + 8 * T_); }
  size_t T_, per_seq_;
};

}  // namespace

Status StepInputs::init(const StepLimits& limits, cuda::DeviceArena& arena) {
  limits_ = limits;
  const size_t bytes = StepLayout(limits.max_tokens, limits.max_blocks_per_seq).bytes(limits.max_seqs, true);
  NIB_RETURN_IF_ERROR(arena.alloc(device_block_, bytes, "the step metadata"));
  for (cuda::PinnedArray<uint8_t>& h : host_blocks_) NIB_RETURN_IF_ERROR(h.resize(bytes, "the step metadata"));
  return Status::ok();
}

Status StepInputs::check(const Batch& batch) const {
  const StepLimits& o = limits_;
  const int64_t T = static_cast<int64_t>(batch.token_ids.size());
  if (T < 1 || T > o.max_tokens)
    return Status::error("batch: " + std::to_string(T) + " tokens (this runner takes 1 to " +
                         std::to_string(o.max_tokens) + ")");
  if (static_cast<int64_t>(batch.logits_rows.size()) > std::min(o.max_rows, T))
    return Status::error("batch: more than " + std::to_string(std::min(o.max_rows, T)) + " rows want logits");
  if (static_cast<int64_t>(batch.sequences.size()) > o.max_seqs)
    return Status::error("batch: more than " + std::to_string(o.max_seqs) + " sequences");
  int64_t total = 0;
  for (const BatchSequence& s : batch.sequences) {
    if (s.n_tokens <= 0 || s.start_position < 0) return Status::error("batch: a sequence has no tokens");
    if (s.start_position + s.n_tokens > static_cast<int64_t>(s.block_table.size()) * o.block_size)
      return Status::error("batch: a sequence's block table is too short for its positions");
    if (static_cast<int64_t>(s.block_table.size()) > o.max_blocks_per_seq)
      return Status::error("batch: a block table is longer than the model's context length allows");
    for (int32_t block : s.block_table)
      if (block < 0 || block >= n_blocks_) return Status::error("batch: block id out of range");
    total += s.n_tokens;
  }
  if (total != T) return Status::error("batch: sequence token counts do not add up to the token ids");
  for (int32_t id : batch.token_ids)
    if (is_pending_token(id) ? pending_row(id) >= o.max_rows : id >= o.vocab_size)
      return Status::error("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                           std::to_string(o.vocab_size) + ") and names no row a step draws");
  for (int64_t r : batch.logits_rows)
    if (r < 0 || r >= T) return Status::error("batch: logits row out of range");
  return Status::ok();
}

Status StepInputs::stage(const Batch& batch, int64_t T, int64_t n_rows, bool eager,
                         cuda::FlashInferAttention* flashinfer, cudaStream_t stream, bool long_context) {
  const int64_t S = static_cast<int64_t>(batch.sequences.size()), bs = limits_.block_size;
  const int64_t per_seq = limits_.max_blocks_per_seq;
  host_parity_ ^= 1;
  const StepLayout layout(T, per_seq);
  uint8_t* host = host_blocks_[host_parity_].data();
  int32_t *h_ids = layout.ids(host), *h_positions = layout.positions(host), *h_token_seq = layout.token_seq(host);
  int32_t *h_block_tables = layout.block_tables(host), *h_rows = layout.rows(host);
  int32_t* h_decode_rows = layout.decode_rows(host);
  int64_t* h_slots = layout.slots(host);
  int4* h_items = layout.items(host);
  StagedStep& st = staged_;
  st.ids = layout.ids(device_block_), st.positions = layout.positions(device_block_);
  st.token_seq = layout.token_seq(device_block_), st.block_tables = layout.block_tables(device_block_);
  st.rows = layout.rows(device_block_), st.decode_rows = layout.decode_rows(device_block_);
  st.slots = layout.slots(device_block_), st.items = layout.items(device_block_);
  const int64_t G = limits_.query_heads_per_kv;
  int64_t t = 0;
  st.max_keys = 0;
  // Prefill chunks go to the tensor-core attention in items; decode tokens to the per-token
  // split-KV kernel, or (from tensor_core_decode_min_rows of them) one item each, graph padding
  // included. A graph's choice depends on its size only (its rows are all decode or padding).
  const bool supported = cuda::prefill_attention_supported(limits_.head_dim, G);
  int64_t decode_count = T - static_cast<int64_t>(batch.token_ids.size());
  for (const BatchSequence& seq : batch.sequences) decode_count += seq.n_tokens == 1;
  // Decode-only steps (graph padding rows are decode rows) of few rows: the one-launch kernel.
  st.one_launch = T <= limits_.one_launch_max_rows && !long_context;
  for (const BatchSequence& seq : batch.sequences)
    st.one_launch &= seq.n_tokens == 1 && seq.start_position + 1 <= limits_.one_launch_max_keys;
  // Else FlashInfer takes the whole step, graph padding included (one key in the trash block each).
  if (flashinfer && !st.one_launch) {
    flashinfer->clear();
    for (const BatchSequence& seq : batch.sequences)
      NIB_RETURN_IF_ERROR(flashinfer->add(seq.n_tokens, seq.start_position + seq.n_tokens, seq.block_table.data()));
    for (int64_t row = static_cast<int64_t>(batch.token_ids.size()); row < T; ++row)
      NIB_RETURN_IF_ERROR(flashinfer->add(1, 1, &trash_block_));
    NIB_RETURN_IF_ERROR(flashinfer->plan(!eager, stream));
  }
  const bool decode_items = !flashinfer && supported && decode_count >= limits_.tensor_core_decode_min_rows;
  st.lists = !flashinfer && supported && (eager || decode_items);
  st.n_items = st.n_decode = 0;
  if (st.lists) {
    const int64_t per_item = cuda::prefill_item_tokens(G);
    int64_t row = 0;
    for (int64_t s = 0; s < S; ++s) {
      const BatchSequence& seq = batch.sequences[static_cast<size_t>(s)];
      if (seq.n_tokens == 1 && !decode_items) {
        h_decode_rows[st.n_decode++] = static_cast<int32_t>(row);
      } else {
        for (int64_t i = 0; i < seq.n_tokens; i += per_item)
          h_items[st.n_items++] = make_int4(static_cast<int>(s), static_cast<int>(row + i),
                                            static_cast<int>(std::min(per_item, seq.n_tokens - i)),
                                            static_cast<int>(seq.start_position + i));
      }
      row += seq.n_tokens;
    }
    if (decode_items)  // padding rows: the trash sequence S, one key at position 0
      for (; row < T; ++row) h_items[st.n_items++] = make_int4(static_cast<int>(S), static_cast<int>(row), 1, 0);
  }
  // Only the native attention kernels and the one-launch decode attention read the block tables;
  // FlashInfer reads the page indices its plan uploaded. A table row is the context length /
  // block_size entries (10 KB for Qwen3's 40,960 positions): 2.6 MB a 256-sequence step, copied
  // ahead of the step's kernels, for nothing on FlashInfer's steps.
  const bool tables_read = !flashinfer || st.one_launch;
  for (int64_t s = 0; s < S; ++s) {
    const BatchSequence& seq = batch.sequences[static_cast<size_t>(s)];
    const int32_t* table = seq.block_table.data();
    if (tables_read) std::copy(seq.block_table.begin(), seq.block_table.end(), h_block_tables + s * per_seq);
    for (int64_t i = 0; i < seq.n_tokens; ++i, ++t) {
      const int64_t p = seq.start_position + i;
      st.max_keys = std::max(st.max_keys, p + 1);
      h_ids[t] = batch.token_ids[static_cast<size_t>(t)];
      h_positions[t] = static_cast<int32_t>(p);
      h_token_seq[t] = static_cast<int32_t>(s);
      h_slots[t] = int64_t{table[p / bs]} * bs + p % bs;
    }
  }
  if (tables_read) h_block_tables[S * per_seq] = trash_block_;
  for (; t < T; ++t)
    h_ids[t] = 0, h_positions[t] = 0, h_token_seq[t] = static_cast<int32_t>(S), h_slots[t] = int64_t{trash_block_} * bs;
  // Rows past the batch's own (graph padding) read their own token.
  const int64_t R = static_cast<int64_t>(batch.logits_rows.size());
  for (int64_t r = 0; r < n_rows; ++r)
    h_rows[r] = static_cast<int32_t>(r < R ? batch.logits_rows[static_cast<size_t>(r)] : r);
  return cuda::cuda_status(
      cudaMemcpyAsync(device_block_, host, layout.bytes(S, tables_read), cudaMemcpyHostToDevice, stream),
      "step metadata");
}

}  // namespace nibble::models
