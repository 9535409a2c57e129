// Engine::warm_up: requests of made-up tokens run before serving, so that the kernels a first
// request would load (CUDA loads a module at its first launch) are loaded; then they are forgotten.
#include <algorithm>
#include <future>

#include "engine/engine.h"

namespace nibble::engine {

std::vector<int64_t> warm_up_prompt_lengths(const SchedulerLimits& limits, int64_t max_model_len) {
  // A prompt must leave room for its WARM_UP_TOKENS and fit one step's token budget.
  const int64_t cap = std::min(limits.max_num_batched_tokens, max_model_len - WARM_UP_TOKENS);
  std::vector<int64_t> lengths;
  for (int64_t length : {WARM_UP_SHORT_PROMPT, WARM_UP_LONG_PROMPT}) {
    length = std::min(length, cap);
    if (length >= 1 && (lengths.empty() || length > lengths.back())) lengths.push_back(length);
  }
  return lengths;
}

std::vector<int32_t> warm_up_prompt(int64_t length, int64_t index, int64_t vocab_size) {
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (int64_t t = 0; t < length; ++t)
    prompt[static_cast<size_t>(t)] = static_cast<int32_t>((t * 7919 + index * 104729 + 1) % vocab_size);
  return prompt;
}

Status Engine::warm_up(const std::vector<int64_t>& prompt_lengths) {
  for (size_t i = 0; i < prompt_lengths.size(); ++i) {
    GenerationRequest request;
    request.id = "nibble-warm-up-" + std::to_string(i);
    request.prompt = warm_up_prompt(prompt_lengths[i], static_cast<int64_t>(i), model_config_.vocab_size);
    // The first greedy, the rest sampled as Qwen3 suggests (top-k, top-p), with logprobs: the
    // sampler's paths a request can take.
    if (i == 0) {
      request.sampling.temperature = 0.0f;
    } else {
      request.sampling.temperature = 0.7f, request.sampling.top_k = 20, request.sampling.top_p = 0.8f;
      request.sampling.seed = 0, request.sampling.logprobs = 1;
    }
    request.stop.max_tokens = request.stop.min_tokens = WARM_UP_TOKENS;
    request.stop.ignore_eos = true;
    auto finished = std::make_shared<std::promise<std::string>>();
    request.on_output = [finished](RequestOutput&& out) {
      if (!out.finished) return;
      std::string error = out.error;
      for (const ChoiceDelta& c : out.choices)
        if (error.empty() && c.finish == FinishReason::ABORT) error = "it was aborted";
      finished->set_value(error);
    };
    std::future<std::string> result = finished->get_future();
    const std::string what = "the warm-up request of " + std::to_string(prompt_lengths[i]) + " prompt tokens";
    if (Status submitted = submit(std::move(request)); !submitted)
      return Status::error(what + ": " + submitted.message());
    if (std::string error = result.get(); !error.empty()) return Status::error(what + ": " + error);
  }
  // Forgotten: its blocks leave the prefix cache (flush_cache: the requests have ended, so it is not
  // refused), then, on the engine thread, the counters start from zero.
  auto flushed = std::make_shared<std::promise<Status>>();
  std::future<Status> flush = flushed->get_future();
  flush_cache([this, flushed](Status status) {
    if (status) {
      blocks_.reset_counters();
      metrics_.clear_counters();
      publish_gauges();
    }
    flushed->set_value(std::move(status));
  });
  return flush.get();
}

}  // namespace nibble::engine
