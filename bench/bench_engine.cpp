// The engine's own CPU time per step (issue 16: ≤ 150 µs at 256 sequences): the real engine,
// scheduler, block manager, detokenizer (the Qwen3 tokenizer) and output callbacks, over a runner
// that does no model work and returns at once — so the time between one launch's return and the
// next launch's call (collecting the step before included) is the engine's.
// Usage: bench_engine [sequences=256] [prompt=1000] [output=200] [requests]
// With `requests` (> sequences) it is issue 16's workload 1 shape instead: that many requests, at most
// `sequences` in flight (a new one as one finishes, as a client's --max-concurrency does), prompt and
// output lengths spread ±50% around the given ones; every step counts. NIBBLE_DISABLE_OVERLAP_SCHEDULE=1
// runs the engine without overlapped scheduling.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"

using namespace nibble;
using Clock = std::chrono::steady_clock;

namespace {

// Draws a fixed pseudo-random token per (sequence seed, position): real token ids, so the
// detokenizer does real work; records when each launch was called and returned.
class NullRunner : public engine::ModelRunner {
 public:
  explicit NullRunner(io::ModelConfig config) : config_(std::move(config)) {}
  const io::ModelConfig& config() const override { return config_; }
  int64_t n_kv_blocks() const override { return 40000; }
  int64_t block_size() const override { return 16; }
  std::string describe() const override { return "null (no model work)"; }
  Status launch(const models::Batch& batch, std::span<const engine::SampleRow> rows) override {
    const Clock::time_point called = Clock::now();
    std::vector<sampling::SampledToken>& out = uncollected_.emplace_back();
    out.resize(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const uint64_t h = (rows[i].key.seed + 1) * 0x9E3779B97F4A7C15ull ^ rows[i].key.position * 0xBF58476D1CE4E5B9ull;
      out[i] = {};
      out[i].token = static_cast<int32_t>(1000 + (h >> 33) % 100000);  // ordinary text tokens of Qwen3
    }
    steps.push_back(
        {called, Clock::now(), static_cast<int64_t>(rows.size()), static_cast<int64_t>(batch.token_ids.size())});
    return Status::ok();
  }
  // Draws ignore masks: a null runner has no logits to mask (bench engine has no constrained rows).
  Status supply_masks(std::span<const uint32_t>) override { return Status::ok(); }
  Status collect(engine::StepOutput& out) override {
    if (uncollected_.empty()) return Status::error("collect: no step was launched");
    out.tokens = std::move(uncollected_.front());
    uncollected_.pop_front();
    return Status::ok();
  }
  Status forward_logits(const models::Batch&, std::vector<float>&) override { return Status::error("not a model"); }
  Status replace_weights(const std::string&) override { return Status::error("not a model"); }

  struct StepTimes {
    Clock::time_point called, returned;
    int64_t rows, tokens;
  };
  std::vector<StepTimes> steps;  // engine thread only; read after shutdown

 private:
  io::ModelConfig config_;
  std::deque<std::vector<sampling::SampledToken>> uncollected_;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p / 100.0 * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t sequences = argc > 1 ? std::atoll(argv[1]) : 256, prompt_len = argc > 2 ? std::atoll(argv[2]) : 1000,
                output_len = argc > 3 ? std::atoll(argv[3]) : 200;
  const int64_t requests = argc > 4 ? std::max<int64_t>(std::atoll(argv[4]), sequences) : sequences;
  const bool spread = requests > sequences;
  auto tokenizer = text::Tokenizer::load(std::string(NIBBLE_SOURCE_DATA_DIR) + "/qwen3-tokenizer");
  if (!tokenizer) {
    std::fprintf(stderr, "bench_engine: %s\n", tokenizer.status().message().c_str());
    return 1;
  }
  io::ModelConfig config;
  config.architecture = "Qwen3MoeForCausalLM";
  config.vocab_size = 151936;
  config.max_position_embeddings = 40960;
  auto runner = std::make_unique<NullRunner>(config);
  NullRunner* null_runner = runner.get();
  engine::EngineConfig ec;
  ec.limits.max_num_seqs = sequences;
  ec.max_model_len = 4096;
  ec.eos_token_ids = {151645};
  const char* no_overlap = std::getenv("NIBBLE_DISABLE_OVERLAP_SCHEDULE");  // serve's setting, as it reads it
  ec.overlap = !(no_overlap && std::string(no_overlap) != "0" && std::string(no_overlap) != "false");
  std::shared_ptr<const text::Tokenizer> shared_tokenizer(std::move(*tokenizer));
  engine::Engine eng(ec, std::move(runner), shared_tokenizer, {"null", "default"});

