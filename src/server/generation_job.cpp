// GenerationJob: engine outputs → OpenAI chat/completions chunks and bodies, or SGLang /generate
// items. Choice i of prompt p is choice p·n + i, as vLLM numbers a batched completion.
#include "server/generation_job.h"

#include <boost/asio/post.hpp>
#include <cmath>

#include "text/utf8.h"

namespace nibble::server {

using engine::FinishReason;

struct GenerationJob::Choice {
  size_t prompt = 0;
  int32_t index = 0;
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<sampling::SampledToken> logprobs;
  FinishReason finish = FinishReason::NONE;
  std::string stop_string;
  int32_t stop_token = -1;
  std::unique_ptr<ChatOutputParser> parser;
  ChatDelta message;  // chat: everything parsed so far
  bool echo_sent = false;
  size_t text_offset = 0;  // completions logprobs: where the first output token's text starts
  // Streamed logprobs: where the next token's text starts, counted in token texts as the whole
  // response counts them (a token that is part of a character is one U+FFFD in either).
  size_t stream_offset = 0;
};

namespace {

const char* finish_name(FinishReason reason, bool tool_calls) {
  if (reason == FinishReason::STOP && tool_calls) return "tool_calls";
  return engine::finish_reason_name(reason);
}

void append(ChatDelta& into, ChatDelta&& d) {
  into.reasoning += d.reasoning;
  into.content += d.content;
  for (auto& call : d.tool_calls) into.tool_calls.push_back(std::move(call));
}

// vLLM's stop_reason: the stop string or stop token that ended the choice, else null.
json stop_reason(const std::string& stop_string, int32_t stop_token) {
  return !stop_string.empty() ? json(stop_string) : stop_token >= 0 ? json(stop_token) : json(nullptr);
}

double clamp_logprob(float lp) { return std::isfinite(lp) ? lp : -9999.0; }  // JSON has no -inf (vLLM clamps too)

}  // namespace

GenerationJob::GenerationJob(ServingContext& ctx, std::shared_ptr<LoadedModel> model, JobOptions options,
                             Responder responder)
    : ctx_(ctx),
      model_(std::move(model)),
      options_(std::move(options)),
      responder_(std::move(responder)),
      strand_(boost::asio::make_strand(ctx.io)),
      started_(std::chrono::steady_clock::now()) {}

GenerationJob::~GenerationJob() { ctx_.unregister_job(options_.id); }

void GenerationJob::start(std::vector<engine::GenerationRequest> requests) {
  const size_t n_prompts = requests.size();
  unfinished_prompts_ = n_prompts;
  prompt_counts_.assign(n_prompts, {0, 0, 0});
  prompt_logprobs_.resize(n_prompts);
  choices_.resize(n_prompts * options_.n);
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    c.prompt = i / options_.n;
    c.index = static_cast<int32_t>(i);
    if (options_.kind == ApiKind::CHAT)
      c.parser = std::make_unique<ChatOutputParser>(options_.parse_reasoning, options_.parse_tool_calls,
                                                    options_.max_tool_calls);
    if (!options_.echo.empty()) c.text_offset = options_.echo[c.prompt].size();
    c.stream_offset = c.text_offset;
  }
  ctx_.register_job(options_.id, weak_from_this());
  std::weak_ptr<GenerationJob> weak = weak_from_this();
  responder_->on_disconnect([weak] {
    if (auto job = weak.lock()) job->abort();
  });
  engine::EngineGroup& engine = *model_->engine;
  for (size_t p = 0; p < n_prompts; ++p) {
    engine::GenerationRequest& r = requests[p];
    r.id = n_prompts == 1 ? options_.id : options_.id + "-" + std::to_string(p);
    engine_ids_.push_back(r.id);
    auto self = shared_from_this();
    r.on_output = [self, p](engine::RequestOutput&& out) {
      boost::asio::post(self->strand_,
                        [self, p, out = std::move(out)]() mutable { self->on_output(p, std::move(out)); });
    };
    const Status status = engine.submit(std::move(r));
    if (!status) {
      // No engine left in service is the server's state, not the request's fault.
      const int code = engine.any_in_service() ? 400 : 503;
      boost::asio::post(strand_, [self, code, message = status.message()] {
        self->done_ = true;
        for (const std::string& id : self->engine_ids_) self->model_->engine->abort(id);
        respond_error(self->responder_, {code, message, ""});
      });
      engine_ids_.pop_back();
      return;
    }
  }
  // Headers (for a stream) only once every request is accepted, so a refused one can still get a
  // 400; outputs that arrive before that wait in early_.
  boost::asio::post(strand_, [self = shared_from_this()] { self->begin(); });
}

