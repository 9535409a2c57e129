// A SentencePiece model (tokenizer.model, as ERNIE-4.5 ships it) behind nibble's own types, read
// with Debian's libsentencepiece; tokenizer.cpp splits added tokens around it as transformers does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace nibble::text {

class SentencePieceModel {
 public:
  static Result<std::unique_ptr<SentencePieceModel>> load(const std::string& file);
  ~SentencePieceModel();

  // Appends the ids of one text chunk (a stretch between added tokens). with_dummy_prefix: false
  // encodes as if the model's normalizer_spec.add_dummy_prefix were off.
  void encode(const std::string& chunk, bool with_dummy_prefix, std::vector<int32_t>& out) const;

  int32_t size() const;
  const std::string& piece(int32_t id) const;
  bool is_byte(int32_t id) const;  // a byte-fallback piece, <0x00> … <0xFF>
  int32_t unk_id() const;
  // Whether the normalizer prefixes a chunk with "▁" (normalizer_spec.add_dummy_prefix).
  bool adds_dummy_prefix() const { return adds_dummy_prefix_; }

  // Trains a BPE model of exactly vocab_size pieces with byte fallback on `text` (one sentence per
  // line), the control pieces right after <unk> <s> </s>; returns the serialized model (a
  // tokenizer.model file), or an error when the text is too small for that many pieces.
  static Result<std::string> train_bpe(const std::string& text, int vocab_size,
                                       const std::vector<std::string>& control_pieces);

 private:
  SentencePieceModel();
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool adds_dummy_prefix_ = false;
};

}  // namespace nibble::text
