// Engine: the command queue, the step loop (schedule → launch step N + 1 → collect step N: stop
// checks, outputs — overlapped with the device's work) and the weight swap. Everything below runs on
// the engine thread except submit's checks, post() and the public wrappers that only queue commands;
// what a collected token does is engine_output.cpp.
#include "engine/engine.h"

#include <algorithm>
#include <random>

#include "core/log.h"
#include "core/parallel.h"
#include "engine/engine_state.h"

namespace nibble::engine {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::STOP:
      return "stop";
    case FinishReason::LENGTH:
      return "length";
    case FinishReason::ABORT:
      return "abort";
    case FinishReason::NONE:
      break;
  }
  return "";
}


// The runners size their logits for MAX_SCORE_ROWS score rows beside the sampled ones.
static SchedulerLimits with_score_rows(SchedulerLimits limits) {
  limits.max_score_rows = std::clamp<int64_t>(limits.max_score_rows, 1, MAX_SCORE_ROWS);
  return limits;
}

std::shared_ptr<std::FILE> open_step_log(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return nullptr;
  return std::shared_ptr<std::FILE>(f, [](std::FILE* file) { std::fclose(file); });
}

Engine::Engine(EngineConfig config, std::unique_ptr<ModelRunner> runner,
               std::shared_ptr<const text::Tokenizer> tokenizer, ModelInfo info)
    : config_(std::move(config)),
      runner_(std::move(runner)),
      model_config_(runner_->config()),
      tokenizer_(std::move(tokenizer)),
      blocks_(runner_->n_kv_blocks(), runner_->block_size(), config_.prefix_caching),
      scheduler_(with_score_rows(config_.limits), blocks_),
      info_(std::move(info)) {
  if (config_.step_log) std::fputs("tokens,sequences,prefill_tokens,device_ms,idle_ms\n", config_.step_log.get());
  publish_gauges();
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

bool Engine::post(Command command) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (exited_) return false;
    commands_.push_back(std::move(command));
  }
  wake_.notify_one();
  return true;
}

ModelInfo Engine::model_info() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return info_;
}

Status Engine::submit(GenerationRequest request) {
  const int64_t prompt_len = static_cast<int64_t>(request.prompt.size());
  if (prompt_len == 0) return Status::error("the prompt is empty");
  for (int32_t id : request.prompt)
    if (id < 0 || id >= model_config_.vocab_size)
      return Status::error("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                           std::to_string(model_config_.vocab_size) + ")");
  for (int32_t id : request.stop.stop_token_ids)
    if (id < 0 || id >= model_config_.vocab_size)
      return Status::error("stop_token_ids entry " + std::to_string(id) + " is outside the vocabulary");
  if (request.n < 1 || request.n > 128) return Status::error("n must be between 1 and 128");
  if (request.prompt_logprobs > 20) return Status::error("prompt_logprobs must be at most 20");
  NIB_RETURN_IF_ERROR(request.sampling.validate());
  StopParams& stop = request.stop;
  if (stop.max_tokens < -1) return Status::error("max_tokens must be >= 0");
  if (stop.min_tokens < 0) return Status::error("min_tokens must be >= 0");
  // OpenAI's and vLLM's wording, which clients (LiteLLM, LangChain) match to fall back to a longer model.
  const int64_t room = config_.max_model_len - prompt_len;
  const std::string limit =
      "This model's maximum context length is " + std::to_string(config_.max_model_len) + " tokens. ";
  if (room < 0 || (room == 0 && stop.max_tokens != 0))
    return Status::error(limit + "However, your request has " + std::to_string(prompt_len) +
                         " input tokens. Please reduce the length of the input messages.");
  if (stop.max_tokens > room)
    return Status::error(limit + "However, you requested " + std::to_string(prompt_len + stop.max_tokens) +
                         " tokens (" + std::to_string(prompt_len) + " in the messages, " +
                         std::to_string(stop.max_tokens) +
                         " in the completion). Please reduce the length of the messages or completion.");
  if (stop.max_tokens < 0) stop.max_tokens = room;
  if (stop.min_tokens > stop.max_tokens) return Status::error("min_tokens must not exceed max_tokens");
  if (!request.on_output) return Status::error("internal: a request without an output callback");
  if (out_of_service_) return Status::error("this engine is out of service: " + failure());
  auto shared = std::make_shared<GenerationRequest>(std::move(request));
  if (!post([this, shared] { add_request(shared); })) return Status::error("the server is shutting down");
  return Status::ok();
}

