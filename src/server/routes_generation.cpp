// /v1/chat/completions, /v1/completions and SGLang's /generate: JSON → typed engine requests
// (defaults from generation_config.json, vLLM's extra sampling fields), then a GenerationJob.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <random>

#include <boost/asio/post.hpp>

#include "server/context.h"
#include "server/generation_job.h"
#include "server/structured_output.h"

namespace nibble::server {
namespace {

struct FieldNames {
  const char* max_tokens;
  const char* min_tokens;
  const char* include_stop;  // SGLang's no_stop_trim
};
constexpr FieldNames OPENAI_NAMES{"max_tokens", "min_tokens", "include_stop_str_in_output"};
constexpr FieldNames SGLANG_NAMES{"max_new_tokens", "min_new_tokens", "no_stop_trim"};

std::string random_id(const std::string& prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += hex[rng() % 16];
  return id;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// OpenAI's logit_bias: an object from token ids (as strings, base 10) to biases in [-100, 100],
// into distinct (token, bias) pairs in token order.
bool read_logit_bias(RequestFields& f, int64_t vocab, std::vector<std::pair<int32_t, float>>& out) {
  const json& object = f.at("logit_bias");
  if (!object.is_object()) return f.fail("logit_bias", "must be an object from token ids to biases");
  for (const auto& [key, value] : object.items()) {
    int64_t token = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), token);
    if (ec != std::errc() || end != key.data() + key.size() || token < 0 || token >= vocab)
      return f.fail("logit_bias", "keys must be token ids in [0, " + std::to_string(vocab) + "), got '" + key + "'");
    if (!value.is_number() || !(value.get<double>() >= -100.0 && value.get<double>() <= 100.0))
      return f.fail("logit_bias", "values must be numbers in [-100, 100] (token " + key + ")");
    out.emplace_back(static_cast<int32_t>(token), value.get<float>());
  }
  std::sort(out.begin(), out.end());
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i].first == out[i - 1].first)
      return f.fail("logit_bias", "names token " + std::to_string(out[i].first) + " twice");
  return true;
}

// Sampling and stop fields, with the model's generation_config for what the request leaves out.
bool parse_sampling(RequestFields& f, const LoadedModel& model, const FieldNames& names, int64_t default_max_tokens,
                    engine::GenerationRequest& r) {
  const io::GenerationConfig& g = model.generation;
  sampling::SamplingParams& s = r.sampling;
  s.temperature = static_cast<float>(g.temperature.value_or(1.0));
  s.top_p = static_cast<float>(g.top_p.value_or(1.0));
  s.top_k = static_cast<int32_t>(g.top_k.value_or(0));
  s.min_p = static_cast<float>(g.min_p.value_or(0.0));
  s.repetition_penalty = static_cast<float>(g.repetition_penalty.value_or(1.0));
  int64_t top_k = s.top_k, seed = 0, n = 1;
  f.number("temperature", s.temperature, 0.0, 100.0);
  f.number("top_p", s.top_p, 1e-9, 1.0);
  f.integer("top_k", top_k, -1, 1 << 30);
  s.top_k = static_cast<int32_t>(top_k);
  f.number("min_p", s.min_p, 0.0, 1.0);
  f.number("repetition_penalty", s.repetition_penalty, 1e-6, 1e4);
  f.number("presence_penalty", s.presence_penalty, -2.0, 2.0);
  f.number("frequency_penalty", s.frequency_penalty, -2.0, 2.0);
  if (f.has("seed") && f.integer("seed", seed, INT64_MIN, INT64_MAX)) s.seed = static_cast<uint64_t>(seed);
  f.integer("n", n, 1, 128);
  r.n = static_cast<int32_t>(n);
  engine::StopParams& stop = r.stop;
  stop.max_tokens = default_max_tokens;
  f.integer(names.max_tokens, stop.max_tokens, 0, int64_t{1} << 40);
  // OpenAI's current name wins where both come (vLLM: max_completion_tokens or max_tokens).
  if (std::string(names.max_tokens) == "max_tokens")
    f.integer("max_completion_tokens", stop.max_tokens, 0, int64_t{1} << 40);
  f.integer(names.min_tokens, stop.min_tokens, 0, int64_t{1} << 40);
  f.strings("stop", stop.stop);
  f.integers("stop_token_ids", stop.stop_token_ids, 0, INT32_MAX);
  f.boolean("ignore_eos", stop.ignore_eos);
  f.boolean(names.include_stop, stop.include_stop_str_in_output);
  f.boolean("skip_special_tokens", r.skip_special_tokens);
  if (f.has("logit_bias")) read_logit_bias(f, model.engine->model_config().vocab_size, s.logit_bias);
  return !f.error;
}

