// `nibble bench latency`: times the runner's steps directly. Prefill: one sequence, the whole prompt
// in one step. Decode: steps through runner.step (sampling included, as serving runs it: greedy, or
// the --temperature / --top-k / --top-p a request would ask, seeded).
// Batched decode: B sequences with batch_prompt-token prompts prefilled first, then steps of B tokens;
// mixed: the same steps, each also prefilling a new prompt of P tokens (after the decode rows, where
// the scheduler puts a new prompt).
#include "tools/bench/bench_latency.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>

#include "engine/model_runner.h"
#include "io/weight_plan.h"
#if NIBBLE_BENCH_CUDA
#include "cuda/moe/moe_decode.cuh"
#include "cuda/sampling/sampler.cuh"
#endif

namespace nibble::tools {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int64_t> int_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(std::stoll(item));
  return out;
}

// A decode step's bytes floor (docs/perf.md "Floors"): the weights it reads at even expert loads
// (io::bytes_per_decode_step) and the KV cache it attends over, at a bandwidth. Empty (no modules)
// where the checkpoint's quant config could not be read: the rows then have no floor.
struct DecodeFloor {
  io::ModelConfig config;
  std::vector<io::ModuleSpec> modules;
  int64_t kv_element_bytes = 2;
  double bytes_per_s = 4e12;

