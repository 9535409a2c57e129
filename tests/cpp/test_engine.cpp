// The engine with overlapped scheduling against the engine without it, on the CPU runner over a tiny
// synthetic checkpoint: every request gives exactly the same tokens, text, logprobs and finish
// reasons (the CPU forward is exact whatever the batch around a token, test_model_batching), under
// random stop strings, stop tokens, EOS with min_tokens, penalties, n > 1, max_model_len, preemption
// and prefix-cache hits — overlap changes when the engine learns a token, never which token it is.
// Aborts in flight and the runner's pending tokens are checked too, and so are grammars (structured
// output), whose masks depend on the token before.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <regex>

#include "engine/engine.h"
#include "grammar/grammar.h"
#include "engine/model_runner.h"
#include "test_seed.h"
#include "tools/synth.h"

using namespace nibble;
using namespace nibble::engine;
namespace fs = std::filesystem;

namespace {

const std::string& model_dir() {
  static const std::string dir = [] {
    const fs::path d = fs::temp_directory_path() / ("nibble_engine_" + std::to_string(getpid()));
    tools::SynthOptions o;
    o.preset = "tiny-moe";
    o.out_dir = d.string();
    o.seed = 3;
    auto r = tools::synth_checkpoint(o);
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    return d.string();
  }();
  return dir;
}

std::unique_ptr<ModelRunner> cpu_runner(int64_t blocks) {
  RunnerOptions o;
  o.backend = Backend::CPU;
  o.num_kv_blocks = blocks;
  o.block_size = 4;
  auto r = create_runner(model_dir(), o);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? std::move(r.value()) : nullptr;
}

// What a request's outputs add up to.
struct Collected {
  bool finished = false;
  std::string error;
  int64_t completion_tokens = 0;
  std::map<int32_t, std::vector<int32_t>> tokens;
  std::map<int32_t, std::string> text;
  std::map<int32_t, std::vector<float>> logprobs;  // the drawn token's, then its top ones, per token
  std::map<int32_t, FinishReason> finish;
  std::map<int32_t, std::string> stop_string;
  std::map<int32_t, int32_t> stop_token;
};

class Sink {
 public:
  OutputCallback callback(size_t i) {
    return [this, i](RequestOutput&& out) {
      std::lock_guard<std::mutex> lock(mutex_);
      Collected& c = got_[i];
      EXPECT_FALSE(c.finished) << "request " << i << ": an output after its last";
      c.finished = out.finished;
      c.error = out.error;
      c.completion_tokens = out.completion_tokens;
      for (ChoiceDelta& d : out.choices) {
        c.tokens[d.index].insert(c.tokens[d.index].end(), d.token_ids.begin(), d.token_ids.end());
        c.text[d.index] += d.text;
        for (const sampling::SampledToken& t : d.logprobs) {
          c.logprobs[d.index].push_back(t.logprob);
          for (const auto& top : t.top) c.logprobs[d.index].push_back(top.logprob);
        }
        if (d.finish != FinishReason::NONE) {
          c.finish[d.index] = d.finish;
          c.stop_string[d.index] = d.stop_string;
          c.stop_token[d.index] = d.stop_token;
        }
      }
      if (out.finished) ++n_finished_;
      done_.notify_all();
    };
  }
  void wait(size_t n) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return n_finished_ >= n; });
  }
  std::map<size_t, Collected> results() {
    std::lock_guard<std::mutex> lock(mutex_);
    return got_;
  }
  size_t n_outputs_seen(size_t i) {
    std::lock_guard<std::mutex> lock(mutex_);
    return got_.count(i) ? got_[i].tokens.size() : 0;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::map<size_t, Collected> got_;
  size_t n_finished_ = 0;
};

constexpr int64_t MAX_MODEL_LEN = 72;