bool check_model_name(ServingContext& ctx, RequestFields& f) {
  std::string name;
  if (!f.string("model", name)) return false;
  if (f.has("model") && name != ctx.options.served_model_name && !f.error) {
    // vLLM's and OpenAI's answer: 404, so clients raise NotFoundError.
    f.error = ApiError{
        404, "The model `" + name + "` does not exist (serving '" + ctx.options.served_model_name + "').", "model"};
    return false;
  }
  return true;
}

bool stream_options(RequestFields& f, JobOptions& job) {
  f.boolean("stream", job.stream);
  if (!f.has("stream_options")) return !f.error;
  const json& so = f.at("stream_options");
  if (!so.is_object()) return f.fail("stream_options", "must be an object");
  if (!job.stream) return f.fail("stream_options", "is only allowed with stream: true");
  RequestFields inner(so);
  inner.boolean("include_usage", job.include_usage);
  inner.boolean("continuous_usage_stats", job.continuous_usage);
  if (inner.error) return f.fail("stream_options", inner.error->message);
  return true;
}

// A JSON list of token ids into `prompts`; a wrong entry fails `key`.
bool read_token_ids(RequestFields& f, const char* key, const json& list, int64_t vocab,
                    std::vector<std::vector<int32_t>>& prompts) {
  std::vector<int32_t> ids;
  for (const json& x : list) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab)
      return f.fail(key, "must hold token ids in [0, " + std::to_string(vocab) + ")");
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  prompts.push_back(std::move(ids));
  return true;
}

JobOptions new_job(ServingContext& ctx, ApiKind kind, const char* id_prefix) {
  JobOptions job;
  job.kind = kind;
  job.id = random_id(id_prefix);
  job.model = ctx.options.served_model_name;
  job.created = unix_now();
  return job;
}

// One engine request per prompt, each a copy of `base`, run as one job. With a structured-output
// constraint the grammar is compiled first, on the grammar pool (a cached one is there at once).
void run_job(ServingContext& ctx, std::shared_ptr<LoadedModel> model, JobOptions options, const Responder& responder,
             engine::GenerationRequest base, std::vector<std::vector<int32_t>> prompts,
             std::optional<ConstraintField> constraint = std::nullopt, bool reasoning = false) {
  if (constraint) {
    boost::asio::post(ctx.grammar_pool, [&ctx, model = std::move(model), options = std::move(options), responder,
                                         base = std::move(base), prompts = std::move(prompts),
                                         c = std::move(*constraint), reasoning]() mutable {
      ApiError error;
      if (!compile_constraint(*model, c, reasoning, base, error)) return respond_error(responder, error);
      run_job(ctx, std::move(model), std::move(options), responder, std::move(base), std::move(prompts));
    });
    return;
  }
  base.sampling.logprobs = options.logprobs;
  options.n = base.n;
  std::vector<engine::GenerationRequest> requests;
  for (auto& ids : prompts) {
    requests.push_back(base);
    requests.back().prompt = std::move(ids);
  }
  auto job = std::make_shared<GenerationJob>(ctx, std::move(model), std::move(options), responder);
  job->start(std::move(requests));
}

}  // namespace