void Engine::abort(const std::string& request_id) {
  post([this, request_id] {
    auto it = requests_.find(request_id);
    if (it != requests_.end()) finish_request(*it->second, FinishReason::ABORT, "");
  });
}

void Engine::abort_all() {
  post([this] { abort_every_request(); });
}

void Engine::abort_every_request(const std::string& error) {
  std::vector<RequestState*> all;  // finish_request erases from requests_
  for (auto& [id, r] : requests_) all.push_back(r.get());
  for (RequestState* r : all) finish_request(*r, FinishReason::ABORT, error);
}

std::string Engine::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

void Engine::update_weights(WeightUpdate update, std::function<void(WeightUpdateResult)> done) {
  auto pending = std::make_shared<PendingUpdate>(PendingUpdate{std::move(update), std::move(done)});
  const bool posted = post([this, pending] {
    if (pending_update_) {
      pending->done({false, "another weight update is in progress", 0});
      return;
    }
    if (pending->update.abort_all_requests) abort_every_request();
    pending_update_ = std::make_unique<PendingUpdate>(std::move(*pending));
    try_weight_update();
  });
  if (!posted) pending->done({false, "the server is shutting down", 0});
}

void Engine::flush_cache(std::function<void(Status)> done) {
  auto shared_done = std::make_shared<std::function<void(Status)>>(std::move(done));
  const bool posted = post([this, shared_done] {
    auto& done = *shared_done;
    if (!requests_.empty()) {
      done(Status::error("cannot flush the cache while " + std::to_string(requests_.size()) +
                         " requests are running or waiting"));
      return;
    }
    blocks_.reset_prefix_cache();
    done(Status::ok());
  });
  if (!posted) (*shared_done)(Status::error("the server is shutting down"));
}

void Engine::add_request(std::shared_ptr<GenerationRequest> shared) {
  GenerationRequest& request = *shared;
  if (requests_.count(request.id)) {
    RequestOutput out;
    out.finished = true;
    out.error = "a request with id '" + request.id + "' is already running";
    request.on_output(std::move(out));
    return;
  }
  auto state = std::make_shared<RequestState>();
  RequestState& r = *state;
  r.request = std::move(request);
  const StopParams& stop = r.request.stop;
  if (!stop.ignore_eos) r.eos.insert(config_.eos_token_ids.begin(), config_.eos_token_ids.end());
  r.masked.assign(r.eos.begin(), r.eos.end());
  r.masked.insert(r.masked.end(), stop.stop_token_ids.begin(), stop.stop_token_ids.end());
  std::random_device entropy;
  const uint64_t base_seed =
      r.request.sampling.seed ? *r.request.sampling.seed : (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  for (int32_t i = 0; i < r.request.n; ++i) {
    auto seq = std::make_unique<SeqState>(r, i, *tokenizer_);
    seq->id = next_seq_id_++;
    seq->tokens = r.request.prompt;
    seq->prompt_len = static_cast<int64_t>(r.request.prompt.size());
    seq->seed = base_seed + static_cast<uint64_t>(i);  // vLLM: choice i of n draws with seed + i
    seq->arrival_seconds = std::chrono::duration<double>(r.request.arrival.time_since_epoch()).count();
    if (r.request.grammar) {
      seq->matcher.emplace(r.request.grammar);
      const bool thinks = r.request.think_start >= 0 && r.request.think_end >= 0;
      seq->grammar_phase = thinks ? SeqState::GrammarPhase::OPEN : SeqState::GrammarPhase::ACTIVE;
    }
    scheduler_.add(seq.get());
    r.choices.push_back(std::move(seq));
  }
  r.n_unfinished = r.request.n;
  if (r.request.prompt_logprobs >= 0) {
    r.score_params.temperature = 0.0f;
    r.score_params.logprobs = r.request.prompt_logprobs;
    r.prompt_logprobs.resize(r.request.prompt.size());
    r.scored.assign(r.request.prompt.size(), false);
    r.choices.front()->scores_prompt = r.request.prompt.size() > 1;
  }
  requests_[r.request.id] = std::move(state);
}

void Engine::loop() {
  runner_->bind_thread();
  for (;;) {
    std::deque<Command> commands;
    bool stopping;
    const bool back_to_back = has_work_;  // steps follow without waiting for new work
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return !commands_.empty() || stopping_ || has_work_; });
      commands.swap(commands_);
      stopping = stopping_;
    }
    const Clock::time_point begin = Clock::now();  // not waiting for work from here
    for (Command& command : commands) command();
    if (stopping) break;
    try_weight_update();
    // Out of service, the engine only collects what is in flight, then ends every request.
    const StepPlan plan = out_of_service_
                              ? StepPlan{}
                              : scheduler_.schedule(/*admit_new=*/!pending_update_,
                                                    std::chrono::duration<double>(begin.time_since_epoch()).count());
    step_.runner_seconds = 0.0;
    if (!plan.empty()) launch_step(plan, back_to_back);
    // Overlapped, the step before the one just launched is collected while the device runs this one.
    const bool collect = n_in_flight_ > (config_.overlap && !plan.empty() ? 1 : 0);
    if (collect) collect_step();
    if (out_of_service_ && n_in_flight_ == 0 && !requests_.empty())
      abort_every_request("this engine is out of service: " + failure());
    // Another turn while anything ran: a collected step may have freed the blocks a waiting sequence
    // needs, or ended what a weight swap waits for.
    has_work_ = !plan.empty() || collect || n_in_flight_ > 0;
    publish_gauges();
    if (!plan.empty()) {
      const double engine_seconds = std::chrono::duration<double>(Clock::now() - begin).count() - step_.runner_seconds;
      metrics_.update([&](MetricsSnapshot& m) {
        ++m.steps;
        m.step_model_seconds += step_.runner_seconds;
        m.step_engine_seconds += engine_seconds;
        m.step_engine.observe(engine_seconds);
      });
    }
  }
  while (n_in_flight_ > 0) collect_step();  // the device's last steps, before every request ends
  // Shutdown: commands that raced with it still run, then every request ends (ABORT) and a
  // waiting weight update is refused.
  std::deque<Command> rest;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    exited_ = true;
    rest.swap(commands_);
  }
  for (Command& command : rest) command();
  abort_every_request();
  if (pending_update_) pending_update_->done({false, "the server is shutting down", 0});
  pending_update_.reset();
}