// Requests of every kind; none of them aborts, so their outputs are fully determined.
std::vector<GenerationRequest> make_requests(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto token = [&] { return static_cast<int32_t>(rng() % 151000); };
  std::vector<int32_t> shared_prefix(20);
  for (int32_t& t : shared_prefix) t = token();
  std::vector<int32_t> common_stops;  // one id in sixteen: sequences stop at random points
  for (int32_t id = 7; id < 151936; id += 16) common_stops.push_back(id);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 28; ++i) {
    GenerationRequest r;
    r.id = "r" + std::to_string(i);
    if (i % 3 == 0) r.prompt = shared_prefix;  // prefix-cache hits
    // At most 20 + 22 prompt tokens, so that with max_tokens ≤ 30 every request fits MAX_MODEL_LEN.
    const int extra = 1 + static_cast<int>(rng() % 22);
    for (int j = 0; j < extra; ++j) r.prompt.push_back(token());
    r.sampling.seed = rng();
    r.sampling.temperature = i % 4 == 0 ? 0.0f : 0.7f + 0.1f * static_cast<float>(i % 5);
    if (i % 5 == 1) r.sampling.top_k = 20;
    if (i % 5 == 2) r.sampling.top_p = 0.8f;
    if (i % 7 == 3) r.sampling.repetition_penalty = 1.3f, r.sampling.presence_penalty = 0.5f;
    if (i % 7 == 4) r.sampling.frequency_penalty = 0.4f, r.sampling.min_p = 0.02f;
    if (i % 6 == 5) r.sampling.logprobs = 3;
    r.stop.max_tokens = i % 9 == 8 ? -1 : 1 + static_cast<int64_t>(rng() % 30);  // -1: to max_model_len
    if (i % 11 == 10) r.stop.max_tokens = 0;                                     // prefill only
    if (i % 4 == 1) r.stop.stop = {"e"};                                         // random text: stops somewhere
    if (i % 4 == 2)
      r.stop.stop_token_ids = common_stops,
      r.stop.min_tokens = r.stop.max_tokens < 0 ? 3 : std::min<int64_t>(3, r.stop.max_tokens);
    if (i % 8 == 6) r.n = 2;
    r.stop.ignore_eos = i % 2 == 0;
    requests.push_back(std::move(r));
  }
  return requests;
}

struct RunResult {
  std::map<size_t, Collected> outputs;
  MetricsSnapshot metrics;
};

// Request i of two runs (step by step, overlapped) ended alike, without errors.
void expect_same_output(const RunResult& plain, const RunResult& overlapped, size_t i) {
  const Collected& a = plain.outputs.at(i);
  const Collected& b = overlapped.outputs.at(i);
  ASSERT_TRUE(a.finished && b.finished);
  EXPECT_EQ(a.error, "");
  EXPECT_EQ(b.error, "");
  EXPECT_EQ(b.completion_tokens, a.completion_tokens);
  EXPECT_EQ(b.tokens, a.tokens);
  EXPECT_EQ(b.text, a.text);
  EXPECT_EQ(b.logprobs, a.logprobs);
  EXPECT_EQ(b.finish, a.finish);
  EXPECT_EQ(b.stop_string, a.stop_string);
  EXPECT_EQ(b.stop_token, a.stop_token);
}

