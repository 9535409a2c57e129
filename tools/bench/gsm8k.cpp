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
                  preds[i] = gsm8k_answer_value(j["choices"][0].value("text", ""));
                  if (j.contains("usage")) output_tokens += j["usage"].value("completion_tokens", 0);
                } else {
                  ++failed;
                  if (first_error.empty())
                    first_error = r.error.empty() ? "HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 300) : r.error;
                }
                launch();
              });
  };
  const auto start = SteadyClock::now();
  for (int64_t k = 0; k < std::max<int64_t>(1, o.parallel); ++k) launch();
  io.run();
  const double latency = std::chrono::duration<double>(SteadyClock::now() - start).count();
  int64_t correct = 0, invalid = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!preds[i]) ++invalid;
    else if (preds[i] == labels[i]) ++correct;
  }
  if (failed) std::fprintf(stderr, "%lld requests failed (counted invalid); first: %s\n",
                           static_cast<long long>(failed), first_error.c_str());
  std::printf("Accuracy: %.3f\n", static_cast<double>(correct) / static_cast<double>(n));
  std::printf("Invalid: %.3f\n", static_cast<double>(invalid) / static_cast<double>(n));
  std::printf("Latency: %.3f s\n", latency);
  std::printf("Output throughput: %.3f token/s\n", static_cast<double>(output_tokens) / latency);
  return 0;
}

std::vector<Gsm8kItem> make_gsm8k_like(int64_t n, uint64_t seed) {
  static const char* NAMES[] = {"Natalia", "James", "Aisha", "Mateo", "Priya", "Liam", "Sofia", "Kenji", "Amara", "Noah"};
  static const bool SHE[] = {true, false, true, false, true, false, true, false, true, false};
  static const char* ITEMS[] = {"apples", "marbles", "stickers", "pencils", "cookies", "books", "shells", "cards"};
  std::mt19937_64 rng(seed);
  auto pick = [&rng](int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1)); };
  std::vector<Gsm8kItem> out;
  for (int64_t k = 0; k < n; ++k) {
    const int who = static_cast<int>(rng() % 10);
    const std::string name = NAMES[who], item = ITEMS[rng() % 8], he = SHE[who] ? "she" : "he",
                      He = SHE[who] ? "She" : "He", friend_name = NAMES[(who + 1 + rng() % 9) % 10];
    auto s = [](int64_t v) { return std::to_string(v); };
    Gsm8kItem g;
    switch (rng() % 6) {
      case 0: {
        const int64_t a = pick(5, 90), b = pick(2, 60), c = pick(1, a + b), t = a + b, r = t - c;
        g.question = name + " had " + s(a) + " " + item + ". " + He + " bought " + s(b) + " more, then gave " + s(c) +
                     " to " + friend_name + ". How many " + item + " does " + name + " have now?";
        g.answer = "After buying more, " + name + " had " + s(a) + " + " + s(b) + " = <<" + s(a) + "+" + s(b) + "=" + s(t) +
                   ">>" + s(t) + " " + item + ".\nAfter giving some away, " + he + " has " + s(t) + " - " + s(c) + " = <<" +
                   s(t) + "-" + s(c) + "=" + s(r) + ">>" + s(r) + " " + item + ".\n#### " + s(r);
        break;
      }
      case 1: {
        const int64_t a = pick(3, 24), b = pick(2, 15), t = a * b;
        g.question = "A box holds " + s(a) + " " + item + ". " + name + " fills " + s(b) + " boxes. How many " + item +
                     " are in the boxes altogether?";
        g.answer = "The boxes hold " + s(a) + " * " + s(b) + " = <<" + s(a) + "*" + s(b) + "=" + s(t) + ">>" + s(t) + " " +
                   item + ".\n#### " + s(t);
        break;
      }
      case 2: {
        const int64_t a = pick(8, 30), b = pick(2, 9), c = pick(2, 6), d = a * b, t = d * c;
        g.question = name + " earns $" + s(a) + " an hour and works " + s(b) + " hours a day. How much does " + he +
                     " earn in " + s(c) + " days?";
        g.answer = "In a day " + he + " earns " + s(a) + " * " + s(b) + " = $<<" + s(a) + "*" + s(b) + "=" + s(d) + ">>" +
                   s(d) + ".\nIn " + s(c) + " days " + he + " earns " + s(d) + " * " + s(c) + " = $<<" + s(d) + "*" + s(c) +
                   "=" + s(t) + ">>" + s(t) + ".\n#### " + s(t);
        break;
      }
      case 3: {
        const int64_t b = pick(2, 9), each = pick(2, 20), a = b * each;
        g.question = name + " has " + s(a) + " " + item + " and shares them equally among " + s(b) +
                     " friends. How many " + item + " does each friend get?";
        g.answer = "Each friend gets " + s(a) + " / " + s(b) + " = <<" + s(a) + "/" + s(b) + "=" + s(each) + ">>" +
                   s(each) + " " + item + ".\n#### " + s(each);
        break;
      }
      case 4: {
        const int64_t a = pick(5, 60), b = 2 * a, t = a + b;
        g.question = name + " read " + s(a) + " pages on Monday and twice as many on Tuesday. How many pages did " + he +
                     " read in the two days?";
        g.answer = "On Tuesday " + he + " read " + s(a) + " * 2 = <<" + s(a) + "*2=" + s(b) + ">>" + s(b) +
                   " pages.\nIn total " + he + " read " + s(a) + " + " + s(b) + " = <<" + s(a) + "+" + s(b) + "=" + s(t) +
                   ">>" + s(t) + " pages.\n#### " + s(t);
        break;
      }
      default: {
        const int64_t a = pick(2, 12), b = pick(1, 8), cost = a * b, bill = (cost / 20 + 1) * 20, change = bill - cost;
        g.question = "A shop sells " + item + " for $" + s(a) + " each. " + name + " buys " + s(b) + " and pays with $" +
                     s(bill) + ". How much change does " + he + " get?";
        g.answer = "The " + item + " cost " + s(a) + " * " + s(b) + " = $<<" + s(a) + "*" + s(b) + "=" + s(cost) + ">>" +
                   s(cost) + ".\nThe change is " + s(bill) + " - " + s(cost) + " = $<<" + s(bill) + "-" + s(cost) + "=" +
                   s(change) + ">>" + s(change) + ".\n#### " + s(change);
        break;
      }
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace nibble::tools
