// Server: option checks, model loading in the background (503 until ready), the route table,
// io threads, and the graceful stop (abort everything, let the last bytes go out, close).
#include "server/server.h"

#include <sys/resource.h>

#include <boost/asio/post.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "engine/cuda_runner.h"
#include "engine/model_runner.h"
#include "server/context.h"
#include "server/generation_job.h"
#include "server/structured_output.h"

namespace nibble::server {
namespace {

template <class Names>
Status check_member(const char* flag, const std::string& value, const Names& allowed) {
  std::string list;
  for (const auto& a : allowed) {
    if (value == a) return Status::ok();
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  return Status::error(std::string(flag) + " '" + value + "' is not one of: " + list);
}

engine::RunnerOptions runner_options(const ServerOptions& o) {
  engine::RunnerOptions r;  // validate_options checked every name
  r.backend = *engine::parse_backend(o.backend);
  r.gemm = *parse_dense_kernel(o.gemm_backend);
  r.moe = *parse_moe_kernel(o.moe_backend);
  r.attention = *engine::parse_attention_backend(o.attention_backend);
  r.decode_attention = *engine::parse_decode_attention(o.decode_attention);
  r.act_quant_moe = formats::parse_act_quant(o.act_quant_moe).value();
  r.act_quant_dense = formats::parse_act_quant(o.act_quant_dense).value();
  r.kv_dtype = *engine::parse_kv_cache_dtype(o.kv_cache_dtype);
  r.block_size = o.block_size;
  r.num_kv_blocks = o.num_kv_blocks;
  r.kv_cache_memory_gb = o.kv_cache_memory_gb;
  r.gpu_memory_utilization = o.gpu_memory_utilization;
  r.enforce_eager = o.enforce_eager;
  r.max_num_seqs = o.max_num_seqs;
  r.max_num_batched_tokens = o.max_num_batched_tokens;
  r.config_overrides = {o.hf_overrides, o.rope_scaling};
  r.tensor_parallel_size = o.tensor_parallel_size;
  r.expert_parallel = o.expert_parallel;
  r.nnodes = o.nnodes, r.node_rank = o.node_rank, r.dist_init_addr = o.dist_init_addr;
  return r;
}

}  // namespace

Status follow_node(const ServerOptions& o) { return engine::follow_node(o.model_path, runner_options(o)); }

namespace {

Result<std::shared_ptr<LoadedModel>> load_model(const ServerOptions& o) {
  if (!std::filesystem::exists(std::filesystem::path(o.model_path) / "config.json"))
    return Status::error(o.model_path + ": no config.json (is this a model folder?)");
  auto model = std::make_shared<LoadedModel>();
  auto tokenizer = text::Tokenizer::load(o.model_path);
  if (!tokenizer) return Status::error("tokenizer: " + tokenizer.status().message());
  model->tokenizer = std::move(tokenizer.value());
  model->tokenizer_path = o.model_path;
  auto chat_template = text::ChatTemplate::load(o.model_path);
  if (chat_template)
    model->chat_template = std::move(chat_template.value());
  else
    log_warn("chat completions are off: " + chat_template.status().message());
  auto generation = io::load_generation_config(o.model_path);
  if (!generation) return generation.status();
  model->generation = std::move(generation.value());
  const bool has_think =
      model->tokenizer->token_to_id("<think>") >= 0 && model->tokenizer->token_to_id("</think>") >= 0;
  model->parse_reasoning = o.reasoning_parser == "qwen3" || (o.reasoning_parser == "auto" && has_think);

  // Opened before the weights load, so that a bad path fails at once.
  std::shared_ptr<std::FILE> step_log;
  if (!o.step_log.empty() && !(step_log = engine::open_step_log(o.step_log)))
    return Status::error("--step-log: cannot write " + o.step_log + ": " + std::strerror(errno));

  // Each runner reads the checkpoint (once) and sizes its KV cache; the context length follows the
  // smallest. Data-parallel engines go round the visible GPUs, those sharing one splitting its memory.
  // With tensor parallelism an engine takes tensor_parallel_size GPUs from its device on.
  const int dp = static_cast<int>(o.data_parallel_size);
  const int gpus = engine::cuda_device_count();
  const int groups = std::max(gpus / static_cast<int>(o.tensor_parallel_size), 1);
  std::vector<std::unique_ptr<engine::ModelRunner>> runners;
  for (int i = 0; i < dp; ++i) {
    engine::RunnerOptions ro = runner_options(o);
    if (gpus > 0 && ro.backend != engine::Backend::CPU)
      ro.device = (i % groups) * static_cast<int>(o.tensor_parallel_size),
      ro.engines_on_device = dp / groups + (i % groups < dp % groups ? 1 : 0);
    else
      ro.engines_on_device = dp;  // CPU engines share the host's KV budget
    auto runner = engine::create_runner(o.model_path, ro);
    if (!runner)
      return Status::error(dp > 1 ? "engine " + std::to_string(i) + ": " + runner.status().message()
                                  : runner.status().message());
    runners.push_back(engine::inject_engine_failure(std::move(runner.value()), i));
  }
  const io::ModelConfig config = runners[0]->config();
  int64_t capacity = INT64_MAX;
  for (const auto& r : runners) capacity = std::min(capacity, r->n_kv_blocks() * r->block_size());
  int64_t max_model_len = o.max_model_len;
  const int64_t context = config.context_length();
  if (max_model_len > context)
    return Status::error("--max-model-len " + std::to_string(max_model_len) + " exceeds the model's context length (" +
                         std::to_string(context) +
                         (context > config.max_position_embeddings ? ", its RoPE scaling's)"
                                                                   : ": max_position_embeddings; a rope_scaling "
                                                                     "such as YaRN (--rope-scaling) extends it)"));
  if (max_model_len > capacity)
    return Status::error("--max-model-len " + std::to_string(max_model_len) + " does not fit the KV cache (" +
                         std::to_string(capacity) +
                         " tokens); raise --num-kv-blocks / --kv-cache-memory-gb / "
                         "--gpu-memory-utilization or lower it");
  if (max_model_len <= 0) {
    max_model_len = std::min(context, capacity);
    if (max_model_len < context)
      log_warn("max_model_len set to the KV capacity, " + std::to_string(max_model_len) + " tokens");
  }
  if (max_model_len < 2) return Status::error("the KV cache holds fewer than 2 tokens");

  engine::EngineConfig ec;
  ec.limits = {o.max_num_seqs, o.max_num_batched_tokens, o.scheduler_delay_factor};
  ec.max_model_len = max_model_len;
  ec.prefix_caching = o.enable_prefix_caching;
  ec.overlap = !o.disable_overlap_schedule;
  ec.step_log = std::move(step_log);
  for (int64_t id : config.eos_token_ids) ec.eos_token_ids.push_back(static_cast<int32_t>(id));
  for (int64_t id : model->generation.eos_token_ids)
    if (std::find(ec.eos_token_ids.begin(), ec.eos_token_ids.end(), id) == ec.eos_token_ids.end())
      ec.eos_token_ids.push_back(static_cast<int32_t>(id));
  ec.out_of_service_on_failure = dp > 1;
  std::vector<std::unique_ptr<engine::Engine>> engines;
  std::vector<std::string> devices;
  int64_t n_blocks = 0;
  const bool warm_up = !o.skip_server_warmup && runners[0]->loads_kernels_lazily();
  for (auto& runner : runners) {
    devices.push_back(runner->describe());
    n_blocks += runner->n_kv_blocks();
    engines.push_back(std::make_unique<engine::Engine>(ec, std::move(runner), model->tokenizer,
                                                       engine::ModelInfo{o.model_path, o.weight_version}));
  }
  model->backend = devices[0];
  for (size_t i = 1; i < devices.size(); ++i) model->backend += ", " + devices[i];
  model->engine = std::make_unique<engine::EngineGroup>(std::move(engines), devices);
  if (warm_up) {
    const auto warm_up_start = std::chrono::steady_clock::now();
    const std::vector<int64_t> lengths = engine::warm_up_prompt_lengths(ec.limits, max_model_len);
    // A step that fails here would fail a client's request: the server does not start, unless other
    // data-parallel engines are still in service (the failed one is out of it, as it would be later).
    if (Status warmed = model->engine->warm_up(lengths); !warmed) {
      if (dp == 1 || !model->engine->any_in_service()) return Status::error("the warm-up failed: " + warmed.message());
      log_warn("the warm-up failed (serving on the other engines): " + warmed.message());
    }
    std::string prompts;
    for (int64_t n : lengths) prompts += (prompts.empty() ? "" : ", ") + std::to_string(n);
    log_info("warmed up (prompts of " + prompts + " tokens) in " +
             std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - warm_up_start).count()) +
             " s");
  }
  // Structured output: one compiler (and cache) for every engine of the model.
  const auto vocabulary_start = std::chrono::steady_clock::now();
  model->grammar = std::make_shared<grammar::GrammarCompiler>(
      grammar_vocabulary(*model->tokenizer, config.vocab_size, ec.eos_token_ids), 4);
  log_debug("structured output: grammar vocabulary of " + std::to_string(config.vocab_size) + " tokens in " +
            std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - vocabulary_start).count()) +
            " s");
  log_info("serving " + o.model_path + " (" + config.architecture + ") on " + model->backend + ": max_model_len " +
           std::to_string(max_model_len) + ", " + std::to_string(n_blocks) + " KV blocks of " +
           std::to_string(o.block_size) + " tokens" + (dp > 1 ? " over " + std::to_string(dp) + " engines" : ""));
  return model;
}