void Engine::try_weight_update() {
  if (!pending_update_ || !scheduler_.running().empty() || scheduler_.n_started_waiting() > 0 || n_in_flight_ > 0)
    return;
  const WeightUpdate& u = pending_update_->update;
  WeightUpdateResult result;
  result.num_paused_requests = static_cast<int64_t>(requests_.size());
  log_info("weight update from " + u.model_path + ": " + std::to_string(result.num_paused_requests) +
           " requests wait for it");
  const Status status = runner_->replace_weights(u.model_path);
  if (status) {
    if (u.flush_cache) blocks_.reset_prefix_cache();
    std::lock_guard<std::mutex> lock(mutex_);
    info_.model_path = u.model_path;
    if (!u.weight_version.empty()) info_.weight_version = u.weight_version;
    result.success = true;
    result.message = "Succeeded to update model weights.";
  } else {
    result.message = "Failed to update weights: " + status.message();
  }
  log_info("weight update: " + result.message);
  auto done = std::move(pending_update_->done);
  pending_update_.reset();
  done(std::move(result));
}


void Engine::launch_step(const StepPlan& plan, bool back_to_back) {
  // The step's buffers live across steps, so a steady decode allocates nothing here.
  models::Batch& batch = step_.batch;
  std::vector<SampleRow>& rows = step_.rows;
  InFlight& f = in_flight_[(oldest_ + n_in_flight_) % 2];
  batch.token_ids.clear();
  batch.logits_rows.clear();
  rows.clear();
  step_.score_rows.clear();
  step_.score_samples.clear();
  f.scored.clear();
  f.sampled.clear();
  f.slots.clear();
  f.requests.clear();
  f.constrained.clear();
  f.back_to_back = back_to_back;
  f.n_tokens = plan.n_tokens;
  f.n_sequences = static_cast<int64_t>(plan.chunks.size());
  f.n_prefill_tokens = 0;
  for (const ScheduledChunk& c : plan.chunks)
    if (c.n_tokens > 1 || c.start < c.seq->prompt_len) f.n_prefill_tokens += c.n_tokens;
  const uint64_t pass = ++step_.pass;
  size_t n_sequences = 0;
  const Clock::time_point step_start = Clock::now();
  for (const ScheduledChunk& c : plan.chunks) {
    RequestState& owner = *static_cast<SeqState*>(c.seq)->request;
    if (!owner.inference_start) owner.inference_start = step_start;
    if (owner.mark != pass) {
      owner.mark = pass;
      f.requests.push_back(owner.shared_from_this());
    }
    const auto first = c.seq->tokens.begin() + c.start;  // pending ids where the step before draws them
    batch.token_ids.insert(batch.token_ids.end(), first, first + c.n_tokens);
    if (n_sequences == batch.sequences.size()) batch.sequences.emplace_back();
    models::BatchSequence& bs = batch.sequences[n_sequences++];
    bs.block_table.assign(c.seq->block_table.begin(), c.seq->block_table.end());  // reuses its capacity
    bs.start_position = c.start;
    bs.n_tokens = c.n_tokens;
    SeqState& s = *static_cast<SeqState*>(c.seq);
    const RequestState& r = *s.request;
    if (s.scores_prompt) {  // each prompt position but the last scores the token after it
      const int64_t first_row = static_cast<int64_t>(batch.token_ids.size()) - c.n_tokens;
      const int64_t end = std::min(c.start + c.n_tokens, s.prompt_len - 1);
      for (int64_t p = c.start; p < end; ++p) {
        step_.score_rows.push_back(first_row + (p - c.start));
        step_.score_samples.push_back({&r.score_params, {}, {}, s.tokens[static_cast<size_t>(p + 1)]});
        f.scored.emplace_back(&s, p + 1);
      }
      if (end == s.prompt_len - 1) s.scores_prompt = false;  // a recompute after preemption scores nothing
    }
    if (!c.wants_logits) continue;
    batch.logits_rows.push_back(static_cast<int64_t>(batch.token_ids.size()) - 1);
    f.sampled.push_back(&s);
    const bool before_min = s.n_output() < r.request.stop.min_tokens;
    // A draw depends on (logits, seed, position) only, never on the batch around it.
    rows.push_back({&r.request.sampling,
                    {std::span<const int32_t>(s.tokens.data(), s.prompt_len),
                     std::span<const int32_t>(s.tokens.data() + s.prompt_len, s.n_output()),
                     before_min ? std::span<const int32_t>(r.masked) : std::span<const int32_t>(),
                     {}},
                    {s.seed, static_cast<uint64_t>(s.tokens.size())}});
    if (s.matcher) {
      rows.back().constrained = true;
      f.constrained.push_back(&s);
    }
  }
  batch.sequences.resize(n_sequences);
  batch.logits_rows.insert(batch.logits_rows.end(), step_.score_rows.begin(), step_.score_rows.end());
  rows.insert(rows.end(), step_.score_samples.begin(), step_.score_samples.end());
  const Clock::time_point launch_start = Clock::now();
  const Status status = runner_->launch(batch, rows);
  step_.runner_seconds += std::chrono::duration<double>(Clock::now() - launch_start).count();
  if (!status) return abort_step(f, status);
  ++n_in_flight_;
  f.masks_owed = !f.constrained.empty();
  // The masks follow the tokens drawn before: with no older step in flight they are known now;
  // else collect_step supplies them once that step's tokens are in.
  if (n_in_flight_ == 1) supply_masks();
  scheduler_.complete(plan);
  // Each drawn token's place: a pending id the next step can run on, unless it ends the sequence.
  for (size_t i = 0; i < f.sampled.size(); ++i) {
    SeqState& s = *f.sampled[i];
    const int64_t slot = s.n_tokens();
    f.slots.push_back(slot);
    if (ends_by_length(s, slot, s.request->request.stop, config_.max_model_len)) continue;
    s.tokens.push_back(models::pending_token(static_cast<int64_t>(i)));
    ++s.n_pending;
  }
}