void GenerationJob::abort() {
  boost::asio::post(strand_, [self = shared_from_this()] {
    for (const std::string& id : self->engine_ids_) self->model_->engine->abort(id);
  });
}

std::string GenerationJob::token_text(int32_t id) const {
  return std::string(model_->tokenizer->token_bytes(id, false));
}

json GenerationJob::logprobs_json(const std::vector<sampling::SampledToken>& tokens, size_t text_offset) const {
  if (options_.kind == ApiKind::CHAT) {
    json content = json::array();
    auto entry = [this](int32_t id, float lp) {
      const std::string text = token_text(id);
      return json{
          {"token", text}, {"logprob", clamp_logprob(lp)}, {"bytes", std::vector<uint8_t>(text.begin(), text.end())}};
    };
    for (const auto& t : tokens) {
      json e = entry(t.token, t.logprob);
      e["top_logprobs"] = json::array();
      for (const auto& top : t.top) e["top_logprobs"].push_back(entry(top.token, top.logprob));
      content.push_back(std::move(e));
    }
    return {{"content", std::move(content)}};
  }
  return completion_logprobs(nullptr, tokens, text_offset);
}

// OpenAI's completions logprobs: parallel lists of token texts, logprobs, top-logprob objects and text
// offsets. As vLLM gives them, each top object also holds the token itself (so logprobs: 0 gives
// the token's own entry), and an echoed prompt's first token has null entries (nothing precedes it).
json GenerationJob::completion_logprobs(const Choice* prompt, const std::vector<sampling::SampledToken>& tokens,
                                        size_t text_offset) const {
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  size_t offset = 0;
  // Token texts as the response's JSON will carry them (a token that is part of a character becomes
  // U+FFFD here, not at the dump: two such tokens in one top object must meet as one key, the drawn
  // token's own entry last, so that it holds the drawn token's logprob).
  auto shown = [this](int32_t id) { return text::utf8_lossy(token_text(id)); };
  auto add = [&](int32_t id, const sampling::SampledToken* t) {
    const std::string text = shown(id);
    out["tokens"].push_back(text);
    out["text_offset"].push_back(offset);
    offset += text.size();
    if (!t) {
      out["token_logprobs"].push_back(nullptr);
      out["top_logprobs"].push_back(nullptr);
      return;
    }
    out["token_logprobs"].push_back(clamp_logprob(t->logprob));
    json top = json::object();
    for (const auto& e : t->top) top[shown(e.token)] = clamp_logprob(e.logprob);
    top[text] = clamp_logprob(t->logprob);
    out["top_logprobs"].push_back(std::move(top));
  };
  if (prompt && !options_.echo_ids.empty()) {
    const std::vector<int32_t>& ids = options_.echo_ids[prompt->prompt];
    const std::vector<sampling::SampledToken>& scored = prompt_logprobs_[prompt->prompt];
    for (size_t i = 0; i < ids.size(); ++i) add(ids[i], i > 0 && i - 1 < scored.size() ? &scored[i - 1] : nullptr);
  }
  offset = text_offset;
  for (const auto& t : tokens) add(t.token, &t);
  return out;
}

json GenerationJob::usage_json() const {
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", prompt_tokens_ + completion_tokens_},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}}};
}

json GenerationJob::chunk(json choices) const {
  return {{"id", options_.id},
          {"object", options_.kind == ApiKind::CHAT ? "chat.completion.chunk" : "text_completion"},
          {"created", options_.created},
          {"model", options_.model},
          {"choices", std::move(choices)}};
}

void GenerationJob::send_event(const json& event) { responder_->send_chunk("data: " + dump(event) + "\n\n"); }

void GenerationJob::begin() {
  if (done_) return;
  begun_ = true;
  if (options_.stream) responder_->start_stream(200);
  if (options_.stream && options_.kind == ApiKind::CHAT) {
    // As OpenAI, vLLM and FastDeploy stream a chat: each choice opens with a role-only chunk, so
    // clients that time the first token from the second event see the first token there.
    for (Choice& c : choices_) {
      json event = chunk(json::array({{{"index", c.index},
                                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                                       {"logprobs", nullptr},
                                       {"finish_reason", nullptr}}}));
      if (options_.continuous_usage) event["usage"] = usage_json();
      send_event(event);
    }
  }
  std::vector<std::pair<size_t, engine::RequestOutput>> early = std::move(early_);
  for (auto& [prompt, out] : early) on_output(prompt, std::move(out));
}