RunResult run(bool overlap, const std::vector<GenerationRequest>& requests, int64_t blocks,
              SchedulerLimits limits = {8, 48}, int64_t max_model_len = MAX_MODEL_LEN, std::string step_log = "",
              const std::vector<int64_t>& warm_up = {}) {
  EngineConfig ec;
  if (!step_log.empty()) ec.step_log = open_step_log(step_log);
  ec.overlap = overlap;
  ec.max_model_len = max_model_len;
  ec.limits = limits;  // few sequences and a small token budget: chunked prefills beside decodes
  ec.eos_token_ids = {151645, 100, 2000, 30000};
  auto tokenizer = text::Tokenizer::load(model_dir());
  EXPECT_TRUE(tokenizer.is_ok()) << tokenizer.status().message();
  Engine engine(ec, cpu_runner(blocks), std::shared_ptr<const text::Tokenizer>(std::move(tokenizer.value())),
                {model_dir(), "default"});
  if (!warm_up.empty()) {
    const Status warmed = engine.warm_up(warm_up);
    EXPECT_TRUE(warmed.is_ok()) << warmed.message();
    // As if it had not run: no counter moved, no block is held.
    const MetricsSnapshot m = engine.metrics();
    EXPECT_EQ(m.prompt_tokens + m.generation_tokens + m.steps + m.prefix_queries + m.prefix_hits, 0u);
    EXPECT_TRUE(m.finished.empty());
    EXPECT_EQ(m.ttft.count + m.e2e.count + m.itl.count, 0u);
    EXPECT_EQ(m.kv_usage, 0.0);
    EXPECT_EQ(m.kv_blocks_total, blocks);
  }
  Sink sink;
  for (size_t i = 0; i < requests.size(); ++i) {
    GenerationRequest r = requests[i];
    r.on_output = sink.callback(i);
    const Status s = engine.submit(std::move(r));
    if (!s) {
      ADD_FAILURE() << "request " << i << ": " << s.message();
      return RunResult();
    }
  }
  sink.wait(requests.size());
  engine.shutdown();
  return {sink.results(), engine.metrics()};
}

TEST(Engine, OverlappedSchedulingDrawsTheSameTokensAsStepByStep) {
  const uint64_t seed = test::test_seed("Engine.OverlappedSchedulingDrawsTheSameTokensAsStepByStep");
  const std::vector<GenerationRequest> requests = make_requests(seed);
  // 40 blocks of 4 tokens hold 160 tokens: 8 running sequences of up to 72 need more, so some are
  // preempted (and recomputed) in both runs.
  const RunResult plain = run(false, requests, 40), overlapped = run(true, requests, 40);
  EXPECT_GT(plain.metrics.preemptions + overlapped.metrics.preemptions, 0u) << "the KV cache was meant to run out";
  EXPECT_GT(overlapped.metrics.prefix_hits, 0u);
  for (const RunResult* r : {&plain, &overlapped}) {
    EXPECT_EQ(r->metrics.requests_running, 0);
    EXPECT_EQ(r->metrics.kv_usage, 0.0) << "every block is released (cached ones count as free)";
  }
  size_t stopped = 0, by_length = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Collected& a = plain.outputs.at(i);
    SCOPED_TRACE("request " + std::to_string(i));
    expect_same_output(plain, overlapped, i);
    for (const auto& [index, reason] : a.finish) {
      stopped += reason == FinishReason::STOP;
      by_length += reason == FinishReason::LENGTH;
      const int64_t n = static_cast<int64_t>(a.tokens.at(index).size());
      const StopParams& stop = requests[i].stop;
      if (reason == FinishReason::LENGTH)
        EXPECT_TRUE(n == stop.max_tokens || static_cast<int64_t>(requests[i].prompt.size()) + n == MAX_MODEL_LEN);
      else
        EXPECT_GE(n, stop.min_tokens);
    }
  }
  EXPECT_GT(stopped, 3u) << "stop strings, stop tokens and EOS were meant to end some sequences early";
  EXPECT_GT(by_length, 3u);
}

TEST(Engine, WarmUpPromptsFitTheBudgetAndTheContext) {
  EXPECT_EQ(warm_up_prompt_lengths({256, 8192}, 40960), (std::vector<int64_t>{16, 2048}));
  EXPECT_EQ(warm_up_prompt_lengths({256, 1000}, 40960), (std::vector<int64_t>{16, 1000}));
  EXPECT_EQ(warm_up_prompt_lengths({256, 8192}, 300), (std::vector<int64_t>{16, 298})) << "room for 2 drawn tokens";
  EXPECT_EQ(warm_up_prompt_lengths({256, 16}, 40960), (std::vector<int64_t>{16})) << "none twice";
  EXPECT_EQ(warm_up_prompt_lengths({256, 8192}, 10), (std::vector<int64_t>{8}));
  EXPECT_TRUE(warm_up_prompt_lengths({256, 8192}, 2).empty());
  const std::vector<int32_t> a = warm_up_prompt(48, 0, 151936), b = warm_up_prompt(48, 1, 151936);
  EXPECT_EQ(a.size(), 48u);
  EXPECT_NE(a[0], b[0]) << "no shared prefix";
  for (int32_t id : a) EXPECT_TRUE(id >= 0 && id < 151936);
}