// A step that failed to launch or to run: every request in it ends with the error.
void Engine::abort_step(InFlight& f, const Status& status) {
  log_error("step failed: " + status.message());
  if (config_.out_of_service_on_failure && !out_of_service_) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      failure_ = "a model step failed: " + status.message();
    }
    out_of_service_ = true;
    log_error("this engine is out of service; its requests end with the error");
  }
  for (auto& r : f.requests) finish_request(*r, FinishReason::ABORT, "model step failed: " + status.message());
  f.requests.clear();
}

void Engine::collect_step() {
  InFlight& f = in_flight_[oldest_];
  oldest_ = (oldest_ + 1) % 2;
  --n_in_flight_;
  StepOutput& out = step_.output;
  const Clock::time_point wait_start = Clock::now();
  const Status status = runner_->collect(out);
  const Clock::time_point now = Clock::now();
  step_.runner_seconds += std::chrono::duration<double>(now - wait_start).count();
  // Each request once, in batch order (a request's n choices share its output).
  std::vector<RequestState*>& touched = step_.touched;
  touched.clear();
  const uint64_t pass = ++step_.pass;
  auto touch = [&](RequestState* r) {
    if (r->mark == pass) return;
    r->mark = pass;
    touched.push_back(r);
  };
  if (!status) {
    blocks_.reset_prefix_cache();  // blocks it registered at launch may lack their K/V
    abort_step(f, status);
    supply_masks();  // the newer step's wait must end all the same
    return;
  }
  if (f.back_to_back && out.device_seconds >= 0 && out.device_idle_seconds >= 0)
    metrics_.update([&](MetricsSnapshot& m) {
      ++m.device_steps;
      m.device_step_seconds += out.device_seconds;
      m.device_idle_seconds += out.device_idle_seconds;
      m.device_idle.observe(out.device_idle_seconds);
    });
  if (config_.step_log) {  // times the runner does not know (the CPU's), or idle after a wait, stay empty
    const double idle = f.back_to_back ? out.device_idle_seconds : -1.0;
    auto ms = [](double seconds) {
      char text[32] = "";
      if (seconds >= 0) std::snprintf(text, sizeof text, "%.3f", 1e3 * seconds);
      return std::string(text);
    };
    std::fprintf(config_.step_log.get(), "%lld,%lld,%lld,%s,%s\n", static_cast<long long>(f.n_tokens),
                 static_cast<long long>(f.n_sequences), static_cast<long long>(f.n_prefill_tokens),
                 ms(out.device_seconds).c_str(), ms(idle).c_str());
  }
  for (size_t k = 0; k < f.scored.size(); ++k) {
    auto [s, index] = f.scored[k];
    RequestState& r = *s->request;
    if (s->finish != FinishReason::NONE || r.scored[static_cast<size_t>(index)]) continue;
    r.scored[static_cast<size_t>(index)] = true;
    ++r.n_scored;
    r.prompt_logprobs[static_cast<size_t>(index)] = std::move(out.tokens[f.sampled.size() + k]);
  }
  for (size_t i = 0; i < f.sampled.size(); ++i) {
    SeqState& s = *f.sampled[i];
    if (s.finish != FinishReason::NONE) continue;  // ended (stop, abort) while the step ran: its token goes
    touch(s.request);
    if (s.request->request.stop.max_tokens == 0)
      finish_sequence(s, FinishReason::LENGTH);  // prefill only
    else
      accept_token(s, std::move(out.tokens[i]), f.slots[i], now);
  }
  supply_masks();  // the newer step's masks, now that this step's tokens are accepted
  for (RequestState* r : touched) emit(*r, now);
  f.requests.clear();  // the step no longer holds them
}