// Sockets are file descriptors: thousands of open streams need more than the usual soft limit.
void raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

Result<CorsPolicy> cors_policy(const ServerOptions& o) {
  CorsPolicy policy;
  policy.enabled = true;
  policy.allow_credentials = o.allow_credentials;
  auto read_list = [](const char* flag, const std::string& text, std::vector<std::string>& out) {
    const nlohmann::json list = nlohmann::json::parse(text, nullptr, false);
    if (list.is_discarded() || !list.is_array() ||
        !std::all_of(list.begin(), list.end(), [](const nlohmann::json& x) { return x.is_string(); }))
      return Status::error(std::string(flag) + " must be a JSON list of strings, e.g. '[\"*\"]' (got '" + text + "')");
    out.assign(list.begin(), list.end());
    return Status::ok();
  };
  NIB_RETURN_IF_ERROR(read_list("--allowed-origins", o.allowed_origins, policy.origins));
  NIB_RETURN_IF_ERROR(read_list("--allowed-methods", o.allowed_methods, policy.methods));
  NIB_RETURN_IF_ERROR(read_list("--allowed-headers", o.allowed_headers, policy.headers));
  return policy;
}

Status validate_options(const ServerOptions& o) {
  using Names = std::initializer_list<const char*>;
  if (auto cors = cors_policy(o); !cors) return cors.status();
  NIB_RETURN_IF_ERROR(check_member("--backend", o.backend, Names{"auto", "cpu", "cuda"}));
  NIB_RETURN_IF_ERROR(check_member("--moe-backend", o.moe_backend, moe_kernel_names()));
  NIB_RETURN_IF_ERROR(check_member("--gemm-backend", o.gemm_backend, dense_kernel_names()));
  NIB_RETURN_IF_ERROR(check_member("--attention-backend", o.attention_backend, Names{"auto", "flashinfer", "native"}));
  NIB_RETURN_IF_ERROR(check_member("--decode-attention", o.decode_attention, Names{"auto", "split-kv", "tensor-core"}));
  NIB_RETURN_IF_ERROR(check_member("--act-quant-moe", o.act_quant_moe, Names{"none", "static", "per-token"}));
  NIB_RETURN_IF_ERROR(check_member("--act-quant-dense", o.act_quant_dense, Names{"none", "static", "per-token"}));
  NIB_RETURN_IF_ERROR(check_member("--reasoning-parser", o.reasoning_parser, Names{"auto", "qwen3", "none"}));
  if (const auto kv = engine::parse_kv_cache_dtype(o.kv_cache_dtype); !kv || *kv == engine::KvCacheDtype::FP32)
    return Status::error("--kv-cache-dtype '" + o.kv_cache_dtype +
                         "' is not supported (supported: auto, bf16, fp8, fp8_e4m3)");
  if (!(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1))
    return Status::error("--gpu-memory-utilization must be in (0, 1]");
  if (o.tensor_parallel_size < 1 || o.tensor_parallel_size > 64)
    return Status::error("--tensor-parallel-size must be in [1, 64]");
  if (o.expert_parallel && o.tensor_parallel_size == 1)
    return Status::error("--enable-expert-parallel deals the experts over --tensor-parallel-size ranks: give it > 1");
  if (o.nnodes < 1 || o.nnodes > 64 || o.node_rank < 0 || o.node_rank >= o.nnodes)
    return Status::error("--nnodes must be in [1, 64] and --node-rank in [0, --nnodes)");
  if (o.nnodes > 1) {
    if (o.tensor_parallel_size % o.nnodes != 0)
      return Status::error("--tensor-parallel-size " + std::to_string(o.tensor_parallel_size) +
                           " does not split over " + std::to_string(o.nnodes) +
                           " nodes (--nnodes): each node runs as many ranks");
    if (o.dist_init_addr.empty()) return Status::error("--nnodes > 1 needs --dist-init-addr host:port (node 0's)");
    if (o.data_parallel_size != 1) return Status::error("--nnodes > 1 serves one engine (--data-parallel-size 1)");
    if (o.backend == "cpu") return Status::error("--nnodes > 1 runs on the GPU backend");
  }
  if (!(o.shutdown_timeout >= 0)) return Status::error("--shutdown-timeout must be >= 0");
  if (o.data_parallel_size < 1 || o.data_parallel_size > 64)
    return Status::error("--data-parallel-size must be in [1, 64]");
  if (o.max_num_seqs < 1) return Status::error("--max-num-seqs must be >= 1");
  if (o.max_num_batched_tokens < 1) return Status::error("--max-num-batched-tokens must be >= 1");
  if (!(o.scheduler_delay_factor >= 0.0) || o.scheduler_delay_factor > 1000.0)
    return Status::error("--scheduler-delay-factor must be in [0, 1000]");
  if (o.block_size < 1 || o.block_size > 1024) return Status::error("--block-size must be in [1, 1024]");
  if (o.max_model_len < 0) return Status::error("--max-model-len must be >= 0");
  if (o.num_kv_blocks < 0) return Status::error("--num-kv-blocks must be >= 0");
  if (o.kv_cache_memory_gb < 0) return Status::error("--kv-cache-memory-gb must be >= 0");
  if (o.model_path.empty()) return Status::error("--model is empty");
  return Status::ok();
}

