// The tokenizer files of a synthetic checkpoint: the real Qwen3 tokenizer for Qwen3 presets; for
// ERNIE presets a small SentencePiece BPE trained here (ERNIE ships tokenizer.model, and its real
// one cannot be downloaded), with ERNIE's special tokens and chat format.
#include "tools/synth_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "text/sentencepiece_model.h"
#include "tools/calibration_text.h"

namespace nibble::tools {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

Status write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  return out ? Status::ok() : Status::error(path.string() + ": cannot write");
}

Status copy_from_data(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  return ec ? Status::error(from.string() + ": cannot copy tokenizer file: " + ec.message()) : Status::ok();
}

// ERNIE-4.5's special tokens in transformers' Ernie4_5TokenizerFast defaults (bos, eos, unk/pad,
// cls, sep, mask); here they take ids 0-5, in SentencePiece's order.
constexpr const char* ERNIE_CONTROL[] = {"<|begin_of_sentence|>", "<|end_of_sentence|>", "<mask:1>"};

Status write_ernie_tokenizer(const fs::path& dir, const std::string& data) {
  // The calibration text line by line, plus the chat format's words, as the training corpus.
  const std::string corpus = std::string(BUILTIN_CALIBRATION_TEXT) + "\nUser: Hello\nAssistant: Hi there\n";
  auto model = text::SentencePieceModel::train_bpe(corpus, ERNIE_SYNTH_TOKENIZER_PIECES,
                                                   {std::begin(ERNIE_CONTROL), std::end(ERNIE_CONTROL)});
  if (!model) return model.status();
  NIB_RETURN_IF_ERROR(write_file(dir / "tokenizer.model", *model));
  json added = json::object();
  const char* names[] = {"<unk>", "<s>", "</s>", ERNIE_CONTROL[0], ERNIE_CONTROL[1], ERNIE_CONTROL[2]};
  for (int id = 0; id < 6; ++id) {
    added[std::to_string(id)] = {{"content", names[id]}, {"lstrip", false},      {"normalized", false},
                                 {"rstrip", false},      {"single_word", false}, {"special", true}};
  }
  const json config = {{"added_tokens_decoder", added},
                       {"bos_token", "<s>"},
                       {"eos_token", "</s>"},
                       {"unk_token", "<unk>"},
                       {"pad_token", "<unk>"},
                       {"cls_token", ERNIE_CONTROL[0]},
                       {"sep_token", ERNIE_CONTROL[1]},
                       {"mask_token", ERNIE_CONTROL[2]},
                       {"add_bos_token", false},
                       {"add_eos_token", false},
                       {"legacy", false},
                       {"clean_up_tokenization_spaces", false},
                       {"tokenizer_class", "Ernie4_5Tokenizer"}};
  NIB_RETURN_IF_ERROR(write_file(dir / "tokenizer_config.json", config.dump(2) + "\n"));
  return copy_from_data(fs::path(data) / "ernie" / "chat_template.jinja", dir / "chat_template.jinja");
}

}  // namespace

Status write_tokenizer_files(const io::ModelConfig& config, const std::string& out_dir, const std::string& data) {
  const fs::path dir(out_dir);
  if (config.architecture == "Ernie4_5_MoeForCausalLM") {
    NIB_RETURN_IF_ERROR(write_ernie_tokenizer(dir, data));
    // ERNIE-4.5's generation_config.json form (bos 1, eos 2, pad 0); the turn end of the chat format
    // (<|end_of_sentence|>, id 4 in this synthetic tokenizer) also stops generation.
    const json generation = {{"bos_token_id", 1}, {"eos_token_id", {2, 4}}, {"pad_token_id", 0},
                             {"do_sample", true}, {"temperature", 0.8},     {"top_p", 0.8}};
    return write_file(dir / "generation_config.json", generation.dump(2) + "\n");
  }
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    NIB_RETURN_IF_ERROR(copy_from_data(fs::path(data) / "qwen3-tokenizer" / file, dir / file));
  // Qwen3's generation_config.json (Qwen/Qwen3-30B-A3B).
  const json generation = {{"bos_token_id", 151643},
                           {"do_sample", true},
                           {"eos_token_id", {151645, 151643}},
                           {"pad_token_id", 151643},
                           {"temperature", 0.6},
                           {"top_k", 20},
                           {"top_p", 0.95},
                           {"transformers_version", "4.51.0"}};
  return write_file(dir / "generation_config.json", generation.dump(2) + "\n");
}

}  // namespace nibble::tools