  std::mutex mutex;
  int64_t finished = 0, text_bytes = 0;
  std::mt19937_64 rng(0);
  auto length = [&](int64_t mean) {  // ±50%, as bench serve's --random-range-ratio 0.5
    return spread ? mean / 2 + static_cast<int64_t>(rng() % static_cast<uint64_t>(mean + 1)) : mean;
  };
  const Clock::time_point start = Clock::now();
  auto submit = [&](int64_t i) {
    engine::GenerationRequest r;
    r.id = "r" + std::to_string(i);
    const int64_t n_prompt = length(prompt_len);
    for (int64_t t = 0; t < n_prompt; ++t) r.prompt.push_back(static_cast<int32_t>(1000 + rng() % 100000));
    r.sampling.temperature = 0.0f;
    r.stop.max_tokens = std::max<int64_t>(length(output_len), 1);
    r.stop.ignore_eos = true;
    r.stop.stop = {"\n\nUser:"};                      // a stop string to watch for, as chat clients send
    r.on_output = [&](engine::RequestOutput&& out) {  // what the server's callback does: take the text
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& c : out.choices) text_bytes += static_cast<int64_t>(c.text.size());
      finished += out.finished;
    };
    return eng.submit(std::move(r));
  };
  int64_t submitted = 0;
  for (;;) {
    int64_t done;
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = finished;
    }
    if (done == requests) break;
    for (; submitted < std::min(requests, done + sequences); ++submitted)
      if (Status s = submit(submitted); !s) {
        std::fprintf(stderr, "bench_engine: %s\n", s.message().c_str());
        return 1;
      }
    std::this_thread::sleep_for(std::chrono::microseconds(spread ? 200 : 5000));
  }
  const double total = std::chrono::duration<double>(Clock::now() - start).count();
  const engine::MetricsSnapshot m = eng.metrics();
  eng.shutdown();

  // Engine time per step: from one launch's return to the next one's call, over steps that decode
  // every sequence (rows == sequences, one token each).
  std::vector<double> gaps_us, runner_us;
  const auto& steps = null_runner->steps;
  for (size_t i = 1; i < steps.size(); ++i) {
    runner_us.push_back(std::chrono::duration<double, std::micro>(steps[i].returned - steps[i].called).count());
    if (spread || (steps[i].rows == sequences && steps[i].tokens == sequences && steps[i - 1].rows == sequences))
      gaps_us.push_back(std::chrono::duration<double, std::micro>(steps[i].called - steps[i - 1].returned).count());
  }
  double mean = 0;
  for (double g : gaps_us) mean += g / static_cast<double>(gaps_us.size());
  std::printf(
      "sequences %lld, prompt %lld, output %lld%s, %lld requests: %zu steps (%zu %s), %.2f s, %lld text bytes\n",
      (long long)sequences, (long long)prompt_len, (long long)output_len, spread ? " (±50%)" : "", (long long)requests,
      steps.size(), gaps_us.size(), spread ? "timed" : "full decode steps", total, (long long)text_bytes);
  std::printf(
      "engine CPU time per %sstep: mean %.1f us, p50 %.1f, p90 %.1f, p99 %.1f (%.2f us per sequence); "
      "null runner %.1f us\n",
      spread ? "" : "decode ", mean, percentile(gaps_us, 50), percentile(gaps_us, 90), percentile(gaps_us, 99),
      mean / static_cast<double>(sequences), percentile(runner_us, 50));
  std::printf(
      "the engine's own step timers (/metrics): %.1f us of engine work and %.1f us in the runner per step, "
      "over all %llu steps\n",
      m.step_engine_seconds / static_cast<double>(m.steps) * 1e6,
      m.step_model_seconds / static_cast<double>(m.steps) * 1e6, (unsigned long long)m.steps);
  return gaps_us.empty() ? 1 : 0;
}