// The warm-up (run before serving on the GPU) leaves nothing behind: counters at zero, its blocks out
// of the prefix cache (its 48-token prompt, asked again, finds none of its 11 full blocks), and the
// requests after it draw exactly what they draw on an engine that never warmed up, counted alike.
TEST(Engine, WarmUpLeavesNoTrace) {
  const uint64_t seed = test::test_seed("Engine.WarmUpLeavesNoTrace");
  const std::vector<int64_t> lengths = warm_up_prompt_lengths({8, 48}, MAX_MODEL_LEN);
  ASSERT_EQ(lengths, (std::vector<int64_t>{16, 48}));
  GenerationRequest again;
  again.id = "again";
  again.prompt = warm_up_prompt(48, 1, 151936);
  again.sampling.temperature = 0.0f;
  again.stop.max_tokens = 2;
  const RunResult alone = run(true, {again}, 60, {8, 48}, MAX_MODEL_LEN, "", lengths);
  EXPECT_GE(alone.metrics.prefix_queries, 44u);
  EXPECT_EQ(alone.metrics.prefix_hits, 0u) << "the warm-up's blocks were left in the prefix cache";
  // 200 blocks hold every request at once: no preemption, so the counters do not depend on timing.
  const std::vector<GenerationRequest> requests = make_requests(seed);
  const RunResult cold = run(true, requests, 200);
  const RunResult warmed = run(true, requests, 200, {8, 48}, MAX_MODEL_LEN, "", lengths);
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    expect_same_output(cold, warmed, i);
  }
  EXPECT_EQ(warmed.metrics.prompt_tokens, cold.metrics.prompt_tokens);
  EXPECT_EQ(warmed.metrics.generation_tokens, cold.metrics.generation_tokens);
  EXPECT_EQ(warmed.metrics.finished, cold.metrics.finished);
  EXPECT_EQ(warmed.metrics.e2e.count, requests.size());
}

// A warm-up whose step fails is an error naming the request (the server then does not start).
TEST(Engine, AFailedWarmUpIsAnErrorNamingItsRequest) {
  setenv("NIBBLE_DIAG_FAIL_ENGINE", "0:1", 1);
  std::unique_ptr<ModelRunner> failing = inject_engine_failure(cpu_runner(60), 0);
  unsetenv("NIBBLE_DIAG_FAIL_ENGINE");
  EngineConfig ec;
  ec.max_model_len = MAX_MODEL_LEN;
  ec.limits = {8, 48};
  auto tokenizer = text::Tokenizer::load(model_dir());
  ASSERT_TRUE(tokenizer.is_ok()) << tokenizer.status().message();
  Engine engine(ec, std::move(failing), std::shared_ptr<const text::Tokenizer>(std::move(tokenizer.value())),
                {model_dir(), "default"});
  const Status warmed = engine.warm_up({16, 48});
  ASSERT_FALSE(warmed.is_ok());
  EXPECT_NE(warmed.message().find("the warm-up request of 16 prompt tokens: "), std::string::npos) << warmed.message();
  EXPECT_NE(warmed.message().find("injected failure"), std::string::npos) << warmed.message();
}

