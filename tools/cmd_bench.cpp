// `nibble bench serve`: the serving benchmark (tools/bench/bench_serve.h), flags named as
// `vllm bench serve` names them.
#include <limits>

#include "engine/runner_options.h"
#include "tools/bench/bench_kernels.h"
#include "tools/bench/bench_latency.h"
#include "tools/bench/bench_routing.h"
#include "tools/bench/bench_serve.h"
#include "tools/command.h"

namespace nibble::tools {

CommandRunner register_bench(CLI::App& root) {
  auto* bench = root.add_subcommand(
      "bench",
      "Benchmarks: serve (a serving benchmark against any OpenAI-compatible server), "
      "latency (offline prefill/decode through a runner), kernels (CUDA ops), routing (expert loads)");
  bench->require_subcommand(1);
  auto* cmd = bench->add_subcommand("serve", "Serving benchmark: TTFT, TPOT, ITL, E2E latency and throughput");
  auto o = std::make_shared<BenchServeOptions>();
  auto rate = std::make_shared<std::string>("inf");
  cmd->add_option("--base-url", o->base_url, "Server URL, http://host:port (else --host/--port)");
  cmd->add_option("--host", o->host, "Server host")->capture_default_str();
  cmd->add_option("--port", o->port, "Server port")->capture_default_str();
  cmd->add_option("--endpoint", o->endpoint, "Path (default: per backend)");
  cmd->add_option("--backend", o->backend, "openai-completions | openai-chat | nibble (/generate)")
      ->check(CLI::IsMember({"openai-completions", "openai-chat", "nibble"}))
      ->capture_default_str();
  cmd->add_option("--model", o->model, "Model name sent (default: the server's first model)");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "Folder with tokenizer.json (default: --model if a folder, else the server's)");
  cmd->add_option("--dataset-name", o->dataset_name, "random | sharegpt | jsonl")
      ->check(CLI::IsMember({"random", "sharegpt", "jsonl"}))
      ->capture_default_str();
  cmd->add_option("--dataset-path", o->dataset_path, "ShareGPT JSON or JSONL file");
  cmd->add_option("--num-prompts", o->random.num_prompts, "Requests to send")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--random-input-len", o->random.input_len, "Random dataset: prompt tokens")->capture_default_str();
  cmd->add_option("--random-output-len", o->random.output_len, "Random dataset: output tokens")->capture_default_str();
  cmd->add_option("--random-range-ratio", o->random.range_ratio, "Random dataset: lengths in [len(1-r), len(1+r)]")
      ->capture_default_str();
  cmd->add_option("--random-prefix-len", o->random.prefix_len, "Random dataset: shared prefix tokens")
      ->capture_default_str();
  cmd->add_option("--output-len", o->output_len,
                  "sharegpt/jsonl: output tokens for every request (default: the dataset's)");
  cmd->add_option("--max-concurrency", o->max_concurrency, "Requests in flight at most (0: no cap)")
      ->capture_default_str();
  cmd->add_option("--request-rate", *rate, "Requests per second (Poisson, or gamma with --burstiness), or inf")
      ->capture_default_str();
  cmd->add_option("--burstiness", o->burstiness, "Gamma shape of the arrival gaps (1: Poisson)")->capture_default_str();
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Ask the server to ignore EOS (exact output lengths)");
  cmd->add_option("--seed", o->random.seed, "Seed for prompts and arrivals")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "Sampling temperature")->capture_default_str();
  cmd->add_option("--percentile-metrics", o->percentile_metrics,
                  "Printed metrics: ttft,tpot,itl,e2el (vLLM's); s_ttft,s_itl,s_e2el,s_decode,input_len,"
                  "s_input_len,output_len (FastDeploy's, from the server's arrival_time)")
      ->capture_default_str();
  cmd->add_option("--metric-percentiles", o->metric_percentiles, "Percentiles, e.g. 80,95,99,99.9")
      ->capture_default_str();
  cmd->add_flag("--save-result", o->save_result, "Write the result JSON (vLLM's field names)");
  cmd->add_option("--result-dir", o->result_dir, "Folder for --save-result")->capture_default_str();
  cmd->add_option("--result-filename", o->result_filename, "File name for --save-result");
  cmd->add_flag("--disable-tqdm", o->disable_progress, "No progress bar");
  cmd->add_option("--structured", o->structured,
                  "Structured output on every request: none | json-schema | regex | choice (vLLM's "
                  "structured_outputs; /generate: SGLang's sampling params)")
      ->check(CLI::IsMember({"none", "json-schema", "regex", "choice"}))
      ->capture_default_str();
  cmd->add_option("--structured-file", o->structured_file,
                  "The constraint: a JSON schema, a regex, or a JSON list of choices (default: a built-in one "
                  "that runs to the output length)");
  auto* kernels =
      bench->add_subcommand("kernels", "CUDA kernel benchmark on a model's shapes against the floor and cuBLAS BF16");
  auto k = std::make_shared<BenchKernelsOptions>();
  kernels->add_option("--ops", k->ops, "Benchmarks to run: dense, moe, attention (comma-separated)")
      ->capture_default_str();
  kernels
      ->add_option("--shapes", k->shapes,
                   "Whose shapes: qwen3-30b-a3b | ernie-4.5-21b-a3b (its MoE also with the "
                   "2 shared experts as 2 more routed ones)")
      ->check(CLI::IsMember({"qwen3-30b-a3b", "ernie-4.5-21b-a3b"}))
      ->capture_default_str();
  kernels->add_option("--m", k->m_values, "Dense: token counts (rows of x)")->capture_default_str();
  kernels->add_option("--moe-tokens", k->moe_tokens, "MoE: token counts")->capture_default_str();
  kernels
      ->add_option("--attention-contexts", k->attention_contexts,
                   "Decode attention (one token, the layer's attention half): context lengths")
      ->capture_default_str();
  std::vector<std::string> dense = dense_kernel_names(), moe = moe_kernel_names();
  dense.insert(dense.begin(), "all"), moe.insert(moe.begin(), "all");
  kernels->add_option("--gemm-backend", k->gemm_backend, "Dense kernels to time: " + choices_help(dense))
      ->check(CLI::IsMember(dense))
      ->envname("NIBBLE_GEMM_BACKEND")
      ->capture_default_str();
  kernels->add_option("--moe-backend", k->moe_backend, "MoE kernels to time: " + choices_help(moe))
      ->check(CLI::IsMember(moe))
      ->envname("NIBBLE_MOE_BACKEND")
      ->capture_default_str();
  kernels
      ->add_option("--router-skew", k->router_skew,
                   "MoE: route with expert popularity from a Zipf law of this exponent (0: uniform; inputs with a "
                   "common direction, routers placed against it as `nibble synth --router-skew` does); default: "
                   "random router rows over isotropic inputs")
      ->check(CLI::NonNegativeNumber);
  kernels->add_option("--hbm-tb-s", k->hbm_tb_s, "HBM bandwidth for the floor")->capture_default_str();
  kernels->add_option("--bf16-tflops", k->bf16_tflops, "BF16 peak for the floor")->capture_default_str();
  kernels->add_option("--iterations", k->iterations, "Launches per timed batch")->capture_default_str();
  kernels->add_option("--batches", k->batches, "Timed batches (median reported)")->capture_default_str();
  kernels->add_option("--json", k->json_out, "Also write the rows as JSON");
  auto* latency = bench->add_subcommand(
      "latency", "Offline prefill and decode throughput (llama-bench style) through a model runner");
  auto l = std::make_shared<BenchLatencyOptions>();
  latency->add_option("--model", l->model, "Model folder")->required();
  latency->add_option("--backend", l->backend, "auto | cpu | cuda")->capture_default_str();
  latency->add_option("--modes", l->modes, "Activation modes (MoE and dense alike): none,static,per-token")
      ->capture_default_str();
  latency->add_option("--gemm-backend", l->gemm_backend, choices_help(dense_kernel_names()))->capture_default_str();
  latency->add_option("--moe-backend", l->moe_backend, choices_help(moe_kernel_names()))
      ->envname("NIBBLE_MOE_BACKEND")
      ->capture_default_str();
  latency->add_option("--attention-backend", l->attention_backend, "auto | flashinfer | native")->capture_default_str();
  latency->add_option("--kv-cache-dtype", l->kv_cache_dtype, "auto | bf16 | fp8 (E4M3, unit scale) | fp32 (CPU)")
      ->capture_default_str();
  latency
      ->add_option("--decode-attention", l->decode_attention,
                   "Native attention's decode kernel: auto | split-kv | tensor-core")
      ->capture_default_str();
  latency->add_option("--pp", l->pp, "Prefill lengths (ppN)")->capture_default_str();
  latency->add_option("--tg", l->tg, "Single-stream decode tokens (tgN; 0: skip)")->capture_default_str();
  latency->add_option("--batches", l->batches, "Batched decode: parallel sequences (S_TG)")->capture_default_str();
  latency->add_option("--batch-prompt", l->batch_prompt, "Batched decode: prompt tokens per sequence")
      ->capture_default_str();
  latency->add_option("--batch-gen", l->batch_gen, "Batched decode: timed steps")->capture_default_str();
  latency
      ->add_option("--context", l->context,
                   "Batched decode at this context: the sequences' prompt length (overrides --batch-prompt)")
      ->capture_default_str();
  latency
      ->add_option("--hbm-tb-s", l->hbm_tb_s,
                   "Memory bandwidth for the decode rows' bytes floor (weights at even expert loads + KV)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  latency->add_option("--prefill-chunk", l->prefill_chunk, "ppN in steps of at most this many tokens (0: one step)")
      ->capture_default_str();
  latency->add_option("--tensor-parallel-size,--tp", l->tensor_parallel_size,
                      "Ranks of one model (as nibble serve's): on the GPU, rank r on visible GPU r")
      ->capture_default_str();
  latency->add_flag("--enable-expert-parallel", l->expert_parallel,
                    "With --tensor-parallel-size N: the experts dealt out whole over the ranks (as nibble serve's)");
  latency->add_option("--hf-overrides", l->hf_overrides, "JSON object merged into config.json (as nibble serve's)");
  latency->add_option("--rope-scaling", l->rope_scaling,
                      "JSON object merged into the config's RoPE scaling (as nibble serve's), e.g. YaRN for 128k");
  latency->add_option("--mixed", l->mixed,
                      "Mixed steps: prompt lengths P; each batch's timed steps again, each step also prefilling a "
                      "new P-token prompt (serving's steps with a prompt); reported as mix bB+pP");
  latency->add_option("--temperature", l->temperature, "Decode steps' sampling temperature (0: greedy)")
      ->capture_default_str();
  latency->add_option("--top-k", l->top_k, "Decode steps' top-k (0: off)")->capture_default_str();
  latency->add_option("--top-p", l->top_p, "Decode steps' top-p (1: off)")->capture_default_str();
  latency->add_option("--repeats", l->repeats, "pp/tg: runs (median)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  latency->add_flag("--enforce-eager", l->enforce_eager, "No CUDA graphs");
  latency->add_flag("--disable-overlap-schedule", l->disable_overlap_schedule,
                    "Collect each decode step before launching the next (default: launched as the serving engine "
                    "does, step k + 1 on step k's pending tokens)");
  latency->add_option("--json", l->json_out, "Also write the rows as JSON");
  auto r = std::make_shared<BenchRoutingOptions>();
  auto* routing = bench->add_subcommand(
      "routing", "The expert loads a checkpoint's routers give, by MoE layer (CPU forward over random tokens)");
  routing->add_option("--model", r->model, "Model folder")->required();
  routing->add_option("--tokens", r->tokens, "Tokens a sequence")->capture_default_str();
  routing->add_option("--sequences", r->sequences, "Sequences, routed as one batch")->capture_default_str();
  routing->add_option("--seed", r->seed, "Seed of the random tokens")->capture_default_str();
  routing->add_option("--json", r->json_out, "Also write each layer's statistics and expert rows as JSON");
  return [o, rate, cmd, kernels, k, latency, l, routing, r]() -> int {
    if (kernels->parsed()) return run_bench_kernels(*k);
    if (routing->parsed()) return run_bench_routing(*r);
    if (latency->parsed()) return run_bench_latency(*l);
    if (!cmd->parsed()) return 2;
    try {
      o->request_rate = *rate == "inf" ? std::numeric_limits<double>::infinity() : std::stod(*rate);
    } catch (const std::exception&) {
      std::fprintf(stderr, "nibble bench serve: --request-rate '%s' is not a number or inf\n", rate->c_str());
      return 2;
    }
    return run_bench_serve(*o);
  };
}

}  // namespace nibble::tools
