// partition (partition.h): the dimension checks first, then each module's split and its tensors'
// slices, from plan_modules' full list.
#include "io/partition.h"

#include "formats/nvfp4_block.h"

namespace nibble::io {

namespace {

// Every dimension that must divide by the rank count, each failure named.
std::vector<std::string> split_problems(const ModelConfig& c, const QuantConfig& q, const ParallelConfig& p) {
  std::vector<std::string> problems;
  const int64_t n = p.size;
  const std::string across = " across " + std::to_string(n) + " ranks";
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) problems.push_back(what + across);
  };
  const int64_t nkv = c.num_key_value_heads;
  need(c.num_attention_heads % n == 0,
       "num_attention_heads " + std::to_string(c.num_attention_heads) + " does not split");
  need(nkv % n == 0 || n % nkv == 0,
       "num_key_value_heads " + std::to_string(nkv) + " neither splits nor replicates evenly (one divides the other)");
  need(c.vocab_size % n == 0, "vocab_size " + std::to_string(c.vocab_size) + " does not split");
  // A row-parallel NVFP4 linear's input columns split in whole 16-value blocks.
  auto width = [&](const char* name, int64_t w) {
    need(w % n == 0 && (!q.nvfp4 || (w / n) % formats::NVFP4_BLOCK == 0),
         std::string(name) + " " + std::to_string(w) + " does not split into multiples of " +
             std::to_string(formats::NVFP4_BLOCK) + " (NVFP4 blocks)");
  };
  bool any_dense = false;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) any_dense |= !c.is_moe_layer(l);
  if (any_dense) width("intermediate_size", c.intermediate_size);
  if (c.is_moe()) {
    if (p.expert_parallel)
      need(c.num_experts % n == 0, "num_experts " + std::to_string(c.num_experts) + " do not deal out evenly");
    else
      width("moe_intermediate_size", c.moe_intermediate_size);
    if (c.moe_num_shared_experts > 0)
      width("the shared experts' width", c.moe_intermediate_size * c.moe_num_shared_experts);
  }
  return problems;
}

// How a module lies on the rank, and where (a range along its split axis).
RankModule place(const ModuleSpec& m, const ModelConfig& c, const ParallelConfig& p) {
  const int64_t n = p.size, r = p.rank, D = c.head_dim;
  RankModule out{m, Split::WHOLE, 0, 0};
  auto rows = [&](int64_t begin, int64_t end) {
    out.split = Split::ROWS, out.begin = begin, out.end = end;
    out.module.shape[0] = end - begin;
  };
  auto columns = [&](int64_t begin, int64_t end) {
    out.split = Split::COLUMNS, out.begin = begin, out.end = end;
    out.module.shape[1] = end - begin;
  };
  auto even = [&](int64_t size, auto&& apply) { apply(r * size / n, (r + 1) * size / n); };
  if (n == 1) return out;
  switch (m.role) {
    case ModuleRole::Q_PROJ:  // output rows: column-parallel linears, the vocabulary-parallel ends
    case ModuleRole::MLP_GATE:
    case ModuleRole::MLP_UP:
    case ModuleRole::SHARED_GATE:
    case ModuleRole::SHARED_UP:
    case ModuleRole::EMBEDDING:
    case ModuleRole::LM_HEAD:
      even(m.shape[0], rows);
      break;
    case ModuleRole::O_PROJ:  // input columns: row-parallel linears
    case ModuleRole::MLP_DOWN:
    case ModuleRole::SHARED_DOWN:
      even(m.shape[1], columns);
      break;
    case ModuleRole::K_PROJ:
    case ModuleRole::V_PROJ:
      if (c.num_key_value_heads >= n) {
        even(m.shape[0], rows);
      } else {  // more ranks than KV heads: each rank keeps the one its query heads read
        const int64_t head = r / (n / c.num_key_value_heads);
        rows(head * D, (head + 1) * D);
      }
      break;
    case ModuleRole::EXPERT_GATE:
    case ModuleRole::EXPERT_UP:
    case ModuleRole::EXPERT_DOWN:
      if (p.expert_parallel) {
        const int64_t per = c.num_experts / n;
        if (m.expert / per != r) out.split = Split::ABSENT;
      } else if (m.role == ModuleRole::EXPERT_DOWN) {
        even(m.shape[1], columns);
      } else {
        even(m.shape[0], rows);
      }
      break;
    default:  // norms, the router and its bias
      break;
  }
  return out;
}

// The stored tensors' slices of a placed module.
void add_slices(const RankModule& placed, const ModuleSpec& full, std::vector<TensorSlice>& out) {
  if (placed.split == Split::ABSENT) return;
  for (const TensorSpec& t : full.tensors()) {
    TensorSlice s{t, -1, 0, 0};
    const bool scalar = t.shape.empty();
    if (!scalar && placed.split == Split::ROWS) {
      s.dim = 0, s.begin = placed.begin, s.end = placed.end;
    } else if (!scalar && placed.split == Split::COLUMNS) {
      // Columns of values: bytes of a packed NVFP4 weight (two a byte), blocks of its scales.
      const int64_t per = full.quantized ? (t.dtype == DType::U8 ? 2 : formats::NVFP4_BLOCK) : 1;
      s.dim = 1, s.begin = placed.begin / per, s.end = placed.end / per;
    }
    out.push_back(std::move(s));
  }
}

}  // namespace

Result<RankPlan> partition(const ModelConfig& config, const QuantConfig& quant, const ParallelConfig& parallel) {
  if (parallel.size < 1 || parallel.rank < 0 || parallel.rank >= parallel.size)
    return Status::error("rank " + std::to_string(parallel.rank) + " of " + std::to_string(parallel.size) +
                         " is not a rank of the group");
  if (parallel.size > 1) {
    const std::vector<std::string> problems = split_problems(config, quant, parallel);
    if (!problems.empty()) {
      std::string message = config.architecture + " does not split over " + std::to_string(parallel.size) + " GPUs:";
      for (const std::string& p : problems) message += "\n  " + p;
      return Status::error(message);
    }
  }
  RankPlan plan;
  for (const ModuleSpec& m : plan_modules(config, quant)) {
    RankModule placed = place(m, config, parallel);
    add_slices(placed, m, plan.slices);
    if (placed.split != Split::ABSENT) plan.modules.push_back(std::move(placed));
  }
  return plan;
}

}  // namespace nibble::io
