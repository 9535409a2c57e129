// The serving engine: one thread owns the model runner, the KV blocks and the scheduler, and
// runs steps while there is work. Other threads talk to it through a command queue: submit a
// typed request (outputs come back through its callback), abort, swap weights, flush the cache.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"
#include "engine/metrics.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "text/tokenizer.h"

namespace nibble::engine {

struct EngineConfig {
  SchedulerLimits limits;
  int64_t max_model_len = 0;
  bool prefix_caching = true;
  // Overlapped scheduling: build and launch step N + 1 while the device runs step N, then collect
  // step N (its tokens reach step N + 1 on the device). Off: each step is collected before the next
  // is built (SGLang's --disable-overlap-schedule).
  bool overlap = true;
  std::vector<int32_t> eos_token_ids;  // config.json and generation_config.json
  // Where a CSV row per collected step goes ("tokens,sequences,prefill_tokens,device_ms,idle_ms"):
  // the cost of a step by its shape, to tune the token budget. Null: nowhere.
  std::shared_ptr<std::FILE> step_log;
  // One of several data-parallel engines (EngineGroup): a failed step takes the engine out of
  // service (its requests end with the error, new ones are refused) so that the group routes
  // around it. Alone, an engine keeps serving after a failed step (its requests end with the error).
  bool out_of_service_on_failure = false;
};

// The warm-up (Engine::warm_up): prompts of up to these lengths, each drawing WARM_UP_TOKENS tokens.
// 2,048 tokens take the prefill kernels of long prompts (wgmma GEMMs, the grouped MoE, FlashInfer's
// prefill), 16 those of short ones.
inline constexpr int64_t WARM_UP_SHORT_PROMPT = 16, WARM_UP_LONG_PROMPT = 2048, WARM_UP_TOKENS = 2;
// The warm-up's prompt lengths under these limits: each capped by a step's token budget and the
// context (less the drawn tokens), ascending, none twice.
std::vector<int64_t> warm_up_prompt_lengths(const SchedulerLimits& limits, int64_t max_model_len);
// The warm-up's prompt `index` of `length` tokens: ids spread over the vocabulary by a fixed stride
// (runs alike), no two prompts sharing a first token, so each one's prefill runs whole.
std::vector<int32_t> warm_up_prompt(int64_t length, int64_t index, int64_t vocab_size);

// EngineConfig::step_log's file, opened for writing (closed with its last owner); null on failure (errno says why).
std::shared_ptr<std::FILE> open_step_log(const std::string& path);

// SGLang's /update_weights_from_disk request and reply.
struct WeightUpdate {
  std::string model_path;
  bool flush_cache = true;
  bool abort_all_requests = false;
  std::string weight_version;  // "" keeps the current one
};
struct WeightUpdateResult {
  bool success = false;
  std::string message;
  int64_t num_paused_requests = 0;  // requests that waited (queued, not started) for the swap
};

struct ModelInfo {
  std::string model_path;
  std::string weight_version;
};

class Engine {
 public:
  Engine(EngineConfig config, std::unique_ptr<ModelRunner> runner, std::shared_ptr<const text::Tokenizer> tokenizer,
         ModelInfo info);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineConfig& config() const { return config_; }
  const io::ModelConfig& model_config() const { return model_config_; }  // a swap keeps the layout
  const text::Tokenizer& tokenizer() const { return *tokenizer_; }

  // Checks the request (prompt length and ids, n, sampling ranges, lengths against max_model_len)
  // and queues it. An error means it was not accepted; otherwise on_output is called until an
  // output with finished = true, whatever happens (abort, failure, shutdown).
  Status submit(GenerationRequest request);
  void abort(const std::string& request_id);  // unknown or finished ids are ignored
  void abort_all();
  // By default waits for started requests to finish while new ones queue; then swaps atomically.
  // `done` is called on the engine thread.
  void update_weights(WeightUpdate update, std::function<void(WeightUpdateResult)> done);
  // Forgets the prefix cache; refused while any request is running or waiting.
  void flush_cache(std::function<void(Status)> done);
  // Before serving (blocking; nothing else submitted meanwhile): one request a length of made-up
  // tokens, in turn (the first greedy, the others sampled with logprobs), so that CUDA loads the
  // kernels they use now rather than in a client's first request; then the prefix cache is flushed
  // and the counters start from zero, as if they had not run. An error names the request that failed.
  Status warm_up(const std::vector<int64_t>& prompt_lengths);