  struct Step {
    double weights, kv, tok_s;
  };
  // B sequences each attending over `keys` keys on average.
  Step step(int64_t B, double keys) const {
    const io::ModelConfig& c = config;
    const double weights = static_cast<double>(io::bytes_per_decode_step(c, modules, B));
    const double kv = static_cast<double>(B) * keys * static_cast<double>(c.num_hidden_layers) * 2.0 *
                      static_cast<double>(c.num_key_value_heads * c.head_dim * kv_element_bytes);
    return {weights, kv, static_cast<double>(B) * bytes_per_s / (weights + kv)};
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Sequence {
  models::BatchSequence seq;
  std::vector<int32_t> tokens;
};

class Bench {
 public:
  Bench(engine::ModelRunner& runner, uint64_t seed, const sampling::SamplingParams& params)
      : runner_(runner), rng_(seed), params_(params) {}

  // A fresh sequence of n random prompt tokens on its own blocks (from `first_block`).
  Sequence make(int64_t n, int64_t total, int32_t first_block) {
    Sequence s;
    const int64_t bs = runner_.block_size();
    for (int32_t b = 0; b < (total + bs - 1) / bs; ++b) s.seq.block_table.push_back(first_block + b);
    const uint64_t vocab = static_cast<uint64_t>(runner_.config().vocab_size);
    for (int64_t i = 0; i < n; ++i) s.tokens.push_back(static_cast<int32_t>(rng_() % vocab));
    return s;
  }

  // Prefills the sequences (chunks of at most `chunk` tokens, several sequences per step).
  Status prefill(std::vector<Sequence>& seqs, int64_t chunk) {
    size_t next = 0;
    while (next < seqs.size()) {
      models::Batch batch;
      std::vector<engine::SampleRow> rows;
      std::vector<size_t> members;
      while (next < seqs.size()) {
        Sequence& s = seqs[next];
        const int64_t left = static_cast<int64_t>(s.tokens.size()) - s.seq.start_position;
        const int64_t room = chunk - static_cast<int64_t>(batch.token_ids.size());
        if (room <= 0) break;
        const int64_t n = std::min(left, room);
        batch.token_ids.insert(batch.token_ids.end(), s.tokens.begin() + s.seq.start_position,
                               s.tokens.begin() + s.seq.start_position + n);
        models::BatchSequence bs = s.seq;
        bs.n_tokens = n;
        batch.sequences.push_back(bs);
        s.seq.start_position += n;
        if (s.seq.start_position == static_cast<int64_t>(s.tokens.size())) {
          batch.logits_rows.push_back(static_cast<int64_t>(batch.token_ids.size()) - 1);
          rows.push_back(row(s));
          members.push_back(next);
          ++next;
        }
      }
      engine::StepOutput out;
      NIB_RETURN_IF_ERROR(runner_.launch(batch, rows));
      NIB_RETURN_IF_ERROR(runner_.collect(out));
      for (size_t i = 0; i < members.size(); ++i) seqs[members[i]].tokens.push_back(out.tokens[i].token);
    }
    return Status::ok();
  }

  // `steps` decode steps for every sequence (each feeds its last token). Overlapped, as the serving
  // engine runs them: step k + 1 is launched on step k's pending tokens, then step k is collected.
  // prompt: also prefilled whole in every step, after the decode rows (its blocks rewritten each time).
  Status decode(std::vector<Sequence>& seqs, int64_t steps, bool overlap, const Sequence* prompt = nullptr) {
    for (int64_t k = 0; k < steps; ++k) {
      const bool pending = overlap && k > 0;
      models::Batch batch;
      std::vector<engine::SampleRow> rows;
      for (size_t i = 0; i < seqs.size(); ++i) {
        Sequence& s = seqs[i];
        batch.token_ids.push_back(pending ? models::pending_token(static_cast<int64_t>(i)) : s.tokens.back());
        models::BatchSequence bs = s.seq;
        bs.n_tokens = 1;
        batch.sequences.push_back(bs);
        batch.logits_rows.push_back(static_cast<int64_t>(i));
        rows.push_back(row(s, pending));
        s.seq.start_position += 1;
      }
      if (prompt) {
        batch.token_ids.insert(batch.token_ids.end(), prompt->tokens.begin(), prompt->tokens.end());
        models::BatchSequence bs = prompt->seq;
        bs.n_tokens = static_cast<int64_t>(prompt->tokens.size());
        batch.sequences.push_back(bs);
        batch.logits_rows.push_back(static_cast<int64_t>(batch.token_ids.size()) - 1);
        rows.push_back(row(*prompt));
      }
      NIB_RETURN_IF_ERROR(runner_.launch(batch, rows));
      if (overlap && k == 0) continue;
      NIB_RETURN_IF_ERROR(collect(seqs));
    }
    return overlap && steps > 0 ? collect(seqs) : Status::ok();
  }

 private:
  // Rows without penalties: no token lists to read. `pending`: a token of the sequence is still being drawn.
  engine::SampleRow row(const Sequence& s, bool pending = false) {
    return {&params_, {}, {1, static_cast<uint64_t>(s.tokens.size() + pending)}};
  }
  Status collect(std::vector<Sequence>& seqs) {
    engine::StepOutput out;
    NIB_RETURN_IF_ERROR(runner_.collect(out));
    for (size_t i = 0; i < seqs.size(); ++i) seqs[i].tokens.push_back(out.tokens[i].token);
    return Status::ok();
  }
  engine::ModelRunner& runner_;
  std::mt19937_64 rng_;
  sampling::SamplingParams params_;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

int run_bench_latency(const BenchLatencyOptions& o) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "nibble bench latency: %s\n", m.c_str());
    return 1;
  };
  const std::vector<int64_t> pp = int_list(o.pp), batches = int_list(o.batches), mixed = int_list(o.mixed);
  const int64_t max_batch = batches.empty() ? 1 : *std::max_element(batches.begin(), batches.end());
  const int64_t max_pp = pp.empty() ? 1 : *std::max_element(pp.begin(), pp.end());
  const int64_t max_mixed = mixed.empty() ? 0 : *std::max_element(mixed.begin(), mixed.end());
  sampling::SamplingParams params;  // the decode steps', checked before any model loads
  params.temperature = o.temperature, params.top_k = o.top_k, params.top_p = o.top_p, params.seed = 42;
  if (Status valid = params.validate(); !valid) return fail(valid.message());
  nlohmann::json rows = nlohmann::json::array();
  // The checkpoint's quant config, for the decode rows' floor (every mode's runner loads the same).
  std::optional<io::QuantConfig> quant;
  {
    std::ifstream in(o.model + "/config.json");
    std::stringstream text;
    text << in.rdbuf();
    if (Result<io::QuantConfig> q = io::load_quant_config(o.model, text.str()); q) quant = *q;
  }
  std::stringstream modes_in(o.modes);
  std::string mode_name;
  while (std::getline(modes_in, mode_name, ',')) {
    const auto mode = formats::parse_act_quant(mode_name);
    if (!mode) return fail("--modes: '" + mode_name + "' is not none, static or per-token");
    engine::RunnerOptions ro;
    const auto backend = engine::parse_backend(o.backend);
    const auto gemm = parse_dense_kernel(o.gemm_backend);
    const auto moe = parse_moe_kernel(o.moe_backend);
    const auto decode_attention = engine::parse_decode_attention(o.decode_attention);
    const auto attention = engine::parse_attention_backend(o.attention_backend);
    const auto kv_dtype = engine::parse_kv_cache_dtype(o.kv_cache_dtype);
    if (!backend || !gemm || !moe || !decode_attention || !attention || !kv_dtype)
      return fail(
          "--backend / --gemm-backend / --moe-backend / --attention-backend / --decode-attention / --kv-cache-dtype: "
          "unknown name");
    ro.kv_dtype = *kv_dtype;
    ro.decode_attention = *decode_attention;
    ro.attention = *attention;
    ro.backend = *backend;
    ro.gemm = *gemm;
    ro.moe = *moe;
    ro.act_quant_moe = ro.act_quant_dense = *mode;
    ro.max_num_seqs = std::max<int64_t>(max_batch, 1) + (max_mixed > 0);
    ro.max_num_batched_tokens =
        std::max<int64_t>({o.prefill_chunk > 0 ? o.prefill_chunk : max_pp, 2048, max_batch + max_mixed});
    ro.enforce_eager = o.enforce_eager;
    ro.config_overrides = {o.hf_overrides, o.rope_scaling};
    ro.tensor_parallel_size = o.tensor_parallel_size;
    ro.expert_parallel = o.expert_parallel;
    const Clock::time_point load_start = Clock::now();
    auto runner = engine::create_runner(o.model, ro);
    if (!runner) return fail(runner.status().message());
    const double load_s = seconds_since(load_start);
    engine::ModelRunner& r = **runner;
    const int64_t kv_element_bytes = *kv_dtype == engine::KvCacheDtype::FP8    ? 1
                                     : *kv_dtype == engine::KvCacheDtype::FP32 ? 4
                                                                               : 2;  // auto: BF16
    const DecodeFloor floor{r.config(), quant ? io::plan_modules(r.config(), *quant) : std::vector<io::ModuleSpec>{},
                            kv_element_bytes, o.hbm_tb_s * 1e12};
    // The floor of a decode row: a comment line after it and the row's JSON fields.
    auto report_floor = [&](const std::string& test, int64_t B, double keys, double tok_s) {
      if (floor.modules.empty()) return;
      const DecodeFloor::Step f = floor.step(B, keys);
      std::printf("# floor %s: %.3f GB a step (weights %.3f at even expert loads, KV %.3f) at %.2f TB/s: %.1f tok/s; "
                  "this row %.1f%% of it\n",
                  test.c_str(), (f.weights + f.kv) / 1e9, f.weights / 1e9, f.kv / 1e9, o.hbm_tb_s, f.tok_s,
                  100.0 * tok_s / f.tok_s);
      nlohmann::json& row = rows.back();
      row["floor_weight_bytes"] = f.weights, row["floor_kv_bytes"] = f.kv, row["floor_tok_s"] = f.tok_s;
      row["hbm_tb_s"] = o.hbm_tb_s;
    };
    const int64_t bs = r.block_size(), capacity = r.n_kv_blocks();
    auto need_blocks = [&](int64_t seqs, int64_t tokens) { return seqs * ((tokens + bs - 1) / bs); };
    auto report = [&](const std::string& test, int64_t tokens, double tok_s, double ms_step) {
      std::printf("%-10s %-14s %12lld %12.1f %10.3f\n", mode_name.c_str(), test.c_str(), static_cast<long long>(tokens),
                  tok_s, ms_step);
      rows.push_back({{"mode", mode_name},
                      {"test", test},
                      {"tokens", tokens},
                      {"tok_s", tok_s},
                      {"ms_per_step", ms_step},
                      {"backend", r.describe()},
                      {"load_s", load_s}});
    };
    std::printf("# %s on %s: loaded in %.1f s, %lld KV blocks of %lld\n", o.model.c_str(), r.describe().c_str(), load_s,
                static_cast<long long>(capacity), static_cast<long long>(bs));
    std::printf("%-10s %-14s %12s %12s %10s\n", "mode", "test", "tokens", "tok/s", "ms/step");
    Bench bench(r, 42, params);
    const bool overlap = !o.disable_overlap_schedule;
    for (int64_t n : pp) {
      if (need_blocks(1, n) > capacity) return fail("pp" + std::to_string(n) + " does not fit the KV cache");
      if (n > r.config().context_length())
        return fail("pp" + std::to_string(n) + " is past the model's context length (" +
                    std::to_string(r.config().context_length()) + ": --rope-scaling extends it)");
      std::vector<double> times;
      for (int64_t rep = 0; rep < o.repeats + 1; ++rep) {  // the first is warm-up
        std::vector<Sequence> one = {bench.make(n, n, 0)};
        const Clock::time_point t = Clock::now();
        Status s = bench.prefill(one, o.prefill_chunk > 0 ? o.prefill_chunk : n);
        if (!s) return fail(s.message());
        if (rep > 0) times.push_back(seconds_since(t));
      }
      const double t = median(times);
      report("pp" + std::to_string(n), n, n / t, t * 1e3);
    }
    if (o.tg > 0) {
      if (need_blocks(1, o.tg + 2) > capacity) return fail("tg does not fit the KV cache");
      std::vector<double> times;
      for (int64_t rep = 0; rep < o.repeats + 1; ++rep) {
        std::vector<Sequence> one = {bench.make(1, o.tg + 2, 0)};
        Status s = bench.prefill(one, 1);
        if (!s) return fail(s.message());
        const Clock::time_point t = Clock::now();
        if (Status d = bench.decode(one, o.tg, overlap); !d) return fail(d.message());
        if (rep > 0) times.push_back(seconds_since(t));
      }
      const double t = median(times);
      report("tg" + std::to_string(o.tg), o.tg, o.tg / t, t * 1e3 / o.tg);
      // Step k (k = 0 … tg − 1) attends over k + 2 keys: the prompt token, k decoded, its own.
      report_floor("tg" + std::to_string(o.tg), 1, (static_cast<double>(o.tg) + 3.0) / 2.0, o.tg / t);
#if NIBBLE_BENCH_CUDA
      // NIBBLE_DIAG_PHASE_TIMING=1: the one-launch MoE block's phases in the model (the last layer of the last step).
      if (const std::string phases = cuda::moe_decode_block_timing(r.config().hidden_size); !phases.empty())
        std::printf("# %s\n", phases.c_str());
      if (const std::string phases = cuda::sampler_timing(1); !phases.empty()) std::printf("# %s\n", phases.c_str());
#endif
    }
    const int64_t batch_prompt = o.context > 0 ? o.context : o.batch_prompt;
    const std::string at = o.context > 0 ? " @" + std::to_string(o.context) : "";
    for (int64_t B : batches) {
      // Room for the warm-up step, the timed steps and each mixed run's steps.
      const int64_t total = batch_prompt + o.batch_gen * (1 + static_cast<int64_t>(mixed.size())) + 2;
      const int64_t context_length = r.config().context_length(), steps = total - batch_prompt;
      if (total > context_length)
        return fail("--context " + std::to_string(batch_prompt) + " and its " + std::to_string(steps) +
                    " decode steps pass the model's context length (" + std::to_string(context_length) +
                    "): give a context at most " + std::to_string(context_length - steps));
      if (need_blocks(B, total) > capacity) {
        std::printf("%-10s %-14s skipped: %lld sequences of %lld tokens need more than %lld KV blocks\n",
                    mode_name.c_str(), ("S_TG b" + std::to_string(B) + at).c_str(), static_cast<long long>(B),
                    static_cast<long long>(total), static_cast<long long>(capacity));
        continue;
      }
      std::vector<Sequence> seqs;
      for (int64_t i = 0; i < B; ++i)
        seqs.push_back(bench.make(batch_prompt, total, static_cast<int32_t>(i * ((total + bs - 1) / bs))));
      Status s = bench.prefill(seqs, ro.max_num_batched_tokens);
      if (!s) return fail(s.message());
      if (Status w = bench.decode(seqs, 1, overlap); !w) return fail(w.message());  // warm-up step
      const Clock::time_point t = Clock::now();
      if (Status d = bench.decode(seqs, o.batch_gen, overlap); !d) return fail(d.message());
      const double secs = seconds_since(t);
      report("S_TG b" + std::to_string(B) + at, B * o.batch_gen, B * o.batch_gen / secs, secs * 1e3 / o.batch_gen);
      // Timed step k attends over batch_prompt + k + 2 keys (after the prefill's token and the warm-up step).
      report_floor("S_TG b" + std::to_string(B) + at, B,
                   static_cast<double>(batch_prompt) + (static_cast<double>(o.batch_gen) + 3.0) / 2.0,
                   B * o.batch_gen / secs);
      // The same steps with a new prompt each (tokens: decode rows and prompt tokens alike).
      for (int64_t P : mixed) {
        const std::string test = "mix b" + std::to_string(B) + "+p" + std::to_string(P);
        if (need_blocks(B, total) + need_blocks(1, P + 1) > capacity) {
          std::printf("%-10s %-14s skipped: the prompt does not fit the KV cache beside the batch\n", mode_name.c_str(),
                      test.c_str());
          continue;
        }
        const Sequence prompt = bench.make(P, P + 1, static_cast<int32_t>(need_blocks(B, total)));
        const Clock::time_point tm = Clock::now();
        if (Status d = bench.decode(seqs, o.batch_gen, overlap, &prompt); !d) return fail(d.message());
        const double mix_secs = seconds_since(tm);
        report(test, (B + P) * o.batch_gen, (B + P) * o.batch_gen / mix_secs, mix_secs * 1e3 / o.batch_gen);
      }
    }
  }
  if (!o.json_out.empty()) {
    std::ofstream out(o.json_out);
    out << rows.dump(2) << "\n";
    if (!out) return fail("cannot write " + o.json_out);
  }
  return 0;
}

}  // namespace nibble::tools