void handle_chat_completions(ServingContext& ctx, const HttpRequest& request, Responder responder) {
  json body;
  if (!parse_body(request, responder, body)) return;
  auto model = ready_model(ctx, responder);
  if (!model) return;
  RequestFields f(body);
  JobOptions job = new_job(ctx, ApiKind::CHAT, "chatcmpl-");
  job.parse_reasoning = model->parse_reasoning;
  engine::GenerationRequest r;
  check_model_name(ctx, f);
  if (!f.has("messages") || !f.at("messages").is_array() || f.at("messages").empty())
    f.fail("messages", "must be a non-empty list of messages");
  stream_options(f, job);
  bool logprobs = false;
  int64_t top_logprobs = 0;
  f.boolean("logprobs", logprobs);
  f.integer("top_logprobs", top_logprobs, 0, 20);
  if (top_logprobs > 0 && !logprobs) f.fail("top_logprobs", "needs logprobs: true");  // 0 without it is vLLM's default
  job.logprobs = logprobs ? static_cast<int32_t>(top_logprobs) : -1;
  const json tool_choice = f.has("tool_choice") ? f.at("tool_choice") : json("auto");
  if (f.has("tools") && !f.at("tools").is_array()) f.fail("tools", "must be a list");
  std::optional<ConstraintField> constraint;
  read_constraint(f, constraint);
  if (f.has("chat_template_kwargs") && !f.at("chat_template_kwargs").is_object())
    f.fail("chat_template_kwargs", "must be an object");
  ChatPromptOptions prompt_options;
  read_prompt_flags(f, prompt_options);
  bool parallel_tool_calls = true;
  f.boolean("parallel_tool_calls", parallel_tool_calls);
  job.max_tool_calls = parallel_tool_calls ? INT32_MAX : 1;
  parse_sampling(f, *model, OPENAI_NAMES, -1, r);
  // tool_choice required / named constrains to tool calls; auto with strict tools, the calls the
  // model opens (unless response_format already constrains the whole output).
  if (!f.error && tool_choice != "none" && !(tool_choice == "auto" && constraint)) {
    std::optional<ConstraintField> tools;
    if (read_tool_constraint(f, f.has("tools") ? f.at("tools") : json(), tool_choice, parallel_tool_calls, request.body,
                             tools) &&
        tools) {
      if (constraint) f.fail("tool_choice", "cannot be combined with '" + constraint->field + "'");
      constraint = std::move(tools);
    }
  }
  if (f.error) return respond_error(responder, *f.error);
  prompt_options.with_tools = f.has("tools") && !f.at("tools").empty() && tool_choice != "none";
  job.parse_tool_calls = prompt_options.with_tools;
  ApiError error;
  auto prompt = render_chat_prompt(*model, body, prompt_options, error);
  if (!prompt) return respond_error(responder, error);
  const bool reasoning = prompt_leaves_thinking_open(*model, prompt.value());
  if (constraint) keep_key_order(request.body, *constraint);
  run_job(ctx, std::move(model), std::move(job), responder, std::move(r), {std::move(prompt.value())},
          std::move(constraint), reasoning);
}

void handle_completions(ServingContext& ctx, const HttpRequest& request, Responder responder) {
  json body;
  if (!parse_body(request, responder, body)) return;
  auto model = ready_model(ctx, responder);
  if (!model) return;
  RequestFields f(body);
  JobOptions job = new_job(ctx, ApiKind::COMPLETION, "cmpl-");
  engine::GenerationRequest r;
  check_model_name(ctx, f);
  stream_options(f, job);
  int64_t logprobs = -1;
  if (f.has("logprobs")) f.integer("logprobs", logprobs, 0, 20);
  job.logprobs = static_cast<int32_t>(logprobs);
  bool echo = false;
  f.boolean("echo", echo);
  if (echo && logprobs >= 0) r.prompt_logprobs = static_cast<int32_t>(logprobs);  // the echoed prompt's, as vLLM
  if (f.has("suffix") && !(f.at("suffix").is_string() && f.at("suffix").get<std::string>().empty()))
    f.fail("suffix", "is not supported");
  parse_sampling(f, *model, OPENAI_NAMES, 16, r);  // OpenAI's default max_tokens for completions
  int64_t best_of = r.n;
  f.integer("best_of", best_of, 1, 128);
  if (best_of != r.n) f.fail("best_of", "must equal n (no best-of selection)");
  std::optional<ConstraintField> constraint;
  read_constraint(f, constraint);
  // prompt: a string, a list of strings, a list of token ids, or a list of lists of token ids.
  std::vector<std::vector<int32_t>> prompts;
  const int64_t vocab = model->engine->model_config().vocab_size;
  if (!f.has("prompt"))
    f.fail("prompt", "is required");
  else {
    const json& p = body["prompt"];
    if (p.is_string())
      prompts.push_back(model->tokenizer->encode(p.get<std::string>(), true, true));
    else if (!p.is_array() || p.empty())
      f.fail("prompt", "must be a string, a list of strings or token id lists");
    else if (p[0].is_number_integer())
      read_token_ids(f, "prompt", p, vocab, prompts);
    else
      for (const json& item : p) {
        if (item.is_string())
          prompts.push_back(model->tokenizer->encode(item.get<std::string>(), true, true));
        else if (item.is_array()) {
          if (!read_token_ids(f, "prompt", item, vocab, prompts)) break;
        } else {
          f.fail("prompt", "must be a string, a list of strings or token id lists");
          break;
        }
      }
  }
  if (f.error) return respond_error(responder, *f.error);
  if (echo)
    for (const auto& ids : prompts) job.echo.push_back(model->tokenizer->decode(ids, r.skip_special_tokens));
  if (r.prompt_logprobs >= 0) job.echo_ids = prompts;
  if (constraint) keep_key_order(request.body, *constraint);
  run_job(ctx, std::move(model), std::move(job), responder, std::move(r), std::move(prompts), std::move(constraint));
}