  ModelInfo model_info() const;
  // False once a failed step took the engine out of service (out_of_service_on_failure); why.
  bool in_service() const { return !out_of_service_.load(); }
  std::string failure() const;
  int64_t kv_blocks() const { return blocks_.n_blocks(); }
  int64_t block_size() const { return runner_->block_size(); }
  MetricsSnapshot metrics() const { return metrics_.snapshot(); }
  // Aborts every request (their outputs end with ABORT) and stops the engine thread.
  void shutdown();

 private:
  struct RequestState;
  struct SeqState;
  using Command = std::function<void()>;

  bool post(Command command);  // false once the engine thread has ended
  void loop();
  void add_request(std::shared_ptr<GenerationRequest> request);
  void launch_step(const StepPlan& plan, bool back_to_back);
  void collect_step();
  void accept_token(SeqState& s, sampling::SampledToken&& token, int64_t slot, Clock::time_point now);
  void finish_sequence(SeqState& s, FinishReason reason);
  void supply_masks();  // the grammar masks of the newest step in flight (model_runner.h supply_masks)
  void finish_request(RequestState& r, FinishReason reason, const std::string& error);
  void abort_every_request(const std::string& error = "");
  void emit(RequestState& r, Clock::time_point now);
  void try_weight_update();
  void publish_gauges();

  const EngineConfig config_;
  std::unique_ptr<ModelRunner> runner_;
  const io::ModelConfig model_config_;
  std::shared_ptr<const text::Tokenizer> tokenizer_;
  BlockManager blocks_;
  Scheduler scheduler_;
  Metrics metrics_;

  // Engine-thread state. A request lives while it runs and while a step in flight holds it.
  std::unordered_map<std::string, std::shared_ptr<RequestState>> requests_;
  uint64_t next_seq_id_ = 0;
  struct PendingUpdate {
    WeightUpdate update;
    std::function<void(WeightUpdateResult)> done;
  };
  std::unique_ptr<PendingUpdate> pending_update_;
  bool has_work_ = false;
  // A launched step until it is collected: at most two (overlapped, the one just launched and the
  // one before it). Kept in a ring so that steps reuse their memory.
  struct InFlight {
    std::vector<SeqState*> sampled;  // row i's sequence
    std::vector<int64_t> slots;      // the index row i's token takes in its sequence's tokens
    // Score rows (prompt logprobs) follow the sampled rows: each one's sequence and the prompt index
    // of the token it scores. Pending ids name only sampled rows, which keep their indices.
    std::vector<std::pair<SeqState*, int64_t>> scored;
    std::vector<std::shared_ptr<RequestState>> requests;  // each request of the step, kept alive
    std::vector<SeqState*> constrained;                   // structured output: its rows with a grammar, in order
    bool masks_owed = false;                              // their masks are not supplied yet
    bool back_to_back = false;  // launched without the engine running out of work since the last
    int64_t n_tokens = 0, n_sequences = 0, n_prefill_tokens = 0;  // the step's shape (--step-log)
  };
  InFlight in_flight_[2];
  int oldest_ = 0, n_in_flight_ = 0;
  void abort_step(InFlight& f, const Status& status);  // a failed step's requests end with its error
  struct StepBuffers {            // launch_step's and collect_step's, kept so that steps reuse their memory
    uint64_t pass = 0;            // a number per pass over a step's requests (RequestState::mark)
    double runner_seconds = 0.0;  // this loop turn's time inside the runner
    models::Batch batch;
    std::vector<SampleRow> rows;
    std::vector<int64_t> score_rows;  // the step's score rows' logits rows, appended after the sampled ones
    std::vector<SampleRow> score_samples;
    StepOutput output;
    std::vector<RequestState*> touched;
    std::vector<uint32_t> masks;  // supply_masks's words
  };
  StepBuffers step_;

  mutable std::mutex mutex_;  // guards commands_, stopping_, info_
  std::condition_variable wake_;
  std::deque<Command> commands_;
  bool stopping_ = false;
  bool exited_ = false;
  ModelInfo info_;
  std::atomic<bool> out_of_service_{false};
  std::string failure_;  // guarded by mutex_
  std::thread thread_;
};

}  // namespace nibble::engine
