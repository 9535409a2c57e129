// The CPU model registry: Hugging Face architecture name → factory (the GPU one: cuda_registry.cpp).
#include <map>

#include "models/model.h"
#include "models/decoder_cpu.h"

namespace nibble::models {

Result<std::unique_ptr<Model>> create_model(std::shared_ptr<const io::LoadedCheckpoint> checkpoint,
                                            const ModelOptions& options) {
  using Factory = Result<std::unique_ptr<Model>> (*)(std::shared_ptr<const io::LoadedCheckpoint>, const ModelOptions&);
  static const std::map<std::string, Factory> factories = {
      {"Qwen3MoeForCausalLM", &create_decoder_cpu},
      {"Qwen3ForCausalLM", &create_decoder_cpu},
      {"Ernie4_5_MoeForCausalLM", &create_decoder_cpu},  // the same decoder, with ERNIE's config features
  };
  const std::string& arch = checkpoint->bound.config.architecture;
  auto it = factories.find(arch);
  if (it == factories.end()) return Status::error("no model implementation for architecture '" + arch + "'");
  return it->second(std::move(checkpoint), options);
}

}  // namespace nibble::models
