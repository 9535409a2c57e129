// Datasets. A random prompt is drawn as token ids, decoded, and re-encoded until the text encodes
// to exactly the wanted length (a few rounds at most), so the server sees the length asked for.
#include "tools/bench/datasets.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

namespace nibble::tools {
namespace {

using json = nlohmann::json;

std::vector<int32_t> ordinary_ids(const text::Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < static_cast<int32_t>(tokenizer.vocab_size()); ++id)
    if (!tokenizer.is_special(id) && !tokenizer.id_to_token(id).empty()) ids.push_back(id);
  return ids;
}

// Text that encodes to exactly `length` tokens, starting from the ids given.
std::string exact_text(const text::Tokenizer& tokenizer, std::vector<int32_t> ids, int64_t length,
                       const std::vector<int32_t>& pool, std::mt19937_64& rng, int64_t& actual) {
  std::string text;
  for (int round = 0; round < 20; ++round) {
    text = tokenizer.decode(ids);
    std::vector<int32_t> again = tokenizer.encode(text, true, false);
    actual = static_cast<int64_t>(again.size());
    if (actual == length) return text;
    if (actual > length) again.resize(length);
    while (static_cast<int64_t>(again.size()) < length) again.push_back(pool[rng() % pool.size()]);
    ids = std::move(again);
  }
  return text;  // did not settle: `actual` says what it is
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream file(path);
  if (!file) return Status::error(path + ": cannot read");
  std::stringstream s;
  s << file.rdbuf();
  return s.str();
}

}  // namespace

Result<std::vector<BenchPrompt>> random_dataset(const text::Tokenizer& tokenizer, const RandomDatasetOptions& o) {
  if (o.input_len < 1 || o.output_len < 1)
    return Status::error("--random-input-len and --random-output-len must be >= 1");
  if (o.range_ratio < 0 || o.range_ratio >= 1) return Status::error("--random-range-ratio must be in [0, 1)");
  const std::vector<int32_t> pool = ordinary_ids(tokenizer);
  if (pool.empty()) return Status::error("the tokenizer has no ordinary tokens");
  std::mt19937_64 rng(o.seed);
  auto uniform_len = [&](int64_t len) {
    const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(len * (1 - o.range_ratio))));
    const int64_t hi = std::max<int64_t>(lo, static_cast<int64_t>(std::ceil(len * (1 + o.range_ratio))));
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  std::vector<int32_t> prefix;
  for (int64_t i = 0; i < o.prefix_len; ++i) prefix.push_back(pool[rng() % pool.size()]);
  std::vector<BenchPrompt> out;
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    const int64_t input = uniform_len(o.input_len);
    std::vector<int32_t> ids = prefix;
    for (int64_t t = 0; t < input; ++t) ids.push_back(pool[rng() % pool.size()]);
    BenchPrompt p;
    p.text = exact_text(tokenizer, ids, o.prefix_len + input, pool, rng, p.prompt_len);
    p.output_len = uniform_len(o.output_len);
    out.push_back(std::move(p));
  }
  return out;
}

Result<std::vector<BenchPrompt>> sharegpt_dataset(const std::string& path, const text::Tokenizer& tokenizer,
                                                  int64_t num_prompts, int64_t output_len, uint64_t seed) {
  auto text = read_file(path);
  if (!text) return text.status();
  const json data = json::parse(*text, nullptr, false);
  if (data.is_discarded() || !data.is_array()) return Status::error(path + ": not a ShareGPT JSON list");
  std::vector<BenchPrompt> all;
  for (const json& item : data) {
    if (!item.is_object() || !item.contains("conversations") || !item["conversations"].is_array()) continue;
    const json& turns = item["conversations"];
    if (turns.size() < 2 || !turns[0].is_object() || !turns[1].is_object()) continue;
    const json prompt = turns[0].value("value", json()), reply = turns[1].value("value", json());
    if (!prompt.is_string() || !reply.is_string()) continue;
    BenchPrompt p;
    p.text = prompt.get<std::string>();
    p.prompt_len = static_cast<int64_t>(tokenizer.encode(p.text, true, false).size());
    const int64_t reply_len = static_cast<int64_t>(tokenizer.encode(reply.get<std::string>(), true, false).size());
    p.output_len = output_len > 0 ? output_len : reply_len;
    // vLLM's filter (benchmarks/datasets.py is_valid_sequence).
    if (p.prompt_len < 4 || (output_len <= 0 && reply_len < 4) || p.prompt_len > 1024 ||
        p.prompt_len + p.output_len > 2048)
      continue;
    all.push_back(std::move(p));
  }
  std::shuffle(all.begin(), all.end(), std::mt19937_64(seed));
  if (static_cast<int64_t>(all.size()) < num_prompts)
    return Status::error(path + ": only " + std::to_string(all.size()) + " usable conversations, " +
                         std::to_string(num_prompts) + " asked for");
  all.resize(num_prompts);
  return all;
}

Result<std::vector<BenchPrompt>> jsonl_dataset(const std::string& path, const text::Tokenizer* tokenizer,
                                               int64_t num_prompts, int64_t output_len) {
  std::ifstream file(path);
  if (!file) return Status::error(path + ": cannot read");
  std::vector<BenchPrompt> out;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(file, line) && static_cast<int64_t>(out.size()) < num_prompts) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
      return Status::error(path + ":" + std::to_string(line_no) + ": expected {\"prompt\": \"...\"}");
    BenchPrompt p;
    p.text = j["prompt"].get<std::string>();
    p.prompt_len = tokenizer ? static_cast<int64_t>(tokenizer->encode(p.text, true, false).size()) : 0;
    p.output_len =
        j.contains("output_len") && j["output_len"].is_number_integer() ? j["output_len"].get<int64_t>() : output_len;
    out.push_back(std::move(p));
  }
  if (static_cast<int64_t>(out.size()) < num_prompts)
    return Status::error(path + ": " + std::to_string(out.size()) + " prompts, " + std::to_string(num_prompts) +
                         " asked for");
  return out;
}

}  // namespace nibble::tools