// Structured output: the masks of a step depend on the tokens of the step before, which overlapped
// scheduling learns only after launching this one (ModelRunner::supply_masks). Constrained and
// unconstrained requests, under preemption, draw the same tokens with and without overlap, and each
// constrained output is a sentence of its grammar.
TEST(Engine, GrammarsDrawTheSameTokensOverlappedAndStepByStep) {
  const uint64_t seed = test::test_seed("Engine.GrammarsDrawTheSameTokensOverlappedAndStepByStep");
  auto tokenizer = text::Tokenizer::load(model_dir());
  ASSERT_TRUE(tokenizer.is_ok());
  const int64_t vocab = 151936;  // tiny-moe's (Qwen3's padded vocabulary)
  grammar::Vocabulary v;
  v.token_bytes.resize(vocab);
  for (int32_t id = 0; id < static_cast<int32_t>(tokenizer.value()->vocab_size()) && id < vocab; ++id)
    if (!tokenizer.value()->is_special(id)) v.token_bytes[id] = std::string(tokenizer.value()->token_bytes(id));
  v.stop_ids = {151645};
  grammar::GrammarCompiler compiler(v, 2);
  struct Kind {
    grammar::Constraint constraint;
    std::regex sentence;
  };
  const std::vector<Kind> kinds = {
      {{grammar::ConstraintKind::REGEX, "[a-c]{2,6}x"}, std::regex("[a-c]{2,6}x")},
      {{grammar::ConstraintKind::CHOICE, "", {"north", "south", "east west"}}, std::regex("north|south|east west")},
      {{grammar::ConstraintKind::JSON_SCHEMA,
        R"({"type":"object","properties":{"n":{"type":"integer","minimum":0,"maximum":99},"ok":{"type":"boolean"}},)"
        R"("required":["n","ok"],"additionalProperties":false})"},
       std::regex(R"(\{"n": [0-9]{1,2}, "ok": (true|false)\})")},
  };
  std::vector<GenerationRequest> requests = make_requests(seed);
  std::map<size_t, size_t> kind_of;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i % 2 == 1) continue;  // every other request stays unconstrained beside the constrained ones
    GenerationRequest& r = requests[i];
    auto g = compiler.compile(kinds[(i / 2) % kinds.size()].constraint);
    ASSERT_TRUE(g.is_ok()) << g.status().message();
    r.grammar = g.value();
    r.stop = {};
    r.stop.max_tokens = 24;  // every grammar above finishes well within it
    kind_of[i] = (i / 2) % kinds.size();
  }
  const RunResult plain = run(false, requests, 40), overlapped = run(true, requests, 40);
  EXPECT_GT(plain.metrics.grammar_mask_rows, 0u);
  size_t sentences = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Collected& a = plain.outputs.at(i);
    SCOPED_TRACE("request " + std::to_string(i));
    expect_same_output(plain, overlapped, i);
    if (!kind_of.count(i)) continue;
    for (const auto& [index, text] : a.text) {
      EXPECT_EQ(a.finish.at(index), FinishReason::STOP) << text;
      EXPECT_TRUE(std::regex_match(text, kinds[kind_of[i]].sentence)) << "'" << text << "'";
      ++sentences;
    }
  }
  EXPECT_GE(sentences, 14u);
}