// Fills and hands over the masks of the newest step in flight, if it still owes them: a
// sequence that ended (or whose grammar is not active yet) allows every token.
void Engine::supply_masks() {
  if (n_in_flight_ == 0) return;
  InFlight& f = in_flight_[(oldest_ + n_in_flight_ - 1) % 2];
  if (!f.masks_owed) return;
  f.masks_owed = false;
  const size_t words = static_cast<size_t>(grammar::mask_words(model_config_.vocab_size));
  std::vector<uint32_t>& masks = step_.masks;
  masks.assign(f.constrained.size() * words, ~0u);
  const Clock::time_point start = Clock::now();
  parallel_for(f.constrained.size(), [&](size_t i) {
    SeqState& s = *f.constrained[i];
    if (s.finish != FinishReason::NONE || s.grammar_phase == SeqState::GrammarPhase::THINKING ||
        s.matcher->terminated())
      return;
    uint32_t* row = masks.data() + i * words;
    s.matcher->fill_mask(row);
    if (s.grammar_phase == SeqState::GrammarPhase::OPEN) {  // or the start of a reasoning block
      const int32_t t = s.request->request.think_start;
      row[t / 32] |= 1u << (t % 32);
    }
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  metrics_.update([&](MetricsSnapshot& m) {
    m.grammar_mask_rows += f.constrained.size();
    m.grammar_mask_seconds += seconds;
  });
  const Status status = runner_->supply_masks(masks);
  if (!status) log_error("structured output: " + status.message());
}

}  // namespace nibble::engine
