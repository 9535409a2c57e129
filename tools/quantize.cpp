// Checkpoint quantization. Sharing follows nvidia-modelopt 0.47's export: q/k/v share one
// weight_scale_2 and one input_scale (the max of theirs), as do a dense MLP's gate/up and each
// expert's gate/up weights; with transformers' fused experts ModelOpt keeps one input quantizer per
// MoE layer for all experts' gate/up inputs and one for all down inputs
// (modelopt/torch/quantization/plugins/huggingface.py, _QuantFusedExperts), and so does nibble.
#include "tools/quantize.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/parallel.h"
#include "formats/bf16.h"
#include "formats/nvfp4.h"
#include "formats/nvfp4_block.h"
#include "io/binding.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "text/tokenizer.h"
#include "tools/calibration_text.h"

namespace nibble::tools {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Which modules share an input (and so an input_scale): the key of the group a module belongs to.
std::string input_group(const io::ModuleSpec& m) {
  const std::string leaf = m.name.substr(m.name.rfind('.') + 1);
  const std::string layer = "model.layers." + std::to_string(m.layer) + ".";
  if (m.expert >= 0) return layer + (leaf == "down_proj" ? "experts.down" : "experts.gate_up");
  if (leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj") return layer + "qkv";
  if (leaf == "gate_proj" || leaf == "up_proj") return layer + "mlp.gate_up";
  return m.name;
}

// Which modules share weight_scale_2: q/k/v, and gate/up of one MLP or one expert.
std::string weight_group(const io::ModuleSpec& m) {
  const std::string stem = m.name.substr(0, m.name.rfind('.') + 1);
  const std::string leaf = m.name.substr(m.name.rfind('.') + 1);
  if (leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj") return stem + "qkv";
  if (leaf == "gate_proj" || leaf == "up_proj") return stem + "gate_up";
  return m.name;
}

// Calibration sequences: token ids from --calib-ids; else text (--calib FILE, or the built-in
// text) encoded with the model's tokenizer, split at blank lines and cut into sequences of at most
// calib_length tokens; random ids only when the folder has no tokenizer.
Result<std::vector<std::vector<int32_t>>> calibration_ids(const QuantizeOptions& o, int64_t vocab,
                                                          std::string& source) {
  std::vector<std::vector<int32_t>> seqs;
  if (!o.calib_ids_file.empty()) {
    std::ifstream in(o.calib_ids_file);
    const json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_array() || j.empty())
      return Status::error(o.calib_ids_file + ": expected a JSON list of token-id lists");
    for (const json& seq : j) {
      if (!seq.is_array() || seq.empty())
        return Status::error(o.calib_ids_file + ": every entry must be a non-empty list");
      std::vector<int32_t> ids;
      for (const json& id : seq) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab)
          return Status::error(o.calib_ids_file + ": token id " + id.dump() + " is not in [0, " +
                               std::to_string(vocab) + ")");
        ids.push_back(id.get<int32_t>());
      }
      seqs.push_back(std::move(ids));
    }
    source = o.calib_ids_file;
    return seqs;
  }
  auto tokenizer = text::Tokenizer::load(o.in_dir);
  if (!tokenizer && !o.calib_file.empty())
    return Status::error("--calib needs the model's tokenizer: " + tokenizer.status().message());
  if (!tokenizer) {
    std::mt19937_64 rng(o.calib_seed);
    for (int64_t s = 0; s < o.calib_sequences; ++s) {
      std::vector<int32_t> ids(static_cast<size_t>(o.calib_length));
      for (auto& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
      seqs.push_back(std::move(ids));
    }
    source = "random token ids (no tokenizer.json in " + o.in_dir + ")";
    return seqs;
  }
  std::string text = BUILTIN_CALIBRATION_TEXT;
  source = "built-in text";
  if (!o.calib_file.empty()) {
    std::ifstream in(o.calib_file, std::ios::binary);
    if (!in) return Status::error(o.calib_file + ": cannot open");
    std::stringstream buf;
    buf << in.rdbuf();
    text = buf.str();
    source = o.calib_file;
  }
  size_t pos = 0;
  while (pos < text.size() && static_cast<int64_t>(seqs.size()) < o.calib_sequences) {
    size_t end = text.find("\n\n", pos);
    if (end == std::string::npos) end = text.size();
    const std::vector<int32_t> ids = (*tokenizer)->encode(text.substr(pos, end - pos), /*parse_special=*/false);
    for (size_t b = 0; b < ids.size() && static_cast<int64_t>(seqs.size()) < o.calib_sequences; b += o.calib_length) {
      std::vector<int32_t> chunk(ids.begin() + static_cast<long>(b),
                                 ids.begin() + static_cast<long>(std::min(ids.size(), b + o.calib_length)));
      std::erase_if(chunk, [&](int32_t id) { return id >= vocab; });
      if (!chunk.empty()) seqs.push_back(std::move(chunk));
    }
    pos = end + 2;
  }
  if (seqs.empty()) return Status::error(source + ": no calibration text");
  return seqs;
}

// Runs the BF16 model (activations in fp32) over the calibration sequences; returns the amax of
// every Linear's input, by module name.
Result<std::map<std::string, float>> calibrate(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                               const std::vector<std::vector<int32_t>>& seqs, int64_t& n_tokens) {
  std::map<std::string, float> amax;
  std::mutex mutex;
  models::ModelOptions options;
  options.input_observer = [&](const std::string& module, const float* x, int64_t rows, int64_t width) {
    float m = 0.0f;
    for (int64_t i = 0; i < rows * width; ++i) m = std::max(m, std::fabs(x[i]));
    std::lock_guard<std::mutex> lock(mutex);
    float& slot = amax[module];
    slot = std::max(slot, m);
  };
  Result<std::unique_ptr<models::Model>> model = models::create_model(checkpoint, options);
  if (!model) return model.status();
  n_tokens = 0;
  for (const auto& ids : seqs) {
    const int64_t block = 16, n_blocks = (static_cast<int64_t>(ids.size()) + block - 1) / block;
    models::KvCache cache((*model)->config(), n_blocks, block);
    models::Batch batch;
    batch.token_ids = ids;
    models::BatchSequence seq;
    for (int32_t b = 0; b < n_blocks; ++b) seq.block_table.push_back(b);
    seq.n_tokens = static_cast<int64_t>(ids.size());
    batch.sequences = {seq};
    std::vector<float> logits;
    NIB_RETURN_IF_ERROR((*model)->forward(batch, cache, logits));
    n_tokens += seq.n_tokens;
  }
  return amax;
}

std::vector<float> widen_bf16(const io::TensorRef& t) {
  size_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  std::vector<float> out(n);
  const auto* p = reinterpret_cast<const uint16_t*>(t.data);
  for (size_t i = 0; i < n; ++i) out[i] = formats::bf16_decode(p[i]);
  return out;
}

Status write_json(const fs::path& path, const json& j) {
  std::ofstream out(path);
  out << j.dump(4) << "\n";
  return out ? Status::ok() : Status::error(path.string() + ": cannot write");
}

}  // namespace

