// What the engine needs from a backend: run a step over the KV cache it owns and sample each row's
// next token where the logits are (launched, then collected, so the engine can build the next step
// while the device runs this one), and swap in new weights of the same shapes. Runners are created
// in one place (create_runner) from typed options; they read the checkpoint once and size their own
// KV cache. The CPU runner wraps the reference model and the CPU sampler.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/runner_options.h"
#include "io/binding.h"
#include "io/model_config.h"
#include "models/batch.h"
#include "sampling/params.h"
#include "sampling/sampler.h"

namespace nibble::engine {

// One row of a step that draws a token (batch.logits_rows[i] for rows[i]), or, with score_token set,
// a prompt position that draws nothing: its output is score_token's raw logprob and the top
// params->logprobs tokens (prompt logprobs; the context is then unused).
struct SampleRow {
  const sampling::SamplingParams* params = nullptr;
  sampling::SequenceContext context;  // prompt, output so far, tokens masked now (min_tokens)
  sampling::DrawKey key;              // the sequence's seed and the position being drawn
  int32_t score_token = -1;
  // Structured output: the row draws only tokens its mask allows, the mask given by supply_masks.
  bool constrained = false;
};

// Prompt positions a step may score (prompt logprobs) beside its sampled rows: the runners size
// their logits for max_num_seqs + this many rows, and the scheduler keeps each step within it.
inline constexpr int64_t MAX_SCORE_ROWS = 256;

struct StepOutput {
  std::vector<sampling::SampledToken> tokens;  // one per SampleRow of the step
  // On the GPU: the step's own device time, and how long the device sat idle between the end of
  // the step launched before it and its start (waiting for the host to queue it); -1 where not
  // measured (the CPU; the idle time of a first step).
  double device_seconds = -1.0, device_idle_seconds = -1.0;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const io::ModelConfig& config() const = 0;
  virtual int64_t n_kv_blocks() const = 0;
  virtual int64_t block_size() const = 0;
  // "cpu" or "cuda:0 (NVIDIA H200)": for start-up lines and /server_info.
  virtual std::string describe() const = 0;
  // Starts a step: runs the batch and draws one token per row (+ logprobs when a row's params
  // ask). On the GPU it only queues the work, so the engine can build the next step meanwhile: a
  // step may be launched while the one before it is still uncollected (never two), and its token
  // ids and its rows' token lists may then hold models::pending_token(j), the token that uncollected
  // step draws for its row j.
  virtual Status launch(const models::Batch& batch, std::span<const SampleRow> rows) = 0;
  // Structured output: the masks of the last launched step's constrained rows, in row order,
  // grammar::mask_words(vocab_size) words each. They may depend on the tokens of the step launched
  // before it, so they come after the launch (once that step is collected) and before this step is
  // collected; its constrained rows draw nothing until then (the GPU waits on the device).
  virtual Status supply_masks(std::span<const uint32_t> words) = 0;
  // Waits for the oldest uncollected step and returns what it drew, row by row.
  virtual Status collect(StepOutput& out) = 0;
  // launch, then collect (nothing else in flight; no constrained rows).
  Status step(const models::Batch& batch, std::span<const SampleRow> rows, std::vector<sampling::SampledToken>& out);
  // Runs the batch and returns the logits of batch.logits_rows, [rows, vocab] fp32 (tests,
  // --dump-logits).
  virtual Status forward_logits(const models::Batch& batch, std::vector<float>& logits) = 0;
  // Loads the checkpoint at `path`; it must have the same architecture and tensor shapes, else an
  // error and the current weights stay. The KV cache is kept (the engine decides whether to flush).
  virtual Status replace_weights(const std::string& path) = 0;
  // Called on the thread that will drive the runner (the engine's) before its first step: the CUDA
  // runner makes its GPU that thread's current device.
  virtual void bind_thread() {}
  // Whether the first step of a shape loads code (CUDA loads a kernel's module at its first launch):
  // the server then runs Engine::warm_up before it serves.
  virtual bool loads_kernels_lazily() const { return false; }
};

// NIBBLE_DIAG_FAIL_ENGINE="i:n": a runner whose launches fail from its n-th on, for engine i of a
// data-parallel group (tests of a replica failing); `runner` itself for any other engine.
std::unique_ptr<ModelRunner> inject_engine_failure(std::unique_ptr<ModelRunner> runner, int engine_index);

// The one place runners are made: the backend from options.backend (auto: CUDA when this build
// has it and a GPU is visible, else the CPU), the checkpoint read once, the KV cache sized.
Result<std::unique_ptr<ModelRunner>> create_runner(const std::string& path, const RunnerOptions& options);
// Node options.node_rank > 0 of a group over hosts: loads this node's ranks, joins node 0 and runs its
// operations until node 0 stops (ok) or one fails here.
Status follow_node(const std::string& path, const RunnerOptions& options);

// Whether this build has the CUDA runner and a GPU is visible (what Backend::AUTO picks).
bool cuda_available();

// The checkpoint at `path` when it has `current`'s architecture, dimensions and per-module formats
// (what replace_weights needs of a new checkpoint), else the error naming the difference.
Result<std::shared_ptr<const io::LoadedCheckpoint>> load_same_layout(const io::BoundCheckpoint& current,
                                                                     const std::string& path);

}  // namespace nibble::engine
