// The non-generation routes: vLLM's /tokenize and /detokenize, SGLang's control endpoints
// (/update_weights_from_disk, /abort_request, /flush_cache, /health_generate), vLLM's
// /reset_prefix_cache, and the shared
// body/response helpers and job registry.
#include <boost/asio/post.hpp>

#include "server/chat_messages.h"
#include "server/context.h"
#include "server/generation_job.h"

namespace nibble::server {

bool parse_body(const HttpRequest& request, const Responder& responder, json& out) {
  out = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded()) {
    respond_error(responder, {400, "the request body is not valid JSON", ""});
    return false;
  }
  if (!out.is_object()) {
    respond_error(responder, {400, "the request body must be a JSON object", ""});
    return false;
  }
  return true;
}

std::shared_ptr<LoadedModel> ready_model(ServingContext& ctx, const Responder& responder) {
  if (ctx.draining) {
    respond_error(responder, {503, "the server is shutting down", ""});
    return nullptr;
  }
  auto model = ctx.model();
  if (!model) respond_error(responder, {503, "the model is still loading", ""});
  return model;
}

Result<std::vector<int32_t>> render_chat_prompt(const LoadedModel& model, const json& body, const ChatPromptOptions& o,
                                                ApiError& error) {
  if (!model.chat_template) {
    error = {400, "the model has no chat template; use /v1/completions", "messages"};
    return Status::error(error.message);
  }
  auto rendered =
      render_chat_request(*model.chat_template, body, o.add_generation_prompt, o.with_tools, o.continue_final_message);
  if (!rendered) {
    error = {400, rendered.status().message(), "messages"};
    return rendered.status();
  }
  return model.tokenizer->encode(*rendered, /*parse_special=*/true, o.add_special_tokens);
}

void read_prompt_flags(RequestFields& f, ChatPromptOptions& o) {
  f.boolean("add_generation_prompt", o.add_generation_prompt);
  f.boolean("continue_final_message", o.continue_final_message);
  if (o.continue_final_message && o.add_generation_prompt)
    f.fail("continue_final_message", "and add_generation_prompt cannot both be true (vLLM's rule)");
}

void respond_json(const Responder& responder, int status, const json& body) {
  responder->respond(status, "application/json", dump(body));
}

void respond_error(const Responder& responder, const ApiError& error) {
  responder->respond(error.status, "application/json", error_body(error));
}

void ServingContext::register_job(const std::string& id, std::weak_ptr<GenerationJob> job) {
  std::lock_guard<std::mutex> lock(mutex);
  jobs[id] = std::move(job);
}

void ServingContext::unregister_job(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex);
  jobs.erase(id);
}

std::shared_ptr<GenerationJob> ServingContext::find_job(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = jobs.find(id);
  return it == jobs.end() ? nullptr : it->second.lock();
}

std::vector<std::shared_ptr<GenerationJob>> ServingContext::all_jobs() {
  std::lock_guard<std::mutex> lock(mutex);
  std::vector<std::shared_ptr<GenerationJob>> out;
  for (auto& [id, weak] : jobs)
    if (auto job = weak.lock()) out.push_back(std::move(job));
  return out;
}

void handle_tokenize(ServingContext& ctx, const HttpRequest& request, Responder responder) {
  json body;
  if (!parse_body(request, responder, body)) return;
  auto model = ready_model(ctx, responder);
  if (!model) return;
  RequestFields f(body);
  bool return_token_strs = false;
  f.boolean("return_token_strs", return_token_strs);
  ChatPromptOptions chat;
  read_prompt_flags(f, chat);
  std::vector<int32_t> ids;
  if (f.has("messages")) {
    f.boolean("add_special_tokens", chat.add_special_tokens);
    if (!f.at("messages").is_array()) f.fail("messages", "must be a list");
    if (f.error) return respond_error(responder, *f.error);
    ApiError error;
    chat.with_tools = body.contains("tools");
    auto rendered = render_chat_prompt(*model, body, chat, error);
    if (!rendered) return respond_error(responder, error);
    ids = std::move(rendered.value());
  } else {
    std::string prompt;
    bool add_special = true;
    if (!f.has("prompt")) f.fail("prompt", "is required (or 'messages')");
    f.string("prompt", prompt);
    f.boolean("add_special_tokens", add_special);
    if (f.error) return respond_error(responder, *f.error);
    ids = model->tokenizer->encode(prompt, true, add_special);
  }
  json reply = {{"count", ids.size()},
                {"max_model_len", model->engine->config().max_model_len},
                {"tokens", ids},
                {"token_strs", nullptr}};
  if (return_token_strs) {
    reply["token_strs"] = json::array();
    for (int32_t id : ids) reply["token_strs"].push_back(model->tokenizer->id_to_token(id));
  }
  respond_json(responder, 200, reply);
}