namespace {

// The route table: every route the main port serves. With --api-key set every route needs the key
// except those marked open (liveness probes and the Prometheus scrape, which can also move to
// --metrics-port): a route added here is protected unless it says otherwise.
enum Method : uint8_t { GET = 1, POST = 2 };
struct Route {
  const char* path;
  uint8_t methods;
  bool open;
  void (*handler)(ServingContext&, const HttpRequest&, Responder);
};

const Route ROUTES[] = {
    {"/v1/chat/completions", POST, false, handle_chat_completions},
    {"/v1/completions", POST, false, handle_completions},
    {"/v1/models", GET, false, handle_models},
    {"/generate", POST, false, handle_generate},
    {"/tokenize", POST, false, handle_tokenize},
    {"/detokenize", POST, false, handle_detokenize},
    {"/update_weights_from_disk", POST, false, handle_update_weights},
    {"/abort_request", POST, false, handle_abort_request},
    {"/flush_cache", GET | POST, false, handle_flush_cache},
    {"/reset_prefix_cache", POST, false, handle_reset_prefix_cache},
    {"/health_generate", GET, false, handle_health_generate},
    {"/get_model_info", GET | POST, false, handle_model_info},
    {"/server_info", GET, false, handle_server_info},
    {"/get_server_info", GET, false, handle_server_info},
    {"/version", GET, false, handle_version},
    {"/health", GET, true, handle_health},
    {"/metrics", GET, true, handle_metrics},
};

}  // namespace

