// Benchmark summary. Formats follow vllm/benchmarks/serve.py: "{:<40} {:<10}" rows, 50-wide
// section rules, P<p> rows for each --metric-percentiles entry.
#include "tools/bench/serve_metrics.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>

namespace nibble::tools {
namespace {

double mean(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double stddev(const std::vector<double>& v) {  // population (numpy's default ddof = 0)
  if (v.empty()) return 0.0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

std::string p_word(double p) {
  char buf[32];
  if (p == std::floor(p))
    std::snprintf(buf, sizeof buf, "%d", static_cast<int>(p));
  else
    std::snprintf(buf, sizeof buf, "%g", p);
  return buf;
}

std::string row(const std::string& label, const std::string& value) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-40s %-10s\n", label.c_str(), value.c_str());
  return buf;
}
std::string fixed2(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}
std::string rule(const std::string& title, char c) {
  const size_t n = 50, pad = n > title.size() ? n - title.size() : 0;
  return std::string(pad / 2, c) + title + std::string(pad - pad / 2, c) + "\n";  // Python's ^ centering
}

}  // namespace

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank)), hi = static_cast<size_t>(std::ceil(rank));
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

BenchSummary summarize(const std::vector<RequestOutcome>& outcomes, double duration, const BenchSettings& s) {
  int64_t completed = 0, failed = 0, total_input = 0, total_output = 0;
  std::vector<double> ttfts, tpots, itls, e2els;
  // FastDeploy's calculate_metrics (benchmark_serving.py): s_ttft = arrival_time[1] (index 0 is a
  // chat stream's role chunk), s_itl = the gaps of arrival_time[1:] but the last, s_e2el =
  // arrival_time[-1], s_decode = (output tokens - 1) / (arrival_time[-1] - arrival_time[1]) tok/s
  // (with more than two chunks); input_len the client's prompt length, s_input_len the server's.
  std::vector<double> s_ttfts, s_itls, s_e2els, s_decodes, in_lens, s_in_lens, out_lens;
  nlohmann::ordered_json input_lens = nlohmann::json::array(), output_lens = nlohmann::json::array(),
                         ttft_list = nlohmann::json::array(), itl_list = nlohmann::json::array(),
                         texts = nlohmann::json::array(), errors = nlohmann::json::array();
  std::map<int64_t, int64_t> tokens_per_second;
  std::vector<std::pair<double, int>> edges;  // for the peak number of requests in flight
  for (const RequestOutcome& o : outcomes) {
    input_lens.push_back(o.prompt_len);
    output_lens.push_back(o.success ? o.output_tokens : 0);
    ttft_list.push_back(o.success ? o.ttft : 0.0);
    itl_list.push_back(o.success ? o.itl : std::vector<double>{});
    texts.push_back(o.generated_text);
    errors.push_back(o.error);
    edges.emplace_back(o.start_offset, 1);
    edges.emplace_back(o.start_offset + o.latency, -1);
    if (!o.success) {
      ++failed;
      continue;
    }
    ++completed;
    total_input += o.prompt_len;
    total_output += o.output_tokens;
    ttfts.push_back(o.ttft);
    e2els.push_back(o.latency);
    if (o.output_tokens > 1) tpots.push_back((o.latency - o.ttft) / static_cast<double>(o.output_tokens - 1));
    itls.insert(itls.end(), o.itl.begin(), o.itl.end());
    const std::vector<double>& a = o.arrival_time;
    if (a.size() >= 2) {
      s_ttfts.push_back(a[1]);
      s_e2els.push_back(a.back());
      for (size_t j = 1; j + 2 < a.size(); ++j) s_itls.push_back(a[j + 1] - a[j]);
      if (a.size() > 2 && a.back() > a[1])
        s_decodes.push_back(static_cast<double>(o.output_tokens - 1) / (a.back() - a[1]));
    }
    in_lens.push_back(static_cast<double>(o.prompt_len));
    s_in_lens.push_back(static_cast<double>(o.server_prompt_tokens));
    out_lens.push_back(static_cast<double>(o.output_tokens));
    double t = o.start_offset + o.ttft;
    ++tokens_per_second[static_cast<int64_t>(t)];
    for (double gap : o.itl) ++tokens_per_second[static_cast<int64_t>(t += gap)];
  }
  std::sort(edges.begin(), edges.end());
  int in_flight = 0, peak_in_flight = 0;
  for (const auto& [t, d] : edges) peak_in_flight = std::max(peak_in_flight, in_flight += d);
  int64_t peak_tokens = 0;
  for (const auto& [second, n] : tokens_per_second) peak_tokens = std::max(peak_tokens, n);

  const double d = duration > 0 ? duration : 1e-9;
  BenchSummary out;
  nlohmann::ordered_json& r = out.result;
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y%m%d-%H%M%S", std::localtime(&now));
  r["date"] = date;
  r["backend"] = s.backend;
  r["model_id"] = s.model;
  r["tokenizer_id"] = s.tokenizer;
  r["num_prompts"] = s.num_prompts;
  r["request_rate"] =
      std::isinf(s.request_rate) ? nlohmann::ordered_json("inf") : nlohmann::ordered_json(s.request_rate);
  r["burstiness"] = s.burstiness;
  r["max_concurrency"] =
      s.max_concurrency > 0 ? nlohmann::ordered_json(s.max_concurrency) : nlohmann::ordered_json(nullptr);
  r["duration"] = duration;
  r["completed"] = completed;
  r["failed"] = failed;
  r["total_input_tokens"] = total_input;
  r["total_output_tokens"] = total_output;
  r["request_throughput"] = completed / d;
  r["output_throughput"] = total_output / d;
  r["total_token_throughput"] = (total_input + total_output) / d;
  r["max_output_tokens_per_s"] = static_cast<double>(peak_tokens);
  r["max_concurrent_requests"] = peak_in_flight;
  r["input_lens"] = input_lens;
  r["output_lens"] = output_lens;
  r["ttfts"] = ttft_list;
  r["itls"] = itl_list;
  r["generated_texts"] = texts;
  r["errors"] = errors;

  std::string& p = out.printed;
  p += rule(" Serving Benchmark Result ", '=');
  p += row("Successful requests:", std::to_string(completed));
  p += row("Failed requests:", std::to_string(failed));
  if (s.max_concurrency > 0) p += row("Maximum request concurrency:", std::to_string(s.max_concurrency));
  p += row("Request rate configured (RPS):", std::isinf(s.request_rate) ? "inf" : fixed2(s.request_rate));
  p += row("Benchmark duration (s):", fixed2(duration));
  p += row("Total input tokens:", std::to_string(total_input));
  p += row("Total generated tokens:", std::to_string(total_output));
  p += row("Request throughput (req/s):", fixed2(completed / d));
  p += row("Output token throughput (tok/s):", fixed2(total_output / d));
  p += row("Peak output token throughput (tok/s):", fixed2(static_cast<double>(peak_tokens)));
  p += row("Peak concurrent requests:", fixed2(peak_in_flight));
  p += row("Total Token throughput (tok/s):", fixed2((total_input + total_output) / d));
  struct Metric {
    const char* key;
    const char* title;
    const char* short_name;
    const std::vector<double>* values;
    bool time;  // seconds, reported in ms with an _ms suffix; else a count or rate as it is
  };
  // vLLM's four always go into the JSON; FastDeploy's only when asked for, as its script does.
  const Metric metrics[] = {{"s_decode", "Decode Speed (tok/s)", "Decode", &s_decodes, false},
                            {"ttft", "Time to First Token", "TTFT", &ttfts, true},
                            {"s_ttft", "Infer Time to First Token", "S_TTFT", &s_ttfts, true},
                            {"tpot", "Time per Output Token (excl. 1st token)", "TPOT", &tpots, true},
                            {"itl", "Inter-token Latency", "ITL", &itls, true},
                            {"s_itl", "Infer Inter-token Latency", "S_ITL", &s_itls, true},
                            {"e2el", "End-to-end Latency", "E2EL", &e2els, true},
                            {"s_e2el", "Infer End-to-end Latency", "S_E2EL", &s_e2els, true},
                            {"input_len", "Input Length", "Input Length", &in_lens, false},
                            {"s_input_len", "Infer Input Length", "Input Length", &s_in_lens, false},
                            {"output_len", "Output Length", "Output Length", &out_lens, false}};
  for (const Metric& m : metrics) {
    std::vector<double> v;
    for (double x : *m.values) v.push_back(m.time ? x * 1000.0 : x);
    const std::string key = m.key, suffix = m.time ? "_ms" : "";
    const bool asked =
        std::find(s.percentile_metrics.begin(), s.percentile_metrics.end(), key) != s.percentile_metrics.end();
    const bool vllm = key == "ttft" || key == "tpot" || key == "itl" || key == "e2el";
    if (!asked && !vllm) continue;
    r["mean_" + key + suffix] = mean(v);
    r["median_" + key + suffix] = percentile(v, 50);
    r["std_" + key + suffix] = stddev(v);
    for (double q : s.metric_percentiles) r["p" + p_word(q) + "_" + key + suffix] = percentile(v, q);
    if (!asked) continue;
    const std::string unit = m.time ? " (ms):" : ":";
    p += rule(m.title, '-');
    p += row(std::string("Mean ") + m.short_name + unit, fixed2(mean(v)));
    p += row(std::string("Median ") + m.short_name + unit, fixed2(percentile(v, 50)));
    for (double q : s.metric_percentiles)
      p += row("P" + p_word(q) + " " + m.short_name + unit, fixed2(percentile(v, q)));
  }
  p += std::string(50, '=') + "\n";
  return out;
}

}  // namespace nibble::tools