void handle_generate(ServingContext& ctx, const HttpRequest& request, Responder responder) {
  json body;
  if (!parse_body(request, responder, body)) return;
  auto model = ready_model(ctx, responder);
  if (!model) return;
  RequestFields f(body);
  JobOptions job = new_job(ctx, ApiKind::GENERATE, "");
  f.string("rid", job.id);
  if (job.id.empty()) f.fail("rid", "must not be empty");
  f.boolean("stream", job.stream);
  bool return_logprob = false;
  int64_t top_logprobs = 0;
  f.boolean("return_logprob", return_logprob);
  f.integer("top_logprobs_num", top_logprobs, 0, 20);
  job.logprobs = return_logprob ? static_cast<int32_t>(top_logprobs) : -1;
  engine::GenerationRequest r;
  if (f.has("sampling_params") && !f.at("sampling_params").is_object()) f.fail("sampling_params", "must be an object");
  const json sampling_params = f.has("sampling_params") ? body["sampling_params"] : json::object();
  RequestFields sp(sampling_params);
  parse_sampling(sp, *model, SGLANG_NAMES, 128, r);  // SGLang's default max_new_tokens
  std::optional<ConstraintField> constraint;
  if (!sp.error) read_constraint(sp, constraint);
  if (constraint) {
    constraint->field = "sampling_params." + constraint->field;
    if (!constraint->schema_pointer.empty())
      constraint->schema_pointer = "/sampling_params" + constraint->schema_pointer;
    keep_key_order(request.body, *constraint);
  }
  if (sp.error && !f.error) f.error = ApiError{400, "sampling_params: " + sp.error->message, "sampling_params"};
  std::vector<std::vector<int32_t>> prompts;
  const int64_t vocab = model->engine->model_config().vocab_size;
  if (f.has("text") == f.has("input_ids"))
    f.fail("text", "or 'input_ids' is required (exactly one of them)");
  else if (f.has("text")) {
    const json& t = body["text"];
    if (t.is_string())
      prompts.push_back(model->tokenizer->encode(t.get<std::string>(), true, false));
    else if (t.is_array() && !t.empty() &&
             std::all_of(t.begin(), t.end(), [](const json& x) { return x.is_string(); })) {
      job.generate_batch = true;
      for (const json& x : t) prompts.push_back(model->tokenizer->encode(x.get<std::string>(), true, false));
    } else
      f.fail("text", "must be a string or a non-empty list of strings");
  } else {
    const json& ids = body["input_ids"];
    if (!ids.is_array() || ids.empty())
      f.fail("input_ids", "must be a non-empty list");
    else if (ids[0].is_array()) {
      job.generate_batch = true;
      for (const json& list : ids) {
        if (!list.is_array()) {
          f.fail("input_ids", "must be a list of ids or a list of id lists");
          break;
        }
        if (!read_token_ids(f, "input_ids", list, vocab, prompts)) break;
      }
    } else
      read_token_ids(f, "input_ids", ids, vocab, prompts);
  }
  if (f.error) return respond_error(responder, *f.error);
  run_job(ctx, std::move(model), std::move(job), responder, std::move(r), std::move(prompts), std::move(constraint));
}

}  // namespace nibble::server
