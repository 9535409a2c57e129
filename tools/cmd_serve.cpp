// `nibble serve`: the OpenAI-compatible server. Flags in the style of vLLM/SGLang, each also read
// from NIBBLE_<FLAG> (e.g. NIBBLE_MAX_MODEL_LEN); without --model it serves the small trained model
// in data/default-model, so it works (and answers GSM8K-like questions) on a fresh machine.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <type_traits>

#include "core/log.h"
#include "engine/runner_options.h"
#include "server/server.h"
#include "tools/command.h"
#include "tools/seed_flags.h"
#include "tools/synth.h"
#include "tools/version.h"

namespace nibble::tools {
namespace {

namespace fs = std::filesystem;

constexpr const char* DEFAULT_MODEL_NAME = "nibble-tiny-moe-gsm8k";

// NIBBLE_<FLAG>: --max-model-len → NIBBLE_MAX_MODEL_LEN.
std::string env_name(const std::string& flag) {
  std::string name = "NIBBLE_";
  for (char c : flag.substr(2)) name += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

// A bool is a flag, as vLLM's and SGLang's are (`--enforce-eager`; `--enforce-eager=false` also parses).
template <typename T>
CLI::Option* option(CLI::App* cmd, const std::string& flag, T& value, const std::string& help) {
  const std::string text = help + " [env " + env_name(flag) + "]";
  if constexpr (std::is_same_v<T, bool>) return cmd->add_flag(flag, value, text)->envname(env_name(flag));
  // Given twice, the last one wins (argparse's rule, so a script can append to a base command line).
  else
    return cmd->add_option(flag, value, text)
        ->envname(env_name(flag))
        ->capture_default_str()
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

// The embedded default: the small trained model shipped in data/default-model (issue 18; made by
// scripts/train_tiny_moe.py, described in its README.md).
Result<std::string> default_model() {
  const fs::path dir = fs::path(data_dir()) / "default-model";
  if (!fs::exists(dir / "config.json"))
    return Status::error("no --model and no embedded model at " + dir.string() +
                         " (set NIBBLE_DATA_DIR to nibble's data/)");
  return dir.string();
}

int run_serve(server::ServerOptions options) {
  if (options.model_path.empty()) {
    Result<std::string> path = default_model();
    if (!path) {
      std::fprintf(stderr, "nibble serve: %s\n", path.status().message().c_str());
      return 1;
    }
    options.model_path = *path;
    if (options.served_model_name.empty()) options.served_model_name = DEFAULT_MODEL_NAME;
  }
  options.version = NIBBLE_VERSION_STRING;
  if (Status s = server::validate_options(options); !s) {
    std::fprintf(stderr, "nibble serve: %s\n", s.message().c_str());
    return 2;
  }
  if (options.node_rank > 0) {  // another node's ranks: no API
    if (Status s = server::follow_node(options); !s) {
      std::fprintf(stderr, "nibble serve: %s\n", s.message().c_str());
      return 1;
    }
    return 0;
  }
  // SIGINT/SIGTERM are taken by one thread that asks the server to stop gracefully.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  server::Server server(options);
  if (Status s = server.start(); !s) {
    std::fprintf(stderr, "nibble serve: %s\n", s.message().c_str());
    return 1;
  }
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    const timespec tick{0, 200'000'000};
    while (!done) {
      if (sigtimedwait(&signals, nullptr, &tick) > 0) {
        log_info("signal received: stopping");
        server.stop();
        return;
      }
    }
  });
  const int status = server.wait();
  done = true;
  watcher.join();
  return status;
}

}  // namespace

CommandRunner register_serve(CLI::App& root) {
  auto* cmd = root.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  auto o = std::make_shared<server::ServerOptions>();
  option(cmd, "--model", o->model_path, "Model folder (default: the small trained model in data/default-model)");
  option(cmd, "--served-model-name", o->served_model_name, "Model name in the API (default: the model path)");
  option(cmd, "--host", o->host, "Address to listen on");
  option(cmd, "--port", o->port, "Port");
  option(cmd, "--metrics-port", o->metrics_port, "Also serve /metrics on this port (0: off)");
  option(cmd, "--max-model-len", o->max_model_len,
         "Prompt + output tokens per request (0: the model's context length, capped by KV)");
  option(cmd, "--hf-overrides", o->hf_overrides,
         "JSON object merged into the model's config.json before it is read (vLLM's flag), e.g. "
         "'{\"max_position_embeddings\": 65536}'");
  option(cmd, "--rope-scaling", o->rope_scaling,
         "JSON object merged into the config's RoPE scaling, e.g. Qwen's YaRN for 131,072 tokens: "
         "'{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 32768}' "
         "(default, linear and yarn)");
  option(cmd, "--max-num-seqs", o->max_num_seqs, "Sequences per step");
  option(cmd, "--max-num-batched-tokens", o->max_num_batched_tokens, "Tokens per step (prefill chunks share it)");
  option(cmd, "--scheduler-delay-factor", o->scheduler_delay_factor,
         "Admit new prompts only once the oldest waiting one has waited this many times the last prompt step's "
         "latency (vLLM's flag; 0: at once), so that prompts arriving close together share a prefill step");
  option(cmd, "--block-size", o->block_size, "KV-cache block size in tokens");
  option(cmd, "--num-kv-blocks", o->num_kv_blocks, "KV-cache blocks (0: from --kv-cache-memory-gb)");
  option(cmd, "--kv-cache-memory-gb", o->kv_cache_memory_gb,
         "KV-cache memory when --num-kv-blocks is 0 (0: measured; CPU: min(1 GiB, a quarter of free memory))");
  option(cmd, "--gpu-memory-utilization", o->gpu_memory_utilization,
         "Share of GPU memory for weights, workspaces and the KV cache (CUDA backend)");
  option(cmd, "--kv-cache-dtype", o->kv_cache_dtype,
         "KV-cache dtype: auto | bf16 | fp8 (E4M3, unit scale; = fp8_e4m3)");
  option(cmd, "--enable-prefix-caching", o->enable_prefix_caching, "Reuse KV blocks of shared prompt prefixes");
  option(cmd, "--enforce-eager", o->enforce_eager, "CUDA backend: no CUDA graphs for decode steps");
  option(cmd, "--disable-overlap-schedule", o->disable_overlap_schedule,
         "Build each step after the last one's tokens are back (default: the next step is built and queued "
         "while the GPU runs the current one)");
  option(cmd, "--skip-server-warmup", o->skip_server_warmup,
         "Serve without the warm-up (GPU backend: a 16- and a 2,048-token prompt run before the server is ready, "
         "so that a first request does not wait while CUDA loads the kernels it uses)");
  option(cmd, "--step-log", o->step_log,
         "Write a CSV row per step to this file: its tokens, sequences, prefill tokens, device ms and the device's "
         "idle ms before it (tuning --max-num-batched-tokens)");
  option(cmd, "--tensor-parallel-size", o->tensor_parallel_size,
         "Ranks per model: attention heads and MLP widths split over them (Megatron's split; vocabulary-parallel "
         "embedding and lm_head), each rank loading only its slices: on the GPU rank r takes visible GPU r (NCCL "
         "between them); on the CPU a thread each. Also --tp, --tp-size");
  option(cmd, "--nnodes", o->nnodes,
         "Hosts the --tensor-parallel-size ranks span (SGLang's flags): each runs tensor-parallel-size / nnodes "
         "ranks on its GPUs; start `nibble serve` with the same model and flags on each, adding --node-rank");
  option(cmd, "--node-rank", o->node_rank,
         "This host's place among --nnodes: 0 serves the API and drives the others, which only run their ranks");
  option(cmd, "--dist-init-addr", o->dist_init_addr,
         "host:port where node 0 listens for the other nodes (bootstrap and control; tensors move through NCCL)");
  option(cmd, "--enable-expert-parallel", o->expert_parallel,
         "With --tensor-parallel-size N: the experts dealt out whole over the N ranks instead of split by width "
         "(attention stays tensor-parallel)");
  option(cmd, "--data-parallel-size", o->data_parallel_size,
         "Engines, each a copy of the model on its own GPU (engine i on visible GPU i mod the GPU count; engines "
         "sharing a GPU split its memory), behind this endpoint; requests go to the engine holding their prefix, "
         "else the least loaded (docs/deploy.md). Also --dp, --dp-size");
  option(cmd, "--shutdown-timeout", o->shutdown_timeout,
         "On SIGTERM: seconds for running requests to finish while new ones get 503 (a router retries them "
         "elsewhere); 0 ends them at once");
  for (const char* alias : {"--dp", "--dp-size"})  // vLLM's and SGLang's short spellings
    cmd->add_option(alias, o->data_parallel_size)->group("")->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  for (const char* alias : {"--tp", "--tp-size"})
    cmd->add_option(alias, o->tensor_parallel_size)->group("")->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  option(cmd, "--backend", o->backend,
         "auto (the GPU when one is visible and takes the checkpoint, else the CPU) | cpu | cuda");
  option(cmd, "--moe-backend", o->moe_backend,
         "The MoE's kernels (CUDA backend): auto (by measured shape) | cublas (experts dequantized to BF16, "
         "cuBLAS grouped GEMM) | one kernel by name: " +
             choices_help(moe_kernel_names()));
  option(cmd, "--gemm-backend", o->gemm_backend,
         "Dense NVFP4 kernels (CUDA backend): auto (by measured shape) | cublas (weights dequantized to BF16) | "
         "one kernel by name: " +
             choices_help(dense_kernel_names()));
  option(cmd, "--attention-backend", o->attention_backend, "auto | flashinfer | native (CUDA backend)");
  option(cmd, "--decode-attention", o->decode_attention,
         "Native attention's decode kernel: auto | split-kv | tensor-core (CUDA backend)");
  option(cmd, "--act-quant-moe", o->act_quant_moe, "MoE activation quantization: none | static | per-token");
  option(cmd, "--act-quant-dense", o->act_quant_dense, "Dense activation quantization: none | static | per-token");
  option(cmd, "--reasoning-parser", o->reasoning_parser, "Split <think> into reasoning_content: auto | qwen3 | none");
  option(cmd, "--api-key", o->api_key, "Require 'Authorization: Bearer KEY' on every route but /health and /metrics");
  option(cmd, "--allowed-origins", o->allowed_origins,
         "CORS: origins allowed, a JSON list (vLLM's flag; [\"*\"]: any)");
  option(cmd, "--allowed-methods", o->allowed_methods, "CORS: methods allowed, a JSON list");
  option(cmd, "--allowed-headers", o->allowed_headers, "CORS: request headers allowed, a JSON list");
  option(cmd, "--allow-credentials", o->allow_credentials,
         "CORS: allow credentials (the origin is then echoed, not *)");
  option(cmd, "--io-threads", o->io_threads, "HTTP threads (0: up to 4)");
  option(cmd, "--weight-version", o->weight_version, "Weight version reported by /get_model_info");
  // SGLang's name for the MoE kernel choice, and FastDeploy's / SGLang's environment variables
  // (tools/seed_flags.h): honoured with a start-up line saying what each became.
  auto moe_runner = std::make_shared<std::string>();
  cmd->add_option("--moe-runner-backend", *moe_runner,
                  "SGLang's MoE kernel choice: mapped to --moe-backend (docs/api.md)");
  return [o, moe_runner, cmd] {
    const ExplicitServeFlags given{cmd->get_option("--moe-backend")->count() > 0,
                                   cmd->get_option("--gemm-backend")->count() > 0,
                                   cmd->get_option("--act-quant-moe")->count() > 0};
    for (const std::string& line :
         apply_seed_flags(*o, given, *moe_runner, [](const char* n) { return std::getenv(n); }))
      log_info(line);
    return run_serve(*o);
  };
}

}  // namespace nibble::tools
