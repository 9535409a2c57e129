// The engine's per-request and per-sequence state (private to engine*.cpp): what the step loop and
// the output side (engine_output.cpp) share.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/text_output.h"

namespace nibble::engine {

struct Engine::RequestState : std::enable_shared_from_this<Engine::RequestState> {
  GenerationRequest request;
  std::vector<std::unique_ptr<SeqState>> choices;
  int32_t n_unfinished = 0;
  int64_t completion_tokens = 0;
  bool first_token_seen = false;
  Clock::time_point first_token_time;
  std::optional<Clock::time_point> inference_start;  // when a step first ran one of its tokens
  uint64_t mark = 0;                                 // the last pass over a step that met it
  std::string error;
  std::vector<int32_t> masked;  // EOS + stop_token_ids while output < min_tokens
  std::set<int32_t> eos;
  // Prompt logprobs (request.prompt_logprobs >= 0): choice 0 scores the prompt; entry i is token i's.
  sampling::SamplingParams score_params;
  std::vector<sampling::SampledToken> prompt_logprobs;
  std::vector<bool> scored;
  int64_t n_scored = 0;
  bool prompt_logprobs_sent = false;
  bool prompt_scored() const { return n_scored + 1 >= static_cast<int64_t>(request.prompt.size()); }
};

struct Engine::SeqState : Sequence {
  SeqState(RequestState& r, int32_t i, const text::Tokenizer& tokenizer)
      : request(&r),
        index(i),
        text(tokenizer, r.request.skip_special_tokens, r.request.stop.stop, r.request.stop.include_stop_str_in_output) {
  }
  RequestState* request;
  int32_t index;
  uint64_t seed = 0;  // the counter-based sampler's key; the position is the counter
  TextOutput text;
  FinishReason finish = FinishReason::NONE;
  bool reported_finish = false;
  std::string stop_string;
  int32_t stop_token = -1;
  std::vector<int32_t> new_tokens;  // since the last output
  std::vector<sampling::SampledToken> new_logprobs;
  Clock::time_point last_token_time;
  bool changed = false;
  // Structured output: the matcher of the request's grammar, fed every collected output token once
  // active (from the start, or after the request's grammar_after_token).
  std::optional<grammar::Matcher> matcher;
  enum class GrammarPhase { OPEN, THINKING, ACTIVE };  // OPEN: the first token, grammar or think_start
  GrammarPhase grammar_phase = GrammarPhase::ACTIVE;
};

// Whether the token drawn into tokens[slot] ends the sequence by length whatever it is: then no
// step is built on it (the scheduler lets the sequence sit out until the token is collected).
inline bool ends_by_length(const Sequence& s, int64_t slot, const StopParams& stop, int64_t max_model_len) {
  return stop.max_tokens == 0 || slot + 1 - s.prompt_len >= stop.max_tokens || slot + 1 >= max_model_len;
}

}  // namespace nibble::engine