void GenerationJob::on_output(size_t prompt, engine::RequestOutput&& out) {
  if (done_) return;
  if (!begun_) {  // the engine answered before begin() ran: keep the order, send after the headers
    early_.emplace_back(prompt, std::move(out));
    return;
  }
  if (!out.error.empty() && error_.empty()) error_ = out.error;
  // Token counts come per engine request; keep each prompt's latest and sum at the end.
  prompt_counts_[prompt] = {out.prompt_tokens, out.completion_tokens, out.cached_tokens};
  prompt_tokens_ = completion_tokens_ = cached_tokens_ = 0;
  for (const auto& c : prompt_counts_) {
    prompt_tokens_ += c[0];
    completion_tokens_ += c[1];
    cached_tokens_ += c[2];
  }
  output_seconds_ = out.seconds_since_inference_start;
  if (!out.prompt_logprobs.empty()) prompt_logprobs_[prompt] = std::move(out.prompt_logprobs);
  for (engine::ChoiceDelta& d : out.choices) {
    Choice& c = choices_[prompt * options_.n + d.index];
    c.token_ids.insert(c.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
    c.text += d.text;
    const bool finished = d.finish != FinishReason::NONE;
    if (finished) {
      c.finish = d.finish;
      c.stop_string = d.stop_string;
      c.stop_token = d.stop_token;
    }
    if (options_.stream) {
      stream_choice(c, d, finished);
    } else {
      c.logprobs.insert(c.logprobs.end(), std::make_move_iterator(d.logprobs.begin()),
                        std::make_move_iterator(d.logprobs.end()));
      if (c.parser) {
        append(c.message, c.parser->add(d.text));
        if (finished) append(c.message, c.parser->finish());
      }
    }
  }
  if (out.finished && --unfinished_prompts_ == 0) finish();
}

json GenerationJob::generate_item(const Choice& c) const {
  json finish = nullptr;
  if (c.finish == FinishReason::STOP) {
    json matched = !c.stop_string.empty() ? json(c.stop_string)
                   : c.stop_token >= 0    ? json(c.stop_token)
                   : c.token_ids.empty()  ? json(nullptr)
                                          : json(c.token_ids.back());
    finish = {{"type", "stop"}, {"matched", matched}};
  } else if (c.finish == FinishReason::LENGTH) {
    finish = {{"type", "length"}, {"length", c.token_ids.size()}};
  } else if (c.finish == FinishReason::ABORT) {
    finish = {{"type", "abort"}, {"message", error_.empty() ? "aborted" : error_}};
  }
  const auto& counts = prompt_counts_[c.prompt];
  json meta = {{"id", engine_ids_[c.prompt]},
               {"finish_reason", finish},
               {"prompt_tokens", counts[0]},
               {"completion_tokens", c.token_ids.size()},
               {"cached_tokens", counts[2]},
               {"e2e_latency", std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count()},
               {"weight_version", model_->engine->model_info().weight_version}};
  if (options_.logprobs >= 0) {
    json lp = json::array(), top = json::array();
    for (const auto& t : c.logprobs) {
      lp.push_back({clamp_logprob(t.logprob), t.token, nullptr});
      json row = json::array();
      for (const auto& e : t.top) row.push_back({clamp_logprob(e.logprob), e.token, nullptr});
      top.push_back(std::move(row));
    }
    meta["output_token_logprobs"] = std::move(lp);
    if (options_.logprobs > 0) meta["output_top_logprobs"] = std::move(top);
  }
  json item = {{"text", c.text}, {"output_ids", c.token_ids}, {"meta_info", std::move(meta)}};
  if (options_.generate_batch || options_.n > 1) item["index"] = c.index;
  return item;
}

void GenerationJob::stream_choice(Choice& c, engine::ChoiceDelta& d, bool finished) {
  const bool echo_now = !options_.echo.empty() && !c.echo_sent;  // a completion's first chunk leads with the prompt
  const bool has_logprobs = options_.logprobs >= 0 && (!d.logprobs.empty() || (echo_now && !options_.echo_ids.empty()));
  const size_t offset = c.stream_offset;
  json lp = !has_logprobs                          ? json(nullptr)
            : options_.kind == ApiKind::COMPLETION ? completion_logprobs(echo_now ? &c : nullptr, d.logprobs, offset)
                                                   : logprobs_json(d.logprobs, offset);
  for (const sampling::SampledToken& t : d.logprobs) c.stream_offset += text::utf8_lossy(token_text(t.token)).size();
  if (options_.kind == ApiKind::GENERATE) {
    if (d.token_ids.empty() && !finished) return;
    c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    send_event(generate_item(c));
    return;
  }
  json choice = {{"index", c.index}};
  if (options_.kind == ApiKind::CHAT) {
    ChatDelta cd = c.parser->add(d.text);
    if (finished) append(cd, c.parser->finish());
    json delta = json::object();
    if (!cd.reasoning.empty()) delta["reasoning"] = delta["reasoning_content"] = cd.reasoning;
    if (!cd.content.empty()) delta["content"] = cd.content;
    if (!cd.tool_calls.empty()) {
      json calls = json::array();
      const int first = c.parser->tool_call_count() - static_cast<int>(cd.tool_calls.size());
      for (size_t k = 0; k < cd.tool_calls.size(); ++k) {
        json call = cd.tool_calls[k];
        call["index"] = first + static_cast<int>(k);
        calls.push_back(std::move(call));
      }
      delta["tool_calls"] = std::move(calls);
    }
    if (delta.empty() && !finished && !has_logprobs) return;  // nothing a client could show yet
    choice["delta"] = std::move(delta);
  } else {
    std::string text = d.text;
    if (echo_now) {
      text = options_.echo[c.prompt] + text;
      c.echo_sent = true;
    }
    if (text.empty() && !finished && !has_logprobs) return;
    choice["text"] = std::move(text);
  }
  choice["logprobs"] = std::move(lp);
  choice["finish_reason"] =
      finished ? json(finish_name(c.finish, c.parser && c.parser->tool_call_count() > 0)) : json(nullptr);
  if (finished) choice["stop_reason"] = stop_reason(c.stop_string, c.stop_token);
  // FastDeploy's server-side timing (serving_chat.py): seconds from the request's inference start
  // to this output; its benchmark_serving.py derives s_ttft, s_itl, s_e2el and s_decode from it.
  choice["arrival_time"] = output_seconds_;
  json event = chunk(json::array({std::move(choice)}));
  if (options_.continuous_usage) event["usage"] = usage_json();
  send_event(event);
}

void GenerationJob::finish() {
  done_ = true;
  ctx_.unregister_job(options_.id);
  if (options_.stream) {
    if (!error_.empty()) send_event(json::parse(error_body({500, error_, ""})));
    if (options_.include_usage && options_.kind != ApiKind::GENERATE) {
      json event = chunk(json::array());
      event["usage"] = usage_json();
      send_event(event);
    }
    responder_->send_chunk("data: [DONE]\n\n");
    responder_->end_stream();
    return;
  }
  if (!error_.empty()) return respond_error(responder_, {500, error_, ""});
  if (options_.kind == ApiKind::GENERATE) {
    if (!options_.generate_batch && options_.n == 1) return respond_json(responder_, 200, generate_item(choices_[0]));
    json items = json::array();
    for (const Choice& c : choices_) items.push_back(generate_item(c));
    return respond_json(responder_, 200, items);
  }
  json choices = json::array();
  for (Choice& c : choices_) {
    const bool tools = c.parser && c.parser->tool_call_count() > 0;
    json choice = {{"index", c.index}};
    if (options_.kind == ApiKind::CHAT) {
      const bool blank = c.message.content.find_first_not_of(" \t\r\n") == std::string::npos;
      // The reasoning under both names: current vLLM's `reasoning` and the `reasoning_content` of older
      // vLLM and DeepSeek's API, which most clients read. tool_calls only when there are calls (vLLM:
      // an empty list makes the openai client's message.tool_calls [] instead of None).
      const json reasoning = c.message.reasoning.empty() ? json(nullptr) : json(c.message.reasoning);
      choice["message"] = {{"role", "assistant"},
                           {"content", tools && blank ? json(nullptr) : json(c.message.content)},
                           {"reasoning", reasoning},
                           {"reasoning_content", reasoning}};
      if (!c.message.tool_calls.empty()) choice["message"]["tool_calls"] = c.message.tool_calls;
    } else {
      choice["text"] = options_.echo.empty() ? c.text : options_.echo[c.prompt] + c.text;
    }
    choice["logprobs"] = options_.logprobs < 0                  ? json(nullptr)
                         : options_.kind == ApiKind::COMPLETION ? completion_logprobs(&c, c.logprobs, c.text_offset)
                                                                : logprobs_json(c.logprobs, c.text_offset);
    choice["finish_reason"] = finish_name(c.finish, tools);
    choice["stop_reason"] = stop_reason(c.stop_string, c.stop_token);
    choices.push_back(std::move(choice));
  }
  respond_json(responder_, 200,
               {{"id", options_.id},
                {"object", options_.kind == ApiKind::CHAT ? "chat.completion" : "text_completion"},
                {"created", options_.created},
                {"model", options_.model},
                {"choices", std::move(choices)},
                {"usage", usage_json()}});
}

}  // namespace nibble::server
