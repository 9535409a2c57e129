// SentencePiece model wrapper: load, per-chunk encode with or without the dummy prefix, piece
// lookup, and a small BPE trainer for the synthetic ERNIE checkpoints.
#include "text/sentencepiece_model.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fstream>
#include <sstream>
#include <unordered_map>

namespace nibble::text {

struct SentencePieceModel::Impl {
  sentencepiece::SentencePieceProcessor as_published;
  sentencepiece::SentencePieceProcessor without_prefix;  // loaded only when the model adds one
};

SentencePieceModel::SentencePieceModel() : impl_(std::make_unique<Impl>()) {}
SentencePieceModel::~SentencePieceModel() = default;

Result<std::unique_ptr<SentencePieceModel>> SentencePieceModel::load(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::error(file + ": cannot open");
  std::stringstream bytes;
  bytes << in.rdbuf();
  const std::string proto = bytes.str();
  std::unique_ptr<SentencePieceModel> m(new SentencePieceModel());
  const auto status = m->impl_->as_published.LoadFromSerializedProto(proto);
  if (!status.ok()) return Status::error(file + ": not a SentencePiece model (" + status.ToString() + ")");
  const std::vector<std::string> probe = m->impl_->as_published.EncodeAsPieces("a");
  m->adds_dummy_prefix_ = !probe.empty() && probe[0].rfind("\xE2\x96\x81", 0) == 0;  // "▁"
  if (m->adds_dummy_prefix_) {
    // The same model with normalizer_spec.add_dummy_prefix = false: ModelProto field 3 is the
    // normalizer_spec and NormalizerSpec field 3 is add_dummy_prefix (sentencepiece_model.proto);
    // protobuf merges a repeated singular sub-message into the earlier one, the last scalar winning.
    const std::string patched = proto + std::string("\x1a\x02\x18\x00", 4);
    const auto s = m->impl_->without_prefix.LoadFromSerializedProto(patched);
    if (!s.ok()) return Status::error(file + ": cannot turn off the dummy prefix (" + s.ToString() + ")");
  }
  return m;
}

void SentencePieceModel::encode(const std::string& chunk, bool with_dummy_prefix, std::vector<int32_t>& out) const {
  const auto& processor = with_dummy_prefix || !adds_dummy_prefix_ ? impl_->as_published : impl_->without_prefix;
  std::vector<int> ids;
  processor.Encode(chunk, &ids).IgnoreError();  // fails only on an unloaded model
  out.insert(out.end(), ids.begin(), ids.end());
}

int32_t SentencePieceModel::size() const { return impl_->as_published.GetPieceSize(); }
const std::string& SentencePieceModel::piece(int32_t id) const { return impl_->as_published.IdToPiece(id); }
bool SentencePieceModel::is_byte(int32_t id) const { return impl_->as_published.IsByte(id); }
int32_t SentencePieceModel::unk_id() const { return impl_->as_published.unk_id(); }

namespace {

class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::string& text) : in_(text) { Next(); }
  bool done() const override { return done_; }
  void Next() override { done_ = !std::getline(in_, line_); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::istringstream in_;
  std::string line_;
  bool done_ = false;
};

}  // namespace

Result<std::string> SentencePieceModel::train_bpe(const std::string& text, int vocab_size,
                                                  const std::vector<std::string>& control_pieces) {
  std::string controls;
  for (const std::string& p : control_pieces) controls += (controls.empty() ? "" : ",") + p;
  const std::unordered_map<std::string, std::string> args = {{"model_type", "bpe"},
                                                             {"vocab_size", std::to_string(vocab_size)},
                                                             {"hard_vocab_limit", "true"},
                                                             {"byte_fallback", "true"},
                                                             {"character_coverage", "1.0"},
                                                             {"unk_id", "0"},
                                                             {"bos_id", "1"},
                                                             {"eos_id", "2"},
                                                             {"pad_id", "-1"},
                                                             {"control_symbols", controls},
                                                             {"num_threads", "1"},
                                                             {"minloglevel", "2"},
                                                             {"model_prefix", ""}};
  LineIterator lines(text);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  if (!status.ok()) return Status::error("SentencePiece training failed: " + status.ToString());
  return model;
}

}  // namespace nibble::text
