// keep_rank_slices (binding.h): each placed module's tensors cut to the rank's range; the checks
// that the dimensions split are io::partition's.
#include <algorithm>
#include <cstring>

#include "io/binding.h"

namespace nibble::io {
namespace {

// The slice [begin, end) of dimension `dim` of a 2-d tensor: rows are a view, columns a copy.
TensorRef cut(const TensorRef& t, int dim, int64_t begin, int64_t end, std::vector<std::vector<uint8_t>>& storage) {
  TensorRef out = t;
  const int64_t rows = t.shape[0], cols = t.shape.size() > 1 ? t.shape[1] : 1;
  const int64_t bytes = static_cast<int64_t>(dtype_size(t.dtype));
  if (dim == 0) {
    out.data = t.data + begin * cols * bytes;
    out.shape[0] = end - begin;
    return out;
  }
  std::vector<uint8_t>& copy = storage.emplace_back(static_cast<size_t>(rows * (end - begin) * bytes));
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(copy.data() + r * (end - begin) * bytes, t.data + (r * cols + begin) * bytes,
                static_cast<size_t>((end - begin) * bytes));
  out.data = copy.data();
  out.shape[1] = end - begin;
  return out;
}

}  // namespace

Status keep_rank_slices(LoadedCheckpoint& checkpoint, const ParallelConfig& parallel) {
  checkpoint.parallel = parallel;
  if (parallel.size == 1 && parallel.rank == 0) return Status::ok();
  BoundCheckpoint& b = checkpoint.bound;
  auto plan = partition(b.config, b.quant, parallel);
  if (!plan) return plan.status();
  std::map<std::string, const TensorSlice*> slices;
  for (const TensorSlice& s : plan->slices) slices[s.tensor.name] = &s;
  auto narrow = [&](const std::string& tensor, TensorRef& ref) {
    auto it = slices.find(tensor);
    if (it == slices.end()) return Status::error("the rank plan has no slice of " + tensor);
    const TensorSlice& s = *it->second;
    if (s.dim >= 0) ref = cut(ref, s.dim, s.begin, s.end, checkpoint.slice_storage);
    return Status::ok();
  };
  for (const auto& [name, lw] : b.linears) {  // before other ranks' experts are dropped
    if (!parallel.expert_parallel || lw.module.expert < 0) continue;
    LoadedCheckpoint::ExpertInputScales& s = checkpoint.all_experts_input_scales[lw.module.layer];
    float& max = lw.module.role == ModuleRole::EXPERT_DOWN ? s.down : s.gate_up;
    max = std::max(max, lw.input_scale);
  }
  std::map<std::string, LinearWeights> linears;
  std::vector<ModuleSpec> modules;
  for (const RankModule& placed : plan->modules) {
    const ModuleSpec& m = placed.module;
    modules.push_back(m);
    checkpoint.rank_modules[m.name] = placed;
    const std::vector<TensorSpec> specs = m.tensors();
    if (m.kind != ModuleKind::LINEAR) {
      auto it = b.tensors.find(specs[0].name);
      if (it != b.tensors.end()) NIB_RETURN_IF_ERROR(narrow(specs[0].name, it->second));
      continue;
    }
    auto it = b.linears.find(m.name);
    if (it == b.linears.end()) continue;  // a module bind keeps no weights for (none so far)
    LinearWeights lw = it->second;
    lw.module = m;
    NIB_RETURN_IF_ERROR(narrow(specs[0].name, lw.weight));
    if (m.quantized) NIB_RETURN_IF_ERROR(narrow(specs[1].name, lw.weight_scale));
    linears[m.name] = std::move(lw);
  }
  b.linears = std::move(linears);
  b.modules = std::move(modules);
  return Status::ok();
}

}  // namespace nibble::io
