// `nibble serve`: the OpenAI-compatible HTTP server around the engine. start() listens at once
// (503 while the model loads), wait() returns when a stop was asked for and everything has ended.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "server/http_server.h"

namespace nibble::server {

struct ServerOptions {
  std::string model_path;
  std::string served_model_name;  // default: the model path
  std::string host = "0.0.0.0";
  uint16_t port = 8000;
  uint16_t metrics_port = 0;  // 0: /metrics on the main port only
  int64_t max_model_len = 0;  // 0: the model's, capped by KV capacity
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 8192;
  int64_t block_size = 16;
  int64_t num_kv_blocks = 0;             // 0: from kv_cache_memory_gb
  double kv_cache_memory_gb = 0.0;       // 0: measured by the runner (engine::RunnerOptions)
  double gpu_memory_utilization = 0.90;  // vLLM's flag: the GPU memory share weights + KV may take
  bool enforce_eager = false;            // vLLM's flag: no CUDA graphs
  bool enable_prefix_caching = true;
  bool disable_overlap_schedule = false;  // SGLang's flag: collect each step before building the next
  bool skip_server_warmup = false;        // SGLang's flag: no Engine::warm_up before serving (GPU backend)
  std::string step_log;                   // a CSV row per collected step (tokens, sequences, device time); "": none
  double scheduler_delay_factor = 0.0;    // vLLM's flag: hold new prompts to batch their prefills
  std::string kv_cache_dtype = "auto";    // auto | bf16
  std::string backend = "auto";           // auto | cpu | cuda
  std::string moe_backend = "auto";       // core/kernel_choice.h's names (CUDA backend)
  std::string gemm_backend = "auto";
  std::string attention_backend = "auto";  // flashinfer | native | auto (CUDA backend)
  std::string decode_attention = "auto";   // split-kv | tensor-core | auto (CUDA backend, native attention)
  std::string act_quant_moe = "none";      // none | static | per-token
  std::string act_quant_dense = "none";
  // config.json changes (JSON objects; "": none): vLLM's --hf-overrides, merged key by key, and
  // --rope-scaling merged into its RoPE scaling (e.g. Qwen's YaRN for 131,072 tokens).
  std::string hf_overrides, rope_scaling;
  // One model over this many ranks (tensor parallelism; with expert_parallel the experts are dealt
  // out whole and attention stays tensor-parallel): engine::RunnerOptions.
  int64_t tensor_parallel_size = 1;
  bool expert_parallel = false;
  // The ranks over several hosts (SGLang's flags): node 0 serves, the others (node_rank > 0) run their
  // ranks for it (engine::RunnerOptions).
  int nnodes = 1, node_rank = 0;
  std::string dist_init_addr;
  // Data parallelism: this many engines, each a copy of the model on its own GPU (engine i on
  // visible device i mod the device count: two engines may share a card), behind this endpoint.
  int64_t data_parallel_size = 1;
  // On SIGTERM / SIGINT: up to this many seconds for running requests to finish while new ones get
  // 503 (behind a router: nothing is lost when a worker stops); 0 ends them at once (finish_reason abort).
  double shutdown_timeout = 0.0;
  std::string reasoning_parser = "auto";  // auto | qwen3 | none
  std::string api_key;  // when set, every route but /health and /metrics needs "Authorization: Bearer KEY"
  // CORS (vLLM's flags and defaults): JSON lists, e.g. ["https://app.example"]; "*" allows any.
  std::string allowed_origins = R"(["*"])", allowed_methods = R"(["*"])", allowed_headers = R"(["*"])";
  bool allow_credentials = false;
  int io_threads = 0;  // 0: min(4, cores)
  std::string weight_version = "default";
  std::string version;  // reported by /version and /get_server_info
};

// The main port's routes, for tests that must cover every one (e.g. that --api-key guards all).
struct RouteInfo {
  std::string path;
  std::vector<std::string> methods;  // "GET", "POST"
  bool needs_api_key;                // when --api-key is set
};
std::vector<RouteInfo> route_table();

// Checks option values that need no model (ranges, names); the error names the flag.
Status validate_options(const ServerOptions& options);
// A node of a group over hosts other than node 0 (--node-rank > 0): no API; its ranks run node 0's
// steps until node 0 stops (ok) or a step fails here (engine::follow_node).
Status follow_node(const ServerOptions& options);

// The CORS flags as the HTTP layer takes them; a value that is not a JSON list of strings is an error.
Result<CorsPolicy> cors_policy(const ServerOptions& options);

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  Status start();
  // Blocks until stop() (or a fatal load error); returns the process exit status.
  int wait();
  // Graceful: stop accepting, end every request (finish_reason abort), flush, close. Any thread;
  // safe from a signal-handling thread.
  void stop();
  uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nibble::server