Result<QuantizeReport> quantize_checkpoint(const QuantizeOptions& o) {
  Result<std::unique_ptr<io::LoadedCheckpoint>> loaded = io::load_checkpoint(o.in_dir);
  if (!loaded) return loaded.status();
  std::shared_ptr<const io::LoadedCheckpoint> input = std::move(loaded.value());
  const io::ModelConfig& config = input->bound.config;
  if (input->bound.quant.nvfp4)
    return Status::error(o.in_dir + ": already quantized (" + input->bound.quant.source + ")");

  // ModelOpt's default NVFP4 config leaves the lm_head and the MoE routers in BF16; its export also
  // lists the embedding.
  io::QuantConfig quant;
  quant.nvfp4 = true;
  quant.exclude_modules = o.exclude;
  if (quant.exclude_modules.empty()) quant.exclude_modules = {"lm_head", "model.embed_tokens"};
  // Routers stay BF16 whatever --exclude says: nibble (like vLLM and SGLang) serves only BF16 routers.
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string router = "model.layers." + std::to_string(l) + ".mlp.gate";
    if (config.is_moe_layer(l) && quant.is_quantized(router)) quant.exclude_modules.push_back(router);
  }
  const std::vector<io::ModuleSpec> modules = io::plan_modules(config, quant);

  QuantizeReport report;
  Result<std::vector<std::vector<int32_t>>> seqs = calibration_ids(o, config.vocab_size, report.calibration_source);
  if (!seqs) return seqs.status();
  Result<std::map<std::string, float>> amax = calibrate(input, *seqs, report.calibration_tokens);
  if (!amax) return amax.status();
  std::map<std::string, float> group_amax;
  for (const io::ModuleSpec& m : modules) {
    if (!m.quantized) continue;
    auto it = amax->find(m.name);
    float& g = group_amax[input_group(m)];
    g = std::max(g, it == amax->end() ? 0.0f : it->second);
  }
  for (const auto& [group, a] : group_amax)
    if (!(a > 0.0f))
      return Status::error("calibration never reached the inputs of " + group +
                           " (use more or longer --calib sequences)");

  // Weight groups sharing weight_scale_2, quantized in parallel.
  std::map<std::string, std::vector<const io::ModuleSpec*>> groups;
  std::vector<io::TensorSpec> tensors;
  for (const io::ModuleSpec& m : modules) {
    for (io::TensorSpec& t : m.tensors()) {
      // Copied tensors keep the input's dtype (an fp32 parameter may be stored in BF16).
      if (!m.quantized)
        if (const io::SafetensorsReader::Entry* e = input->reader.find(t.name)) t.dtype = e->info->dtype;
      tensors.push_back(std::move(t));
    }
    if (m.kind == io::ModuleKind::LINEAR && m.quantized)
      groups[weight_group(m)].push_back(&m);
    else if (m.kind == io::ModuleKind::LINEAR)
      ++report.excluded_modules;
  }
  auto writer = io::ShardedWriter::create(o.out_dir, tensors, o.shard_bytes, {{"format", "pt"}});
  if (!writer) return writer.status();
  for (const auto& t : tensors) report.total_bytes += t.nbytes();

  std::vector<const std::vector<const io::ModuleSpec*>*> work;
  for (const auto& [key, members] : groups) work.push_back(&members);
  std::vector<Status> statuses(work.size());
  parallel_for(work.size(), [&](size_t i) {
    const auto& members = *work[i];
    std::vector<std::vector<float>> weights;
    float shared = 0.0f;
    for (const io::ModuleSpec* m : members) {
      weights.push_back(widen_bf16(input->bound.linears.at(m->name).weight));
      shared = std::max(shared, formats::weight_scale_2(weights.back()));
    }
    for (size_t j = 0; j < members.size() && statuses[i].is_ok(); ++j) {
      const io::ModuleSpec& m = *members[j];
      auto q = formats::quantize_weight(weights[j], m.shape[0], m.shape[1], m.name + ".weight", shared);
      if (!q) {
        statuses[i] = q.status();
        return;
      }
      // get_activation_scaling_factor: amax / (E2M1 max · E4M3 max)
      const float input_scale = group_amax.at(input_group(m)) / formats::NVFP4_SCALE_RANGE;
      uint8_t scalars[8];
      std::memcpy(scalars, &q->scale, 4);
      std::memcpy(scalars + 4, &input_scale, 4);
      Status s = (*writer)->write(m.name + ".weight", q->packed);
      if (s) s = (*writer)->write(m.name + ".weight_scale", q->block_scales);
      if (s) s = (*writer)->write(m.name + ".weight_scale_2", {scalars, 4});
      if (s) s = (*writer)->write(m.name + ".input_scale", {scalars + 4, 4});
      statuses[i] = s;
    }
  });
  for (const Status& s : statuses) NIB_RETURN_IF_ERROR(s);
  for (const auto& [key, members] : groups) report.quantized_modules += members.size();

  // Unquantized tensors are copied as they are.
  for (const io::ModuleSpec& m : modules) {
    if (m.kind == io::ModuleKind::LINEAR && m.quantized) continue;
    const std::string name = m.tensors()[0].name;
    const io::SafetensorsReader::Entry* e = input->reader.find(name);
    NIB_RETURN_IF_ERROR((*writer)->write(name, input->reader.data(*e)));
  }
  NIB_RETURN_IF_ERROR((*writer)->finish());

  // Configs: the input config.json plus quantization_config, and hf_quant_config.json.
  std::ifstream config_in(o.in_dir + "/config.json");
  json config_json = json::parse(config_in, nullptr, false);
  const json producer = {{"name", "nibble"}, {"version", "0.1.0"}};
  const json group = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", 16}};
  config_json["quantization_config"] = {
      {"config_groups", {{"group_0", {{"input_activations", group}, {"weights", group}, {"targets", {"Linear"}}}}}},
      {"ignore", quant.exclude_modules},
      {"quant_algo", "NVFP4"},
      {"producer", producer},
      {"quant_method", "modelopt"}};
  const fs::path out(o.out_dir);
  NIB_RETURN_IF_ERROR(write_json(out / "config.json", config_json));
  NIB_RETURN_IF_ERROR(write_json(out / "hf_quant_config.json", {{"producer", producer},
                                                                {"quantization",
                                                                 {{"quant_algo", "NVFP4"},
                                                                  {"kv_cache_quant_algo", nullptr},
                                                                  {"group_size", 16},
                                                                  {"exclude_modules", quant.exclude_modules}}}}));
  for (const char* file :
       {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    std::error_code ec;
    if (fs::exists(fs::path(o.in_dir) / file))
      fs::copy_file(fs::path(o.in_dir) / file, out / file, fs::copy_options::overwrite_existing, ec);
    if (ec) return Status::error(std::string(file) + ": cannot copy: " + ec.message());
  }
  return report;
}

}  // namespace nibble::tools
