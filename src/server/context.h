// What every route handler shares: the loaded model (engine, tokenizer, chat template, defaults),
// the options, the io context, and the registry of in-flight generations (for /abort_request).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "engine/engine_group.h"
#include "grammar/grammar.h"
#include "io/generation_config.h"
#include "server/api_error.h"
#include "server/http_server.h"
#include "server/server.h"
#include "text/chat.h"
#include "text/tokenizer.h"

namespace nibble::server {

class GenerationJob;

struct LoadedModel {
  std::unique_ptr<engine::EngineGroup> engine;  // one engine, or data-parallel ones
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::shared_ptr<const text::ChatTemplate> chat_template;  // null when the model has none
  io::GenerationConfig generation;
  bool parse_reasoning = false;
  std::string tokenizer_path;
  std::string backend;                                // the runner's description, e.g. "cpu (reference)"
  std::shared_ptr<grammar::GrammarCompiler> grammar;  // structured output's compiler and cache
};

struct ServingContext {
  ServerOptions options;
  boost::asio::io_context io;
  // Structured output's grammar compilations run here, off the io threads and the engines' threads:
  // a request with a new, large schema waits for its own grammar alone.
  boost::asio::thread_pool grammar_pool{2};
  std::shared_ptr<HttpStats> http_stats = std::make_shared<HttpStats>();
  int64_t started_at = 0;  // unix seconds
  // Set on shutdown with --shutdown-timeout: running requests finish, new ones get 503 (a router
  // retries them on another worker) and /health fails.
  std::atomic<bool> draining{false};
  std::atomic<bool> health_refused{false};  // /health answered 503 while draining: a router saw it

  std::shared_ptr<LoadedModel> model() const {
    std::lock_guard<std::mutex> lock(mutex);
    return loaded;
  }
  void set_model(std::shared_ptr<LoadedModel> m) {
    std::lock_guard<std::mutex> lock(mutex);
    loaded = std::move(m);
  }

  void register_job(const std::string& id, std::weak_ptr<GenerationJob> job);
  void unregister_job(const std::string& id);
  std::shared_ptr<GenerationJob> find_job(const std::string& id);
  std::vector<std::shared_ptr<GenerationJob>> all_jobs();

  mutable std::mutex mutex;
  std::shared_ptr<LoadedModel> loaded;
  std::unordered_map<std::string, std::weak_ptr<GenerationJob>> jobs;
};

// Route handlers (routes_*.cpp). Each answers through the responder, now or later.
using Responder = std::shared_ptr<HttpResponder>;
void handle_chat_completions(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_completions(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_generate(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_tokenize(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_detokenize(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_update_weights(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_abort_request(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_flush_cache(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_reset_prefix_cache(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_health_generate(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_health(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_metrics(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_version(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_models(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_model_info(ServingContext& ctx, const HttpRequest& request, Responder responder);
void handle_server_info(ServingContext& ctx, const HttpRequest& request, Responder responder);
std::string prometheus_text(ServingContext& ctx);

// Parses a JSON object body; a bad body answers 400 and returns false.
bool parse_body(const HttpRequest& request, const Responder& responder, json& out);
// The loaded model, or null after answering 503 while it loads.
std::shared_ptr<LoadedModel> ready_model(ServingContext& ctx, const Responder& responder);
// The model's chat template applied to body["messages"] (with body["tools"] when with_tools, and
// body["chat_template_kwargs"]), then tokenized (vLLM adds no special tokens). A template error or a
// model without a template is an ApiError on "messages".
struct ChatPromptOptions {
  bool add_generation_prompt = true;
  bool continue_final_message = false;  // vLLM's assistant prefill (render_chat_request)
  bool with_tools = false;
  bool add_special_tokens = false;
};
Result<std::vector<int32_t>> render_chat_prompt(const LoadedModel& model, const json& body,
                                                const ChatPromptOptions& options, ApiError& error);
// add_generation_prompt (default true) and continue_final_message from the body, vLLM's rule that
// not both are true checked; a wrong field fails `f`.
void read_prompt_flags(RequestFields& f, ChatPromptOptions& options);
void respond_json(const Responder& responder, int status, const json& body);
void respond_error(const Responder& responder, const ApiError& error);

}  // namespace nibble::server