std::vector<RouteInfo> route_table() {
  std::vector<RouteInfo> out;
  for (const Route& r : ROUTES) {
    RouteInfo info{r.path, {}, !r.open};
    if (r.methods & GET) info.methods.push_back("GET");
    if (r.methods & POST) info.methods.push_back("POST");
    out.push_back(std::move(info));
  }
  return out;
}

struct Server::Impl {
  explicit Impl(ServerOptions o) { ctx.options = std::move(o); }

  void route(const HttpRequest& request, Responder responder) {
    const Route* found = nullptr;
    for (const Route& r : ROUTES)
      if (request.path == r.path) found = &r;
    if (!found) return respond_error(responder, {404, "no route " + request.method + " " + request.path, ""});
    if (!found->open && !ctx.options.api_key.empty() && request.authorization != "Bearer " + ctx.options.api_key)
      return respond_error(responder, {401, "missing or wrong API key", ""});
    const uint8_t method = request.method == "GET" ? GET : request.method == "POST" ? POST : 0;
    if (!(found->methods & method))
      return respond_error(responder, {405, "method " + request.method + " is not allowed on " + request.path, ""});
    found->handler(ctx, request, std::move(responder));
  }

  ServingContext ctx;
  std::unique_ptr<HttpServer> http, metrics_http;
  std::vector<std::thread> io_threads;
  std::thread loader;
  std::mutex mutex;
  std::condition_variable stopped_cv;
  bool stop_requested = false;
  int exit_code = 0;
};

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Server::~Server() {
  stop();
  wait();
}

