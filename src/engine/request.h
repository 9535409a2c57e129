// The engine's typed interface: what a request asks for (token ids, sampling, stop conditions)
// and what comes back (per-step deltas per choice). The server builds these from JSON; no JSON
// reaches the engine.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "sampling/params.h"
#include "sampling/sampler.h"

namespace nibble::engine {

using Clock = std::chrono::steady_clock;

struct StopParams {
  int64_t max_tokens = -1;              // -1: until max_model_len
  int64_t min_tokens = 0;               // EOS and stop_token_ids are masked, stop strings unchecked, before this
  std::vector<std::string> stop;        // stop strings, matched across token boundaries, trimmed
  std::vector<int32_t> stop_token_ids;  // besides the model's EOS ids
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
};

enum class FinishReason { NONE, STOP, LENGTH, ABORT };
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "abort" ("" for NONE)

struct ChoiceDelta {
  int32_t index = 0;                             // which of the n choices
  std::vector<int32_t> token_ids;                // tokens generated since the last output
  std::vector<sampling::SampledToken> logprobs;  // one per token when logprobs were asked for
  std::string text;                              // text that became final since the last output
  FinishReason finish = FinishReason::NONE;
  std::string stop_string;  // the stop string that ended it, if any
  int32_t stop_token = -1;  // the stop_token_ids entry that ended it, if any
};

struct RequestOutput {
  std::vector<ChoiceDelta> choices;  // the choices that changed in this step
  bool finished = false;             // every choice has finished: the request's last output
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // over all choices, so far
  int64_t cached_tokens = 0;      // prompt tokens found in the prefix cache
  // When this output was made, in seconds since the engine first ran a step with the request
  // (since it arrived, if none has yet): FastDeploy's per-chunk `arrival_time`.
  double seconds_since_inference_start = 0.0;
  std::string error;  // set when the request failed; its choices end with ABORT
  // Prompt logprobs (GenerationRequest::prompt_logprobs >= 0), in one output once every prompt
  // position is scored: entry i is prompt token i + 1's (the first token has none).
  std::vector<sampling::SampledToken> prompt_logprobs;
};

// Called on the engine thread after each step that changed the request; it must not block
// (the server posts the output to the connection's executor).
using OutputCallback = std::function<void(RequestOutput&&)>;

struct GenerationRequest {
  std::string id;
  std::vector<int32_t> prompt;
  sampling::SamplingParams sampling;
  StopParams stop;
  int32_t n = 1;  // choices; choice i draws with seed + i when a seed is given
  // -1: none; k >= 0: each prompt token's raw logprob given the tokens before it, with the top k
  // (vLLM's prompt_logprobs; the request then skips the prefix cache, whose blocks were not scored).
  int32_t prompt_logprobs = -1;
  bool skip_special_tokens = true;
  // Structured output: every choice's tokens follow this compiled grammar (the server compiles it
  // before submitting). A reasoning model (think_start/think_end >= 0: <think>, </think>) may open
  // its output with think_start and think freely; the grammar then starts after think_end.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  int32_t think_start = -1, think_end = -1;
  Clock::time_point arrival = Clock::now();
  OutputCallback on_output;
};

}  // namespace nibble::engine
