// Engine, the output side: what a collected token does (stop checks, the text and logprob outputs
// a request is sent), how sequences and requests end, and the gauges. Runs on the engine thread.
#include <algorithm>

#include "core/log.h"
#include "engine/engine_state.h"

namespace nibble::engine {

// The token drawn into tokens[slot]: the pending id there (a later step in flight may already run on
// it), or appended when the sequence ends with it.
void Engine::accept_token(SeqState& s, sampling::SampledToken&& drawn, int64_t slot, Clock::time_point now) {
  RequestState& r = *s.request;
  const StopParams& stop = r.request.stop;
  const int32_t token = drawn.token;
  if (slot == s.n_tokens()) {
    s.tokens.push_back(token);
  } else {
    s.tokens[static_cast<size_t>(slot)] = token;
    --s.n_pending;
  }
  const int64_t n_output = slot + 1 - s.prompt_len;  // this token's count (later ones may be pending)
  // Structured output: the grammar takes the token (its mask allowed it), or starts after it.
  bool grammar_refused = false, grammar_done = false;
  if (s.matcher) {
    using Phase = SeqState::GrammarPhase;
    if (s.grammar_phase == Phase::OPEN && token == r.request.think_start) {
      s.grammar_phase = Phase::THINKING;
    } else if (s.grammar_phase == Phase::THINKING) {
      if (token == r.request.think_end) s.grammar_phase = Phase::ACTIVE;
    } else {
      s.grammar_phase = Phase::ACTIVE;
      grammar_refused = !s.matcher->accept(token);
      grammar_done = !grammar_refused && s.matcher->terminated();
    }
  }
  s.new_tokens.push_back(token);
  if (r.request.sampling.logprobs >= 0) s.new_logprobs.push_back(std::move(drawn));
  s.changed = true;
  ++r.completion_tokens;
  const bool first_of_sequence = n_output == 1;
  metrics_.update([&](MetricsSnapshot& m) {
    ++m.generation_tokens;
    if (!first_of_sequence) m.itl.observe(std::chrono::duration<double>(now - s.last_token_time).count());
    if (!r.first_token_seen) {
      m.ttft.observe(std::chrono::duration<double>(now - r.request.arrival).count());
      m.prompt_tokens += static_cast<uint64_t>(s.prompt_len);
    }
  });
  if (!r.first_token_seen) {
    r.first_token_seen = true;
    r.first_token_time = now;
  }
  s.last_token_time = now;

  // Stop checks in vLLM's order (vllm/v1/core/sched/utils.py check_stop); none before min_tokens.
  const bool stops_allowed = n_output >= stop.min_tokens;
  FinishReason finish = FinishReason::NONE;
  if (stops_allowed && r.eos.count(token)) {
    finish = FinishReason::STOP;
  } else if (stops_allowed &&
             std::find(stop.stop_token_ids.begin(), stop.stop_token_ids.end(), token) != stop.stop_token_ids.end()) {
    finish = FinishReason::STOP;
    s.stop_token = token;
  }
  // A stop token's text is left out unless include_stop_str_in_output (as vLLM's detokenizer does).
  if (finish == FinishReason::NONE || stop.include_stop_str_in_output) {
    std::string matched = s.text.add(token, stops_allowed && finish == FinishReason::NONE);
    if (!matched.empty()) {
      finish = FinishReason::STOP;
      s.stop_string = std::move(matched);
    }
  }
  if (finish == FinishReason::NONE && grammar_done) finish = FinishReason::STOP;  // a stop token ended the grammar
  if (finish == FinishReason::NONE && ends_by_length(s, slot, stop, config_.max_model_len))
    finish = FinishReason::LENGTH;
  if (grammar_refused && finish == FinishReason::NONE) {  // cannot happen while masks hold; never continue past it
    log_error("structured output: the grammar refused token " + std::to_string(token) + " of request " + r.request.id);
    if (r.error.empty()) r.error = "structured output: the grammar refused token " + std::to_string(token);
    finish = FinishReason::ABORT;
  }
  if (finish != FinishReason::NONE) finish_sequence(s, finish);
}

void Engine::finish_sequence(SeqState& s, FinishReason reason) {
  if (s.finish != FinishReason::NONE) return;
  s.tokens.resize(s.tokens.size() - static_cast<size_t>(s.n_pending));  // draws in flight are dropped
  s.n_pending = 0;
  if (s.stop_string.empty()) {  // text held back to the end may hold a stop string: it stops there
    const bool check = reason != FinishReason::ABORT && s.n_output() >= s.request->request.stop.min_tokens;
    std::string matched = s.text.finish(check);
    if (!matched.empty()) reason = FinishReason::STOP, s.stop_string = std::move(matched);
  }
  s.finish = reason;
  s.changed = true;
  scheduler_.finish(&s);
  --s.request->n_unfinished;
}

void Engine::finish_request(RequestState& r, FinishReason reason, const std::string& error) {
  if (!error.empty() && r.error.empty()) r.error = error;
  for (auto& s : r.choices) finish_sequence(*s, reason);
  emit(r, Clock::now());
}

void Engine::emit(RequestState& r, Clock::time_point now) {
  RequestOutput out;
  out.prompt_tokens = static_cast<int64_t>(r.request.prompt.size());
  out.completion_tokens = r.completion_tokens;
  out.cached_tokens = std::max<int64_t>(r.choices.front()->n_cached_prompt, 0);
  out.finished = r.n_unfinished == 0;
  out.error = r.error;
  out.seconds_since_inference_start =
      std::chrono::duration<double>(now - r.inference_start.value_or(r.request.arrival)).count();
  if (r.request.prompt_logprobs >= 0 && !r.prompt_logprobs_sent && r.prompt_scored()) {
    r.prompt_logprobs_sent = true;
    out.prompt_logprobs.assign(std::make_move_iterator(r.prompt_logprobs.begin() + 1),
                               std::make_move_iterator(r.prompt_logprobs.end()));
  }
  for (auto& sp : r.choices) {
    SeqState& s = *sp;
    if (!s.changed || s.reported_finish) continue;
    s.changed = false;
    ChoiceDelta d;
    d.index = s.index;
    d.token_ids.swap(s.new_tokens);  // the sequence starts the next step with an empty list
    d.logprobs.swap(s.new_logprobs);
    d.text = s.text.take(s.finish != FinishReason::NONE);
    d.finish = s.finish;
    d.stop_string = s.stop_string;
    d.stop_token = s.stop_token;
    s.reported_finish = s.finish != FinishReason::NONE;
    out.choices.push_back(std::move(d));
  }
  if (out.finished) {
    metrics_.update([&](MetricsSnapshot& m) {
      const double e2e = std::chrono::duration<double>(now - r.request.arrival).count();
      m.e2e.observe(e2e);
      const SeqState& first = *r.choices.front();
      ++m.finished[r.error.empty() ? finish_reason_name(first.finish) : "error"];
      if (r.first_token_seen && first.n_output() > 1)
        m.tpot.observe(std::chrono::duration<double>(now - r.first_token_time).count() / (first.n_output() - 1));
    });
  }
  if (!out.finished) {
    r.request.on_output(std::move(out));
    return;
  }
  // The last output: take what outlives the request before it goes.
  OutputCallback callback = std::move(r.request.on_output);
  const std::string id = r.request.id;  // not a reference into the element erase destroys
  requests_.erase(id);                  // destroys r
  callback(std::move(out));
}

void Engine::publish_gauges() {
  metrics_.update([&](MetricsSnapshot& m) {
    m.requests_running = static_cast<int64_t>(scheduler_.running().size());
    m.requests_waiting = static_cast<int64_t>(scheduler_.waiting().size());
    m.kv_blocks_total = blocks_.n_blocks();
    m.kv_usage = blocks_.n_blocks() ? static_cast<double>(blocks_.n_used()) / blocks_.n_blocks() : 0.0;
    m.preemptions = static_cast<uint64_t>(scheduler_.total_preemptions());
    m.prefix_queries = static_cast<uint64_t>(blocks_.prefix_queries());
    m.prefix_hits = static_cast<uint64_t>(blocks_.prefix_hits());
  });
}
}  // namespace nibble::engine