// --step-log: a row per step, each within the step's limits, the prompts' tokens all among them.
TEST(Engine, StepLogHasARowPerStepWithinTheLimits) {
  const uint64_t seed = test::test_seed("Engine.StepLogHasARowPerStepWithinTheLimits");
  const std::vector<GenerationRequest> requests = make_requests(seed);
  const std::string path = ::testing::TempDir() + "nibble_step_log.csv";
  const RunResult r = run(true, requests, 400, {8, 48}, MAX_MODEL_LEN, path);
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, "tokens,sequences,prefill_tokens,device_ms,idle_ms");
  uint64_t rows = 0;
  int64_t tokens_total = 0, prefill_total = 0;
  while (std::getline(in, line)) {
    long long tokens = 0, sequences = 0, prefill = 0;
    int used = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "%lld,%lld,%lld%n", &tokens, &sequences, &prefill, &used), 3) << line;
    EXPECT_EQ(line.substr(used), ",,") << "the CPU runner times no steps: device and idle ms stay empty";
    EXPECT_GE(tokens, 1);
    EXPECT_LE(tokens, 48) << "the token budget";
    EXPECT_GE(sequences, 1);
    EXPECT_LE(sequences, 8) << "max_num_seqs";
    EXPECT_LE(prefill, tokens);
    tokens_total += tokens, prefill_total += prefill;
    ++rows;
  }
  EXPECT_EQ(rows, r.metrics.steps);
  // 400 blocks hold every sequence at once (no preemption, nothing recomputed): the prefill rows are
  // the prompts' tokens less those the prefix cache had.
  ASSERT_EQ(r.metrics.preemptions, 0u);
  int64_t prompts = 0;
  for (const GenerationRequest& q : requests) prompts += static_cast<int64_t>(q.prompt.size()) * q.n;
  EXPECT_EQ(prefill_total, prompts - static_cast<int64_t>(r.metrics.prefix_hits));
  EXPECT_GT(tokens_total, prefill_total) << "decode rows too";
  std::remove(path.c_str());
}

// test_server_load's preemption case: 12 blocks of 4 tokens for 8 greedy requests of up to 32.
TEST(Engine, OverlappedSchedulingUnderATinyKvBudget) {
  const uint64_t seed = test::test_seed("Engine.OverlappedSchedulingUnderATinyKvBudget");
  std::mt19937_64 rng(seed);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r;
    r.id = "t" + std::to_string(i);
    for (int j = 0, n = 4 + static_cast<int>(rng() % 8); j < n; ++j)
      r.prompt.push_back(static_cast<int32_t>(rng() % 150000));
    r.sampling.temperature = 0.0f;
    r.stop.max_tokens = 20;
    r.stop.ignore_eos = true;
    requests.push_back(std::move(r));
  }
  const RunResult plain = run(false, requests, 12, {256, 16}, 40), overlapped = run(true, requests, 12, {256, 16}, 40);
  EXPECT_GT(overlapped.metrics.preemptions, 0u);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(overlapped.outputs.count(i) && overlapped.outputs.at(i).finished) << "request " << i;
    EXPECT_EQ(overlapped.outputs.at(i).tokens, plain.outputs.at(i).tokens) << "request " << i;
  }
  EXPECT_EQ(overlapped.metrics.kv_usage, 0.0);
}

TEST(Engine, AbortsWhileStepsAreInFlightLoseNothing) {
  const uint64_t seed = test::test_seed("Engine.AbortsWhileStepsAreInFlightLoseNothing");
  std::mt19937_64 rng(seed);
  EngineConfig ec;
  ec.max_model_len = MAX_MODEL_LEN;
  ec.limits = {8, 48};
  auto tokenizer = text::Tokenizer::load(model_dir());
  ASSERT_TRUE(tokenizer.is_ok());
  Engine engine(ec, cpu_runner(64), std::shared_ptr<const text::Tokenizer>(std::move(tokenizer.value())),
                {model_dir(), "default"});
  Sink sink;
  const size_t n = 12;
  for (size_t i = 0; i < n; ++i) {
    GenerationRequest r;
    r.id = "a" + std::to_string(i);
    for (int j = 0; j < 10; ++j) r.prompt.push_back(static_cast<int32_t>(rng() % 151000));
    r.stop.max_tokens = 60;
    r.stop.ignore_eos = true;
    r.on_output = sink.callback(i);
    ASSERT_TRUE(engine.submit(std::move(r)).is_ok());
  }
  // Abort every other request once it has produced something, while later steps run.
  for (size_t i = 0; i < n; i += 2) {
    while (sink.n_outputs_seen(i) == 0) std::this_thread::yield();
    engine.abort("a" + std::to_string(i));
  }
  sink.wait(n);
  engine.shutdown();
  const auto got = sink.results();
  for (size_t i = 0; i < n; ++i) {
    const Collected& c = got.at(i);
    ASSERT_TRUE(c.finished) << "request " << i;
    const FinishReason want = i % 2 == 0 ? FinishReason::ABORT : FinishReason::LENGTH;
    EXPECT_EQ(c.finish.at(0), want) << "request " << i;
    if (want == FinishReason::LENGTH) EXPECT_EQ(c.tokens.at(0).size(), 60u);
    EXPECT_EQ(c.completion_tokens, static_cast<int64_t>(c.tokens.at(0).size())) << "request " << i;
  }
  EXPECT_EQ(engine.metrics().kv_usage, 0.0);
}

