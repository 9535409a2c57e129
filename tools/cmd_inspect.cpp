// `nibble inspect DIR [--json]`: what a checkpoint is (architecture, shapes, quant config, the format
// of every module kind), what it costs (parameters, bytes on disk, bytes read per decoded token),
// and every problem found. Exit status 1 when there are problems.
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "io/binding.h"
#include "tools/command.h"

namespace nibble::tools {
namespace {

using json = nlohmann::json;

// "model.layers.3.mlp.experts.17.up_proj" → "model.layers.*.mlp.experts.*.up_proj"
std::string module_role(const std::string& name) {
  static const std::regex index(R"(\.\d+(\.|$))");
  return std::regex_replace(std::regex_replace(name, index, ".*$1"), index, ".*$1");
}

json describe(const std::string& dir) {
  json report = {{"path", dir}, {"problems", json::array()}};
  std::ifstream in(dir + "/config.json");
  std::stringstream text;
  text << in.rdbuf();
  Result<io::ModelConfig> config = io::parse_model_config(text.str(), dir + "/config.json");
  if (!in) config = Status::error(dir + "/config.json: cannot open");
  Result<io::QuantConfig> quant = io::load_quant_config(dir, text.str());
  if (!config) report["problems"].push_back(config.status().message());
  if (!quant) report["problems"].push_back(quant.status().message());
  Result<io::SafetensorsReader> reader = io::SafetensorsReader::open(dir);
  if (!reader) report["problems"].push_back(reader.status().message());
  if (reader) {
    report["files"] = reader->files().size();
    report["bytes_on_disk"] = reader->total_file_bytes();
    report["tensors"] = reader->tensors().size();
  }
  if (!config || !quant) return report;

  const io::ModelConfig& c = *config;
  report["architecture"] = c.architecture;
  report["shape"] = {{"layers", c.num_hidden_layers},
                     {"hidden", c.hidden_size},
                     {"heads", c.num_attention_heads},
                     {"kv_heads", c.num_key_value_heads},
                     {"head_dim", c.head_dim},
                     {"vocab", c.vocab_size},
                     {"experts", c.num_experts},
                     {"experts_per_token", c.num_experts_per_tok},
                     {"moe_intermediate", c.moe_intermediate_size},
                     {"intermediate", c.intermediate_size},
                     {"rope_theta", c.rope_theta},
                     {"max_positions", c.max_position_embeddings},
                     {"tied_embeddings", c.tie_word_embeddings},
                     {"shared_experts", c.moe_num_shared_experts},
                     {"qk_norm", c.qk_norm},
                     {"rope_style", c.rope_style == io::RopeStyle::INTERLEAVED ? "interleaved" : "neox"}};
  json moe_layers = json::array();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    if (c.is_moe_layer(l)) moe_layers.push_back(l);
  report["shape"]["moe_layers"] = moe_layers;
  report["quantization"] = quant->nvfp4 ? json{{"algorithm", "NVFP4"},
                                               {"group_size", quant->group_size},
                                               {"source", quant->source},
                                               {"producer", quant->producer},
                                               {"exclude_modules", quant->exclude_modules},
                                               {"kv_cache", quant->kv_cache_fp8 ? "FP8" : "none"}}
                                        : json{{"algorithm", "none (BF16)"}};
  const auto modules = io::plan_modules(c, *quant);
  std::map<std::string, json> roles;
  for (const io::ModuleSpec& m : modules) {
    json& r = roles[module_role(m.name)];
    if (r.is_null()) r = {{"count", 0}, {"bytes", uint64_t{0}}, {"formats", json::object()}};
    const std::string format = m.quantized ? "NVFP4" : std::string(dtype_name(m.dtype));
    r["count"] = r["count"].get<int>() + 1;
    r["bytes"] = r["bytes"].get<uint64_t>() + m.nbytes();
    r["shape"] = m.shape;
    r["formats"][format] = r["formats"].value(format, 0) + 1;
  }
  report["modules"] = roles;
  report["parameters"] = io::parameter_count(modules);
  report["bytes_per_decoded_token"] = io::bytes_per_decoded_token(c, modules);
  if (reader) {
    Result<io::BoundCheckpoint> bound = io::bind_checkpoint(*reader, c, *quant);
    if (!bound)
      report["problems"].push_back(bound.status().message());
    else
      report["experts_with_split_gate_up_scale"] = bound->experts_with_split_gate_up_scale;
  }
  return report;
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 4) v /= 1000, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", v, units[u]);
  return buf;
}

void print_text(const json& r) {
  std::printf("checkpoint   %s\n", r["path"].get<std::string>().c_str());
  if (r.contains("architecture")) {
    const json& s = r["shape"];
    std::printf("architecture %s: %lld layers, hidden %lld, heads %lld/%lld (head_dim %lld), vocab %lld\n",
                r["architecture"].get<std::string>().c_str(), s["layers"].get<long long>(),
                s["hidden"].get<long long>(), s["heads"].get<long long>(), s["kv_heads"].get<long long>(),
                s["head_dim"].get<long long>(), s["vocab"].get<long long>());
    if (s["experts"].get<long long>() > 0) {
      std::printf("             MoE: %lld experts, top-%lld, moe_intermediate %lld", s["experts"].get<long long>(),
                  s["experts_per_token"].get<long long>(), s["moe_intermediate"].get<long long>());
      if (s["shared_experts"].get<long long>() > 0) std::printf(", %lld shared", s["shared_experts"].get<long long>());
      std::printf(", in %zu of %lld layers\n", s["moe_layers"].size(), s["layers"].get<long long>());
    }
    std::printf("             RoPE %s (theta %g)%s\n", s["rope_style"].get<std::string>().c_str(),
                s["rope_theta"].get<double>(), s["qk_norm"].get<bool>() ? ", q/k norm" : "");
    const json& q = r["quantization"];
    std::printf("quantization %s", q["algorithm"].get<std::string>().c_str());
    if (q.contains("source"))
      std::printf(" (group %d) from %s, producer '%s', %zu exclusion pattern(s)", q["group_size"].get<int>(),
                  q["source"].get<std::string>().c_str(), q["producer"].get<std::string>().c_str(),
                  q["exclude_modules"].size());
    if (q.value("kv_cache", "none") == "FP8") std::printf("; FP8 KV-cache scales (k_proj.k_scale, v_proj.v_scale)");
    std::printf("\nmodules\n");
    for (const auto& [role, m] : r["modules"].items()) {
      std::string formats;
      for (const auto& [f, n] : m["formats"].items())
        formats += (formats.empty() ? "" : ", ") + f + " x" + std::to_string(n.get<int>());
      std::printf("  %-48s %-16s %-12s %10s\n", role.c_str(), m["shape"].dump().c_str(), formats.c_str(),
                  human_bytes(m["bytes"].get<uint64_t>()).c_str());
    }
    std::printf("parameters   %llu (%.3f B)\n", static_cast<unsigned long long>(r["parameters"].get<uint64_t>()),
                r["parameters"].get<uint64_t>() / 1e9);
    std::printf("per token    %s read per decoded token\n",
                human_bytes(r["bytes_per_decoded_token"].get<uint64_t>()).c_str());
  }
  if (r.contains("bytes_on_disk"))
    std::printf("on disk      %s in %zu file(s), %zu tensors\n",
                human_bytes(r["bytes_on_disk"].get<uint64_t>()).c_str(), r["files"].get<size_t>(),
                r["tensors"].get<size_t>());
  if (r.value("experts_with_split_gate_up_scale", 0) > 0)
    std::printf("note         %d experts have different gate/up weight_scale_2 (kept exact)\n",
                r["experts_with_split_gate_up_scale"].get<int>());
  if (r["problems"].empty()) std::printf("problems     none\n");
  for (const auto& p : r["problems"]) std::printf("problem      %s\n", p.get<std::string>().c_str());
}

}  // namespace

CommandRunner register_inspect(CLI::App& root) {
  auto* cmd = root.add_subcommand("inspect", "Describe a checkpoint folder and report every problem in it");
  auto dir = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  cmd->add_option("dir", *dir, "Model folder (config.json, safetensors, quant config)")->required();
  cmd->add_flag("--json", *as_json, "Print the report as JSON");
  return [dir, as_json] {
    const json report = describe(*dir);
    if (*as_json)
      std::printf("%s\n", report.dump(2).c_str());
    else
      print_text(report);
    return report["problems"].empty() ? 0 : 1;
  };
}

}  // namespace nibble::tools
