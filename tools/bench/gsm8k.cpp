// GSM8K eval and generator. Requests: /v1/completions, temperature 0, max_tokens 512, stop
// ["Question", "Assistant:", "<|separator|>"] as bench_sglang.py sends them; questions are
// lines[0..num_questions) and the few-shot examples lines[0..num_shots), as there.
#include "tools/bench/gsm8k.h"

#include <boost/asio/io_context.hpp>
#include <cstdio>
#include <deque>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "tools/bench/http_client.h"

namespace nibble::tools {
namespace {

using json = nlohmann::json;

}  // namespace

Result<std::vector<Gsm8kItem>> read_gsm8k(const std::string& path) {
  std::ifstream file(path);
  if (!file) return Status::error(path + ": cannot read");
  std::vector<Gsm8kItem> out;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(file, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("question") || !j["question"].is_string() ||
        !j.contains("answer") || !j["answer"].is_string())
      return Status::error(path + ":" + std::to_string(line_no) + ": expected {\"question\": ..., \"answer\": ...}");
    out.push_back({j["question"].get<std::string>(), j["answer"].get<std::string>()});
  }
  return out;
}

std::string gsm8k_example(const Gsm8kItem& item, bool include_answer) {
  std::string s = "Question: " + item.question + "\nAnswer:";
  if (include_answer) s += " " + item.answer;
  return s;
}

std::string gsm8k_few_shot(const std::vector<Gsm8kItem>& items, int64_t num_shots) {
  std::string s;
  for (int64_t i = 0; i < num_shots && i < static_cast<int64_t>(items.size()); ++i)
    s += gsm8k_example(items[i], true) + "\n\n";
  return s;
}

std::optional<int64_t> gsm8k_answer_value(const std::string& text) {
  std::string last, current;
  for (char c : text) {
    if (c == ',') continue;
    if (c >= '0' && c <= '9') {
      current += c;
    } else if (!current.empty()) {
      last = current;
      current.clear();
    }
  }
  if (!current.empty()) last = current;
  if (last.empty() || (last.size() > 1 && last[0] == '0') || last.size() > 18) return std::nullopt;
  return std::stoll(last);
}

int run_gsm8k_eval(const Gsm8kOptions& o) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "nibble eval gsm8k: %s\n", m.c_str());
    return 1;
  };
  auto items = read_gsm8k(o.data);
  if (!items) return fail(items.status().message());
  if (items->empty()) return fail(o.data + ": no questions");
  Result<Endpoint> endpoint = resolve_endpoint(o.base_url, o.host, o.port);
  if (!endpoint) return fail(endpoint.status().message());
  std::string model = o.model;
  if (model.empty()) {
    auto served = first_served_model(*endpoint);
    if (!served) return fail(served.status().message());
    model = *served;
  }
  const std::string few_shot = gsm8k_few_shot(*items, o.num_shots);
  const size_t n = std::min<size_t>(items->size(), static_cast<size_t>(o.num_questions));
  std::vector<std::optional<int64_t>> preds(n), labels(n);
  std::vector<std::string> texts(n);
  int64_t output_tokens = 0, failed = 0;
  std::string first_error;
  boost::asio::io_context io;
  size_t next = 0;
  std::function<void()> launch = [&] {
    if (next >= n) return;
    const size_t i = next++;
    labels[i] = gsm8k_answer_value((*items)[i].answer);
    json body = {{"model", model},
                 {"prompt", few_shot + gsm8k_example((*items)[i], false)},
                 {"max_tokens", o.max_tokens},
                 {"temperature", 0},
                 {"stop", {"Question", "Assistant:", "<|separator|>"}}};
    http_post(io, *endpoint, "/v1/completions", body.dump(-1, ' ', false, json::error_handler_t::replace),
              [&, i](HttpResult&& r) {
                const json j = json::parse(r.body, nullptr, false);
                if (r.status == 200 && !j.is_discarded() && j.contains("choices") && !j["choices"].empty()) {
                  texts[i] = j["choices"][0].value("text", "");
                  preds[i] = gsm8k_answer_value(texts[i]);
                  if (j.contains("usage")) output_tokens += j["usage"].value("completion_tokens", 0);
                } else {
                  ++failed;
                  if (first_error.empty())
                    first_error =
                        r.error.empty() ? "HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 300) : r.error;
                }
                launch();
              });
  };
  const auto start = SteadyClock::now();
  for (int64_t k = 0; k < std::max<int64_t>(1, o.parallel); ++k) launch();
  io.run();
  const double latency = std::chrono::duration<double>(SteadyClock::now() - start).count();
  int64_t correct = 0, invalid = 0;
  std::vector<bool> right(n);
  for (size_t i = 0; i < n; ++i) {
    right[i] = preds[i].has_value() && preds[i] == labels[i];
    invalid += !preds[i];
    correct += right[i];
  }
  if (!o.predictions.empty()) {
    std::ofstream out(o.predictions);
    for (size_t i = 0; i < n; ++i) {
      const json line = {{"index", i},
                         {"label", labels[i] ? json(*labels[i]) : json(nullptr)},
                         {"prediction", preds[i] ? json(*preds[i]) : json(nullptr)},
                         {"correct", bool(right[i])},
                         {"text", texts[i]}};
      out << line.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    }
    if (!out) return fail(o.predictions + ": cannot write");
  }
  if (failed)
    std::fprintf(stderr, "%lld requests failed (counted invalid); first: %s\n", static_cast<long long>(failed),
                 first_error.c_str());
  std::printf("Accuracy: %.3f\n", static_cast<double>(correct) / static_cast<double>(n));
  std::printf("Invalid: %.3f\n", static_cast<double>(invalid) / static_cast<double>(n));
  std::printf("Latency: %.3f s\n", latency);
  std::printf("Output throughput: %.3f token/s\n", static_cast<double>(output_tokens) / latency);
  return 0;
}

}  // namespace nibble::tools
