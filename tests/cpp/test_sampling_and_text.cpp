// The sampler's filters and penalties against direct computations, seeded draws against their
// distribution, stop strings across token boundaries with the stream hold-back, and the chat
// output parser (Qwen3 reasoning, Hermes tool calls) fed whole and in every split.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "core/philox.h"
#include "sampling/sampler.h"
#include "server/chat_output.h"
#include "test_seed.h"

namespace nibble {
namespace {

using sampling::SamplingParams;
using sampling::SequenceContext;

TEST(Sampler, GreedyPenaltiesAndMaskFollowVllm) {
  std::vector<float> logits = {1.0f, 3.0f, 2.9f, -1.0f};
  const sampling::DrawKey rng{1, 0};
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(sampling::sample_next(logits, p, {}, rng).token, 1);
  std::vector<int32_t> masked = {1};
  EXPECT_EQ(sampling::sample_next(logits, p, {{}, {}, masked}, rng).token, 2);
  // repetition 2 on a token seen in the prompt: 3 → 1.5, so token 2 wins.
  p.repetition_penalty = 2.0f;
  std::vector<int32_t> prompt = {1};
  EXPECT_EQ(sampling::sample_next(logits, p, {prompt, {}, {}}, rng).token, 2);
  // frequency 0.1 × 2 occurrences in the output: 3 → 2.8 < 2.9.
  p = SamplingParams{};
  p.temperature = 0.0f;
  p.frequency_penalty = 0.1f;
  std::vector<int32_t> output = {1, 1};
  EXPECT_EQ(sampling::sample_next(logits, p, {{}, output, {}}, rng).token, 2);
  p.frequency_penalty = 0.0f;
  p.presence_penalty = 0.2f;  // once seen: 3 → 2.8
  EXPECT_EQ(sampling::sample_next(logits, p, {{}, output, {}}, rng).token, 2);
}

TEST(Sampler, FiltersKeepExactlyTheAllowedTokensAndDrawsMatchTheDistribution) {
  const uint64_t seed = test::test_seed("Sampler.Filters");
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(64);
  for (float& l : logits) l = normal(gen);
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 10;
  p.top_p = 0.8f;
  p.min_p = 0.02f;
  // The allowed set, computed directly: softmax(l/T), min_p, top-k, then the smallest top-p prefix.
  std::vector<double> prob(logits.size());
  const float max_l = *std::max_element(logits.begin(), logits.end());
  for (size_t i = 0; i < logits.size(); ++i) prob[i] = std::exp((logits[i] - max_l) / p.temperature);
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b]; });
  std::vector<int> kept;
  for (int i : order)
    if (prob[i] >= p.min_p && static_cast<int>(kept.size()) < p.top_k) kept.push_back(i);
  double total = 0;
  for (int i : kept) total += prob[i];
  std::vector<int> allowed;
  double mass = 0;
  for (int i : kept) {
    allowed.push_back(i);
    mass += prob[i];
    if (mass >= p.top_p * total) break;
  }
  double allowed_mass = 0;
  for (int i : allowed) allowed_mass += prob[i];
  std::map<int32_t, int> counts;
  const int draws = 40000;  // one seed, consecutive positions: the counter-based stream
  for (int d = 0; d < draws; ++d) ++counts[sampling::sample_next(logits, p, {}, {seed, uint64_t(d)}).token];
  for (const auto& [token, n] : counts)
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), token), allowed.end()) << "token " << token << " was filtered";
  // Frequencies within 5 standard deviations of the renormalized probabilities.
  for (int i : allowed) {
    const double expected = prob[i] / allowed_mass;
    const double sd = std::sqrt(expected * (1 - expected) / draws);
    EXPECT_NEAR(counts[i] / double(draws), expected, 5 * sd + 1e-9) << "token " << i;
  }
  // A draw is a pure function of (logits, seed, position); other seeds draw differently — shown on
  // 64 equally likely tokens (the filtered distribution above can be one token for some seeds, and
  // random logits can be peaked): two seeds agree with probability 1/64, so ~98 of 100 draws differ.
  SamplingParams unfiltered;
  unfiltered.temperature = 1.0f;
  const std::vector<float> flat(64, 0.5f);
  int differ = 0;
  for (uint64_t d = 0; d < 100; ++d) {
    EXPECT_EQ(sampling::sample_next(logits, p, {}, {seed, d}).token,
              sampling::sample_next(logits, p, {}, {seed, d}).token);
    differ += sampling::sample_next(flat, unfiltered, {}, {seed, d}).token !=
              sampling::sample_next(flat, unfiltered, {}, {seed + 1, d}).token;
  }
  EXPECT_GT(differ, 80);
}