uint16_t Server::port() const { return impl_->http ? impl_->http->port() : 0; }

Status Server::start() {
  Impl& s = *impl_;
  NIB_RETURN_IF_ERROR(validate_options(s.ctx.options));
  if (s.ctx.options.served_model_name.empty()) s.ctx.options.served_model_name = s.ctx.options.model_path;
  s.ctx.started_at =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  raise_open_file_limit();
  auto handler = [&s](const HttpRequest& r, Responder responder) { s.route(r, std::move(responder)); };
  s.http = std::make_unique<HttpServer>(s.ctx.io, handler, s.ctx.http_stats, cors_policy(s.ctx.options).value());
  NIB_RETURN_IF_ERROR(s.http->listen(s.ctx.options.host, s.ctx.options.port));
  if (s.ctx.options.metrics_port) {
    auto metrics_only = [&s](const HttpRequest& r, Responder responder) {
      if (r.path == "/metrics")
        handle_metrics(s.ctx, r, std::move(responder));
      else
        respond_error(responder, {404, "the metrics port serves only /metrics", ""});
    };
    s.metrics_http = std::make_unique<HttpServer>(s.ctx.io, metrics_only, s.ctx.http_stats);
    NIB_RETURN_IF_ERROR(s.metrics_http->listen(s.ctx.options.host, s.ctx.options.metrics_port));
  }
  const int n_threads = s.ctx.options.io_threads > 0
                            ? s.ctx.options.io_threads
                            : static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  for (int i = 0; i < n_threads; ++i)
    s.io_threads.emplace_back([&s] {
      auto guard = boost::asio::make_work_guard(s.ctx.io);
      s.ctx.io.run();
    });
  log_info("listening on " + s.ctx.options.host + ":" + std::to_string(s.http->port()) + " (loading " +
           s.ctx.options.model_path + ")");
  s.loader = std::thread([this, &s] {
    auto loaded = load_model(s.ctx.options);
    if (!loaded) {
      log_error("cannot serve " + s.ctx.options.model_path + ": " + loaded.status().message());
      std::lock_guard<std::mutex> lock(s.mutex);
      s.exit_code = 1;
      s.stop_requested = true;
      s.stopped_cv.notify_all();
      return;
    }
    s.ctx.set_model(std::move(loaded.value()));
    log_info("ready");
  });
  return Status::ok();
}

void Server::stop() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->stop_requested = true;
  impl_->stopped_cv.notify_all();
}

int Server::wait() {
  Impl& s = *impl_;
  {
    std::unique_lock<std::mutex> lock(s.mutex);
    s.stopped_cv.wait(lock, [&s] { return s.stop_requested; });
  }
  if (s.loader.joinable()) s.loader.join();
  if (s.io_threads.empty()) return s.exit_code;
  if (auto model = s.ctx.model(); model && s.ctx.options.shutdown_timeout > 0) {
    // Drain: new requests and /health get 503 (a router retries those elsewhere; a refused connection
    // it would report as an error), running ones finish (or the time runs out). Then the server stays
    // up answering 503 until a /health has been answered so (a router has seen it) or 2 s passed.
    log_info("shutting down: new requests get 503; up to " + std::to_string(s.ctx.options.shutdown_timeout) +
             " s for the running ones to finish");
    s.ctx.draining = true;
    const auto start = std::chrono::steady_clock::now();
    const auto until = start + std::chrono::milliseconds(static_cast<int64_t>(s.ctx.options.shutdown_timeout * 1000));
    const auto linger = start + std::chrono::seconds(2);
    bool idle = false;
    while (std::chrono::steady_clock::now() < until) {
      if (!idle) {
        const engine::MetricsSnapshot m = model->engine->metrics();
        idle = m.requests_running + m.requests_waiting == 0 && s.ctx.all_jobs().empty();
      }
      if (idle && (s.ctx.health_refused || std::chrono::steady_clock::now() >= linger)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  log_info("shutting down: no new connections; running requests end with finish_reason abort");
  if (s.http) s.http->stop_accepting();
  if (s.metrics_http) s.metrics_http->stop_accepting();
  if (auto model = s.ctx.model()) model->engine->shutdown();  // every request gets its final output
  // Let the last chunks reach their clients, a few seconds at most.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (s.ctx.http_stats->open_responses.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  s.ctx.io.stop();
  for (auto& t : s.io_threads) t.join();
  s.io_threads.clear();
  s.ctx.set_model(nullptr);
  log_info("stopped");
  return s.exit_code;
}

}  // namespace nibble::server
