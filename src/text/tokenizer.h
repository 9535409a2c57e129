// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (Qwen2/Qwen3, Llama-3,
// DeepSeek-V3 style): added tokens, NFC normalizer, Split/ByteLevel pre-tokenizers, BPE with
// string or pair merges, ByteLevel decoder, TemplateProcessing post-processor. Unsupported
// components are load errors that name them. A folder with a SentencePiece tokenizer.model and no
// tokenizer.json (ERNIE-4.5) is read as transformers reads it (sentencepiece_model.h).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace nibble::text {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

class Tokenizer {
 public:
  // `path`: a tokenizer.json file or a folder holding one.
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& path);
  ~Tokenizer();

  // parse_special: special tokens written in the text become their ids (false: they are encoded
  // as plain text). add_special_tokens: the post-processor's additions (e.g. Llama-3's BOS).
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true, bool add_special_tokens = false) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // The bytes one token contributes to decode() (before UTF-8 repair); empty for skipped tokens.
  // A view into a table made at load, valid while the tokenizer lives.
  std::string_view token_bytes(int32_t id, bool skip_special_tokens = false) const;
  bool is_special(int32_t id) const;
  // The token's string in the vocabulary (byte-level form), or "" for an unknown id.
  std::string id_to_token(int32_t id) const;
  // -1 when absent.
  int32_t token_to_id(std::string_view token) const;
  size_t vocab_size() const;  // one past the largest id
  // decode() drops one leading space (SentencePiece's dummy prefix; transformers' Strip decoder).
  bool strips_leading_space() const;
  // A SentencePiece byte-fallback piece (<0x00> … <0xFF>): decode() joins a run of them and keeps
  // it only if it is valid UTF-8, else writes one U+FFFD per piece (tokenizers' ByteFallback decoder).
  bool is_byte_piece(int32_t id) const;
  static std::string byte_run_text(const std::string& bytes, size_t n_pieces);

 private:
  Tokenizer();
  static Result<std::unique_ptr<Tokenizer>> load_unchecked(const std::string& path);
  static Result<std::unique_ptr<Tokenizer>> load_sentencepiece(const std::string& dir);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nibble::text
