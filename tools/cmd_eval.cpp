// `nibble eval gsm8k` (SGLang's few-shot GSM8K accuracy against any OpenAI-compatible server) and
// `nibble eval make-gsm8k-like` (synthetic problems in GSM8K's JSONL format).
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tools/bench/gsm8k.h"
#include "tools/command.h"

namespace nibble::tools {

CommandRunner register_eval(CLI::App& root) {
  auto* eval = root.add_subcommand("eval", "Accuracy evaluations (gsm8k) and their data (make-gsm8k-like)");
  eval->require_subcommand(1);
  auto* gsm8k = eval->add_subcommand("gsm8k", "Few-shot GSM8K accuracy, as SGLang's bench_sglang.py measures it");
  auto o = std::make_shared<Gsm8kOptions>();
  gsm8k->add_option("--data", o->data, "GSM8K JSONL (question, answer)")->required();
  gsm8k->add_option("--num-shots", o->num_shots, "Few-shot examples")->capture_default_str();
  gsm8k->add_option("--num-questions", o->num_questions, "Questions to ask")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  gsm8k->add_option("--parallel", o->parallel, "Requests in flight")->check(CLI::PositiveNumber)->capture_default_str();
  gsm8k->add_option("--max-tokens", o->max_tokens, "Tokens per answer")->capture_default_str();
  gsm8k->add_option(
      "--predictions", o->predictions,
      "Also write each question's label, prediction and generated text to this JSONL file (paired comparisons)");
  gsm8k->add_option("--base-url", o->base_url, "Server URL, http://host:port (else --host/--port)");
  gsm8k->add_option("--host", o->host, "Server host")->capture_default_str();
  gsm8k->add_option("--port", o->port, "Server port")->capture_default_str();
  gsm8k->add_option("--model", o->model, "Model name (default: the server's first model)");

  auto* make = eval->add_subcommand("make-gsm8k-like", "Write synthetic grade-school word problems in GSM8K's format");
  auto out = std::make_shared<std::string>();
  auto n = std::make_shared<int64_t>(200);
  auto seed = std::make_shared<uint64_t>(0);
  make->add_option("--out", *out, "Output JSONL")->required();
  make->add_option("--n", *n, "Problems")->check(CLI::PositiveNumber)->capture_default_str();
  make->add_option("--seed", *seed, "Seed (same seed, same file)")->capture_default_str();

  return [gsm8k, make, o, out, n, seed]() -> int {
    if (gsm8k->parsed()) return run_gsm8k_eval(*o);
    if (!make->parsed()) return 2;
    std::ofstream file(*out);
    for (const Gsm8kItem& item : make_gsm8k_like(*n, *seed))
      file << nlohmann::ordered_json({{"question", item.question}, {"answer", item.answer}}).dump() << "\n";
    if (!file) {
      std::fprintf(stderr, "nibble eval make-gsm8k-like: cannot write %s\n", out->c_str());
      return 1;
    }
    std::printf("wrote %lld problems to %s\n", static_cast<long long>(*n), out->c_str());
    return 0;
  };
}

}  // namespace nibble::tools