// The runner's side: a step launched on the pending token of an uncollected step draws what the
// same step launched on the collected token draws.
TEST(Engine, RunnerResolvesPendingTokens) {
  const uint64_t seed = test::test_seed("Engine.RunnerResolvesPendingTokens");
  std::mt19937_64 rng(seed);
  std::vector<int32_t> prompt(9);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 151000);
  sampling::SamplingParams p;
  p.temperature = 0.9f, p.repetition_penalty = 1.2f, p.frequency_penalty = 0.3f, p.logprobs = 2;
  auto prefill = [&] {
    models::Batch b;
    b.token_ids = prompt;
    b.sequences.push_back({{0, 1, 2}, 0, static_cast<int64_t>(prompt.size())});
    b.logits_rows = {static_cast<int64_t>(prompt.size()) - 1};
    return b;
  };
  auto decode = [&](int32_t id) {
    models::Batch b;
    b.token_ids = {id};
    b.sequences.push_back({{0, 1, 2}, static_cast<int64_t>(prompt.size()), 1});
    b.logits_rows = {0};
    return b;
  };
  const uint64_t key = rng();
  auto row = [&](std::span<const int32_t> output, uint64_t position) {
    return SampleRow{&p, {prompt, output, {}}, {key, position}};
  };
  // Step by step.
  auto runner = cpu_runner(8);
  std::vector<sampling::SampledToken> first, second;
  SampleRow r0 = row({}, prompt.size());
  ASSERT_TRUE(runner->step(prefill(), {&r0, 1}, first).is_ok());
  const std::vector<int32_t> output = {first[0].token};
  SampleRow r1 = row(output, prompt.size() + 1);
  ASSERT_TRUE(runner->step(decode(first[0].token), {&r1, 1}, second).is_ok());
  // Overlapped: the decode step launched before the prefill step is collected.
  auto overlapped = cpu_runner(8);
  const std::vector<int32_t> pending = {models::pending_token(0)};
  SampleRow q1 = row(pending, prompt.size() + 1);
  ASSERT_TRUE(overlapped->launch(prefill(), {&r0, 1}).is_ok());
  ASSERT_TRUE(overlapped->launch(decode(models::pending_token(0)), {&q1, 1}).is_ok());
  EXPECT_FALSE(overlapped->launch(decode(1), {&q1, 1}).is_ok()) << "a third uncollected step";
  StepOutput a, b;
  ASSERT_TRUE(overlapped->collect(a).is_ok());
  ASSERT_TRUE(overlapped->collect(b).is_ok());
  EXPECT_FALSE(overlapped->collect(b).is_ok()) << "nothing left to collect";
  EXPECT_EQ(a.tokens[0].token, first[0].token);
  EXPECT_EQ(b.tokens[0].token, second[0].token);
  EXPECT_EQ(b.tokens[0].logprob, second[0].logprob);
  ASSERT_EQ(b.tokens[0].top.size(), 2u);
  EXPECT_EQ(b.tokens[0].top[1].token, second[0].top[1].token);
  // A pending id that names no row of the step before is refused.
  auto fresh = cpu_runner(8);
  EXPECT_FALSE(fresh->launch(decode(models::pending_token(0)), {&q1, 1}).is_ok());
}

}  // namespace