void handle_detokenize(ServingContext& ctx, const HttpRequest& request, Responder responder) {
  json body;
  if (!parse_body(request, responder, body)) return;
  auto model = ready_model(ctx, responder);
  if (!model) return;
  RequestFields f(body);
  std::vector<int32_t> ids;
  if (!f.has("tokens")) f.fail("tokens", "is required");
  f.integers("tokens", ids, 0, model->engine->model_config().vocab_size - 1);
  if (f.error) return respond_error(responder, *f.error);
  respond_json(responder, 200, {{"prompt", model->tokenizer->decode(ids, false)}});
}

void handle_update_weights(ServingContext& ctx, const HttpRequest& request, Responder responder) {
  json body;
  if (!parse_body(request, responder, body)) return;
  auto model = ready_model(ctx, responder);
  if (!model) return;
  RequestFields f(body);
  engine::WeightUpdate u;
  if (!f.has("model_path")) f.fail("model_path", "is required");
  f.string("model_path", u.model_path);
  f.boolean("flush_cache", u.flush_cache);
  f.boolean("abort_all_requests", u.abort_all_requests);
  f.string("weight_version", u.weight_version);
  std::string load_format = "auto";
  f.string("load_format", load_format);
  if (load_format != "auto" && load_format != "safetensors")
    f.fail("load_format", "supports only auto and safetensors");
  if (f.error) return respond_error(responder, *f.error);
  model->engine->update_weights(std::move(u), [responder](engine::WeightUpdateResult result) {
    respond_json(responder, result.success ? 200 : 400,
                 {{"success", result.success},
                  {"message", result.message},
                  {"num_paused_requests", result.num_paused_requests}});
  });
}

void handle_abort_request(ServingContext& ctx, const HttpRequest& request, Responder responder) {
  json body;
  if (!parse_body(request, responder, body)) return;
  RequestFields f(body);
  std::string rid;
  bool abort_all = false;
  f.string("rid", rid);
  f.boolean("abort_all", abort_all);
  if (!abort_all && rid.empty()) f.fail("rid", "is required (or abort_all: true)");
  if (f.error) return respond_error(responder, *f.error);
  int64_t aborted = 0;
  if (abort_all) {
    for (auto& job : ctx.all_jobs()) job->abort(), ++aborted;
  } else if (auto job = ctx.find_job(rid)) {
    job->abort();
    ++aborted;
  }
  respond_json(responder, 200, {{"success", true}, {"aborted", aborted}});
}

void handle_flush_cache(ServingContext& ctx, const HttpRequest&, Responder responder) {
  auto model = ready_model(ctx, responder);
  if (!model) return;
  model->engine->flush_cache([responder](Status status) {
    if (status)
      responder->respond(200, "text/plain", "Cache flushed.\n");
    else
      respond_error(responder, {400, "Cache not flushed: " + status.message(), ""});
  });
}

// vLLM's POST /reset_prefix_cache: /flush_cache's semantics, vLLM's empty 200 answer.
void handle_reset_prefix_cache(ServingContext& ctx, const HttpRequest&, Responder responder) {
  auto model = ready_model(ctx, responder);
  if (!model) return;
  model->engine->flush_cache([responder](Status status) {
    if (status)
      responder->respond(200, "text/plain", "");
    else
      respond_error(responder, {400, "prefix cache not reset: " + status.message(), ""});
  });
}

// Generates one token end to end: the engine thread and the model are alive.
void handle_health_generate(ServingContext& ctx, const HttpRequest&, Responder responder) {
  auto model = ready_model(ctx, responder);
  if (!model) return;
  engine::GenerationRequest r;
  r.id = "health-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  r.prompt = {0};
  r.sampling.temperature = 0.0f;
  r.stop.max_tokens = 1;
  r.stop.ignore_eos = true;
  r.on_output = [responder](engine::RequestOutput&& out) {
    if (!out.finished) return;
    const bool ok = out.error.empty() && out.completion_tokens == 1;
    if (ok)
      responder->respond(200, "text/plain", "");
    else
      respond_error(responder, {503, "health generation failed: " + (out.error.empty() ? "aborted" : out.error), ""});
  };
  const Status status = model->engine->submit(std::move(r));
  if (!status) respond_error(responder, {503, status.message(), ""});
}

}  // namespace nibble::server
