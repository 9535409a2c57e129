// SentencePiece byte-fallback runs through nibble's text path, on a model trained here by
// SentencePieceModel::train_bpe: decode keeps a valid run's character and writes one U+FFFD per
// piece of an invalid run (tokenizers' ByteFallback), a skipped special token does not end a run,
// streaming holds a run until it ends, and a stop string inside a run held to the end of the
// sequence still stops it (TextOutput::finish).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/text_output.h"
#include "text/detokenizer.h"
#include "text/sentencepiece_model.h"
#include "text/tokenizer.h"

namespace nibble {
namespace {

constexpr const char* REPLACEMENT = "\xEF\xBF\xBD";

class SentencePieceText : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string corpus;
    for (int i = 0; i < 40; ++i)
      corpus +=
          "the quick brown fox jumps over the lazy dog " + std::to_string(i * 37) + "\nhello world, hello tokens\n";
    auto model = text::SentencePieceModel::train_bpe(corpus, 320, {"<|end_of_sentence|>"});
    ASSERT_TRUE(model) << model.status().message();
    dir_ = std::filesystem::temp_directory_path() / ("nibble_spm_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "tokenizer.model", std::ios::binary) << *model;
    std::ofstream(dir_ / "tokenizer_config.json")
        << R"({"added_tokens_decoder": {"3": {"content": "<|end_of_sentence|>",
        "special": true}}, "legacy": false})";
    auto tok = text::Tokenizer::load(dir_.string());
    ASSERT_TRUE(tok) << tok.status().message();
    tokenizer_ = std::move(*tok);
  }
  static void TearDownTestSuite() {
    tokenizer_.reset();
    std::filesystem::remove_all(dir_);
  }
  static int32_t byte(uint8_t b) {
    char piece[8];
    std::snprintf(piece, sizeof piece, "<0x%02X>", b);
    return tokenizer_->token_to_id(piece);
  }
  static inline std::filesystem::path dir_;
  static inline std::unique_ptr<text::Tokenizer> tokenizer_;
};

TEST_F(SentencePieceText, ByteRunsDecodeAsTransformersDoes) {
  const text::Tokenizer& t = *tokenizer_;
  ASSERT_EQ(t.vocab_size(), 320u);
  const int32_t e4 = byte(0xE4), b8 = byte(0xB8), ad = byte(0xAD), ff = byte(0xFF), eos = 3;
  ASSERT_TRUE(e4 > 0 && b8 > 0 && ad > 0 && ff > 0);
  EXPECT_EQ(t.decode({e4, b8, ad}), "中");
  EXPECT_EQ(t.decode({e4, b8}), std::string(REPLACEMENT) + REPLACEMENT);  // unfinished: one per piece
  EXPECT_EQ(t.decode({ff, e4, b8, ad}), std::string(REPLACEMENT) + REPLACEMENT + REPLACEMENT + REPLACEMENT);
  EXPECT_EQ(t.decode({e4, eos, b8, ad}, /*skip_special_tokens=*/true), "中");  // skipped before decoding
  EXPECT_EQ(t.decode({e4, eos, b8, ad}), std::string(REPLACEMENT) + "<|end_of_sentence|>" + REPLACEMENT + REPLACEMENT);
  const std::vector<int32_t> hello = t.encode("hello world");
  EXPECT_EQ(t.decode(hello), "hello world");  // the dummy prefix's space is dropped
  // Streaming: nothing of a run until it ends, then the same text as decode.
  text::IncrementalDetokenizer stream(t, false);
  std::vector<int32_t> ids = {e4, b8, ad};
  for (int32_t id : ids) EXPECT_EQ(stream.add(id), "");
  std::string streamed;
  for (int32_t id : hello) streamed += stream.add(id), ids.push_back(id);
  streamed += stream.finish();
  EXPECT_EQ(streamed, t.decode(ids));
  EXPECT_EQ(streamed, "中 hello world");
}

TEST_F(SentencePieceText, AStopStringHeldToTheEndStillStops) {
  const text::Tokenizer& t = *tokenizer_;
  engine::TextOutput out(t, false, {std::string(REPLACEMENT) + REPLACEMENT}, false);
  for (int32_t id : {byte(0xFF), byte(0xFE), byte(0xFD)}) EXPECT_EQ(out.add(id, true), "");
  EXPECT_EQ(out.take(false), "");  // the run is still open
  EXPECT_EQ(out.finish(true), std::string(REPLACEMENT) + REPLACEMENT);
  EXPECT_EQ(out.take(true), "");  // cut before the stop string
  engine::TextOutput unchecked(t, false, {std::string(REPLACEMENT) + REPLACEMENT}, false);
  for (int32_t id : {byte(0xFF), byte(0xFE)}) unchecked.add(id, true);
  EXPECT_EQ(unchecked.finish(false), "");
  EXPECT_EQ(unchecked.take(true), std::string(REPLACEMENT) + REPLACEMENT);
}

}  // namespace
}  // namespace nibble
