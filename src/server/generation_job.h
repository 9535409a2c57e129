// One HTTP generation (chat, completions or SGLang /generate) in flight: it submits one engine
// request per prompt, turns the engine's outputs into the API's chunks or final body, and aborts
// its engine requests when the client goes away. All its state lives on its own strand.
#pragma once

#include <array>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "server/chat_output.h"
#include "server/context.h"

namespace nibble::server {

enum class ApiKind { CHAT, COMPLETION, GENERATE };

struct JobOptions {
  ApiKind kind = ApiKind::COMPLETION;
  std::string id;  // response id; engine request ids are id, or id-<prompt index>
  std::string model;
  int64_t created = 0;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool continuous_usage = false;  // stream_options.continuous_usage_stats
  int32_t logprobs = -1;          // top logprobs per token; -1: none
  bool parse_reasoning = false;
  bool parse_tool_calls = false;
  int32_t max_tool_calls = INT32_MAX;  // parallel_tool_calls: false gives 1
  std::vector<std::string> echo;       // completions echo: the prompt texts, else empty
  // Completions echo with logprobs: the prompts' ids, whose logprobs (engine prompt_logprobs) lead
  // each choice's logprobs; else empty.
  std::vector<std::vector<int32_t>> echo_ids;
  int32_t n = 1;
  bool generate_batch = false;  // /generate with a list of prompts: the reply is a list
};

class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  GenerationJob(ServingContext& ctx, std::shared_ptr<LoadedModel> model, JobOptions options, Responder responder);
  ~GenerationJob();
  // Submits the requests (their on_output is set here). A request the engine refuses answers 400.
  void start(std::vector<engine::GenerationRequest> requests);
  void abort();

 private:
  struct Choice;
  void begin();
  void on_output(size_t prompt, engine::RequestOutput&& out);
  void stream_choice(Choice& c, engine::ChoiceDelta& d, bool finished);
  void finish();
  json logprobs_json(const std::vector<sampling::SampledToken>& tokens, size_t text_offset) const;
  // A completion choice's logprobs: its echoed prompt's (when `prompt` is set), then `tokens`'.
  json completion_logprobs(const Choice* prompt, const std::vector<sampling::SampledToken>& tokens,
                           size_t text_offset) const;
  json usage_json() const;
  json generate_item(const Choice& c) const;
  std::string token_text(int32_t id) const;
  json chunk(json choices) const;  // a streamed event: id, object, created, model, choices
  void send_event(const json& event);

  ServingContext& ctx_;
  std::shared_ptr<LoadedModel> model_;
  JobOptions options_;
  Responder responder_;
  boost::asio::strand<boost::asio::io_context::executor_type> strand_;
  std::vector<std::string> engine_ids_;
  std::vector<Choice> choices_;
  size_t unfinished_prompts_ = 0;
  std::vector<std::array<int64_t, 3>> prompt_counts_;                 // per prompt: prompt, completion, cached tokens
  std::vector<std::vector<sampling::SampledToken>> prompt_logprobs_;  // per prompt, when echo_ids is set
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
  std::string error_;
  bool done_ = false;
  double output_seconds_ = 0.0;  // the latest output's seconds since inference start (arrival_time)
  bool begun_ = false;           // begin() ran: headers sent (stream), outputs flow
  std::vector<std::pair<size_t, engine::RequestOutput>> early_;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace nibble::server