// Random123's published known-answer vectors (its tests/kat_vectors) for Philox4x32-10.
TEST(Philox, KnownAnswers) {
  auto run = [](Philox4 ctr, uint32_t k0, uint32_t k1) {
    const Philox4 r = philox4x32_10(ctr, k0, k1);
    return std::vector<uint32_t>(r.v, r.v + 4);
  };
  EXPECT_EQ(run({{0, 0, 0, 0}}, 0, 0), (std::vector<uint32_t>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(run({{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff, 0xffffffff),
            (std::vector<uint32_t>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(run({{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822, 0x299f31d0),
            (std::vector<uint32_t>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
  // Uniforms lie in (0, 1] with mean 1/2.
  double sum = 0;
  for (uint32_t i = 0; i < 100000; ++i) {
    const double u = philox_uniform(7, 3, i);
    ASSERT_TRUE(u > 0.0 && u <= 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);  // sd of the mean: 0.29/sqrt(1e5) ≈ 0.0009
}

TEST(Sampler, LogprobsAreOfTheRawDistribution) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 2;
  const auto out = sampling::sample_next(logits, p, {}, {0, 0});
  const double z = std::log(std::exp(0.5) + std::exp(2.0) + std::exp(-1.0));
  EXPECT_NEAR(out.logprob, 2.0 - z, 1e-6);
  ASSERT_EQ(out.top.size(), 2u);
  EXPECT_EQ(out.top[0].token, 1);
  EXPECT_EQ(out.top[1].token, 0);
  EXPECT_NEAR(out.top[1].logprob, 0.5 - z, 1e-6);
}

// logit_bias (OpenAI): added after the min_tokens mask and before the penalties, as vLLM orders them;
// -100 bans a token in practice, +100 forces one; logprobs stay those of the raw distribution.
TEST(Sampler, LogitBiasComesAfterTheMaskAndBeforeThePenalties) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.9f, -1.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{0, 2.5f}};  // 1 + 2.5 = 3.5 beats 3
  EXPECT_EQ(sampling::sample_next(logits, p, {}, {1, 0}).token, 0);
  p.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(sampling::sample_next(logits, p, {}, {1, 0}).token, 2);
  // A masked token stays masked whatever its bias.
  const std::vector<int32_t> masked = {3};
  p.logit_bias = {{3, 100.0f}};
  EXPECT_EQ(sampling::sample_next(logits, p, {{}, {}, masked}, {1, 0}).token, 1);
  // Before the repetition penalty (token 2 is in the prompt): token 1 is 3 - 1.2 = 1.8 and token 2
  // (2.9 + 0.5) / 2 = 1.7, so token 1 wins; the penalty first would make token 2 2.9 / 2 + 0.5 = 1.95.
  const std::vector<int32_t> prompt = {2};
  p.logit_bias = {{1, -1.2f}, {2, 0.5f}};
  p.repetition_penalty = 2.0f;
  EXPECT_EQ(sampling::sample_next(logits, p, {prompt, {}, {}}, {1, 0}).token, 1);
  // Sampled: +100 on one token of a flat distribution draws it at every position and seed.
  p = SamplingParams{};
  p.temperature = 1.0f;
  p.logprobs = 0;
  p.logit_bias = {{2, 100.0f}};
  for (uint64_t position = 0; position < 50; ++position) {
    const auto out = sampling::sample_next(logits, p, {}, {position * 7919, position});
    EXPECT_EQ(out.token, 2);
    EXPECT_NEAR(out.logprob, 2.9 - std::log(std::exp(1.0) + std::exp(3.0) + std::exp(2.9) + std::exp(-1.0)), 1e-6);
  }
}

TEST(SamplingParams, LogitBiasIsValidated) {
  SamplingParams p;
  p.logit_bias = {{5, 1.0f}, {3, 1.0f}};
  EXPECT_NE(p.validate().message().find("logit_bias"), std::string::npos);
  p.logit_bias = {{3, 1.0f}, {3, 2.0f}};
  EXPECT_FALSE(p.validate().is_ok());
  p.logit_bias = {{3, 100.5f}};
  EXPECT_NE(p.validate().message().find("[-100, 100]"), std::string::npos);
  p.logit_bias = {{3, -100.0f}, {7, 100.0f}};
  EXPECT_TRUE(p.validate().is_ok());
}

// The chat parser gives the same result however the text is split into pieces.
server::ChatDelta parse_in_pieces(const std::string& text, size_t piece, bool reasoning, bool tools,
                                  int max_tool_calls = INT32_MAX) {
  server::ChatOutputParser parser(reasoning, tools, max_tool_calls);
  server::ChatDelta all;
  auto add = [&all](server::ChatDelta d) {
    all.reasoning += d.reasoning;
    all.content += d.content;
    for (auto& c : d.tool_calls) all.tool_calls.push_back(c);
  };
  for (size_t i = 0; i < text.size(); i += piece) add(parser.add(text.substr(i, piece)));
  add(parser.finish());
  return all;
}

TEST(ChatOutputParser, ReasoningAndToolCallsInAnySplit) {
  const std::string text =
      "<think>\nLet me check the weather.\n</think>\n\nSure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  for (size_t piece = 1; piece <= text.size(); ++piece) {
    const server::ChatDelta d = parse_in_pieces(text, piece, true, true);
    EXPECT_EQ(d.reasoning, "\nLet me check the weather.\n") << piece;
    EXPECT_EQ(d.content, "\n\nSure.\n") << piece;
    ASSERT_EQ(d.tool_calls.size(), 2u) << piece;
    EXPECT_EQ(d.tool_calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(nlohmann::json::parse(d.tool_calls[0]["function"]["arguments"].get<std::string>()),
              nlohmann::json({{"city", "Paris"}}));
    EXPECT_EQ(d.tool_calls[1]["type"], "function");
  }
  // Without the parsers everything is content; a broken tool call stays content; no <think> at
  // the start means no reasoning.
  EXPECT_EQ(parse_in_pieces(text, 3, false, false).content, text);
  EXPECT_EQ(parse_in_pieces("<tool_call>{oops</tool_call>", 2, true, true).content, "<tool_call>{oops</tool_call>");
  EXPECT_EQ(parse_in_pieces("Hi <think>x</think>", 1, true, true).content, "Hi <think>x</think>");
  // A truncated thought is all reasoning.
  EXPECT_EQ(parse_in_pieces("<think>still thinking", 4, true, false).reasoning, "still thinking");
  // parallel_tool_calls: false keeps the first call; the second is dropped, not turned into content.
  for (size_t piece : {size_t{1}, size_t{7}, text.size()}) {
    const server::ChatDelta one = parse_in_pieces(text, piece, true, true, 1);
    ASSERT_EQ(one.tool_calls.size(), 1u) << piece;
    EXPECT_EQ(one.tool_calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(one.content, "\n\nSure.\n") << piece;
  }
}

}  // namespace
}  // namespace nibble
