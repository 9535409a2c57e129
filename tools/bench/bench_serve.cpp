// The benchmark driver: one io_context thread sends every request at its arrival time (or when a
// concurrency slot frees up) and times each server-sent event as it arrives.
#include "tools/bench/bench_serve.h"

#include <boost/asio/steady_timer.hpp>
#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "tools/bench/http_client.h"
#include "tools/bench/serve_metrics.h"
#include "tools/progress.h"

namespace nibble::tools {
namespace {

using json = nlohmann::json;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// The constraint of --structured: (kind, text) — the schema, the regex, or the choices as a JSON list.
struct Structured {
  std::string kind = "none", text;
};

Result<Structured> load_structured(const BenchServeOptions& o) {
  Structured s{o.structured, ""};
  if (s.kind == "none") return s;
  if (!o.structured_file.empty()) {
    std::ifstream in(o.structured_file);
    if (!in) return Status::error("--structured-file: cannot read " + o.structured_file);
    s.text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } else if (s.kind == "json-schema") {
    // Records of a string, a bounded integer and an enum, at least 64 of them (over 500 tokens): every
    // output runs to its length, as an unconstrained --ignore-eos one does, so tok/s compare.
    s.text = R"({"type":"object","properties":{"records":{"type":"array","minItems":64,"items":{"type":"object",)"
             R"("properties":{"title":{"type":"string","maxLength":24},"score":{"type":"integer","minimum":0,)"
             R"("maximum":100},"kind":{"enum":["book","film","song"]}},"required":["title","score","kind"],)"
             R"("additionalProperties":false}}},"required":["records"],"additionalProperties":false})";
  } else if (s.kind == "regex") {
    s.text = "[A-Za-z ,.]+";
  } else {
    s.text = R"(["yes", "no", "maybe"])";
  }
  if (s.kind == "json-schema" || s.kind == "choice") {
    const json parsed = json::parse(s.text, nullptr, false);
    if (parsed.is_discarded() || (s.kind == "choice" && !parsed.is_array()))
      return Status::error("--structured-file: not " + std::string(s.kind == "choice" ? "a JSON list" : "JSON"));
  }
  return s;
}

// Adds the constraint to a request body: vLLM's structured_outputs (OpenAI routes), SGLang's
// sampling params (/generate; a choice as a regex of the escaped alternatives).
void add_structured(const Structured& s, const std::string& backend, json& body) {
  if (s.kind == "none") return;
  if (backend != "nibble") {
    json& so = body["structured_outputs"];
    if (s.kind == "json-schema") so["json"] = json::parse(s.text);
    if (s.kind == "regex") so["regex"] = s.text;
    if (s.kind == "choice") so["choice"] = json::parse(s.text);
    return;
  }
  json& sp = body["sampling_params"];
  if (s.kind == "json-schema") sp["json_schema"] = s.text;
  if (s.kind == "regex") sp["regex"] = s.text;
  if (s.kind == "choice") {
    std::string alternatives;
    for (const json& c : json::parse(s.text)) {
      if (!alternatives.empty()) alternatives += "|";
      for (char ch : c.get<std::string>()) {
        if (std::strchr("\\^$.|?*+()[]{}", ch)) alternatives += '\\';
        alternatives += ch;
      }
    }
    sp["regex"] = "(" + alternatives + ")";
  }
}

std::string request_body(const BenchServeOptions& o, const std::string& model, const BenchPrompt& p,
                         const Structured& structured) {
  json body;
  if (o.backend == "nibble") {
    body = {{"text", p.text},
            {"sampling_params", {{"max_new_tokens", p.output_len}, {"temperature", o.temperature}}},
            {"stream", true}};
    if (o.ignore_eos) body["sampling_params"]["ignore_eos"] = true;
  } else {
    body = {{"model", model},
            {"temperature", o.temperature},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}}};
    if (o.backend == "openai-chat") {
      body["messages"] = json::array({{{"role", "user"}, {"content", p.text}}});
      body["max_completion_tokens"] = p.output_len;
    } else {
      body["prompt"] = p.text;
      body["max_tokens"] = p.output_len;
    }
    if (o.ignore_eos) body["ignore_eos"] = true;
  }
  add_structured(structured, o.backend, body);
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Reads the events of one response; TTFT is timed to the first event that carries a token.
RequestOutcome parse_response(const BenchServeOptions& o, const HttpResult& r, const BenchPrompt& p,
                              const text::Tokenizer* tokenizer) {
  RequestOutcome out;
  out.prompt_len = p.prompt_len;
  out.latency = std::chrono::duration<double>(r.finished - r.started).count();
  if (!r.error.empty()) {
    out.error = r.error;
    return out;
  }
  if (r.status != 200) {
    out.error = "HTTP " + std::to_string(r.status) + ": " + r.body.substr(0, 500);
    return out;
  }
  bool have_token = false, reported = false;
  SteadyClock::time_point last;
  size_t ids_seen = 0;
  for (const HttpEvent& e : r.events) {
    if (e.data == "[DONE]") continue;
    const json j = json::parse(e.data, nullptr, false);
    if (j.is_discarded()) {
      out.error = "unparsable event: " + e.data.substr(0, 200);
      return out;
    }
    if (j.contains("error")) {
      out.error = j["error"].dump();
      return out;
    }
    bool token = false;
    if (o.backend == "nibble") {
      const size_t ids = j.value("output_ids", json::array()).size();
      token = ids > ids_seen;
      ids_seen = std::max(ids_seen, ids);
      out.generated_text = j.value("text", out.generated_text);
      out.output_tokens = static_cast<int64_t>(ids_seen);
      out.server_prompt_tokens = j.value("meta_info", json::object()).value("prompt_tokens", int64_t{0});
      if (token) out.arrival_time.push_back(std::chrono::duration<double>(e.at - r.started).count());
      reported = true;
    } else {
      if (j.contains("usage") && j["usage"].is_object() && j["usage"].contains("completion_tokens")) {
        out.output_tokens = j["usage"]["completion_tokens"].get<int64_t>();
        out.server_prompt_tokens = j["usage"].value("prompt_tokens", out.server_prompt_tokens);
        reported = true;
      }
      if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
        const json& c = j["choices"][0];
        // FastDeploy's client keeps every choice chunk's server arrival_time (its own clock where absent).
        const json& at = c.contains("arrival_time") ? c["arrival_time"] : json();
        out.arrival_time.push_back(at.is_number() ? at.get<double>()
                                                  : std::chrono::duration<double>(e.at - r.started).count());
        std::string piece;
        if (o.backend == "openai-chat" && c.contains("delta")) {
          for (const char* k : {"reasoning_content", "reasoning", "content"})
            if (c["delta"].contains(k) && c["delta"][k].is_string()) piece += c["delta"][k].get<std::string>();
        } else if (c.contains("text") && c["text"].is_string()) {
          piece = c["text"].get<std::string>();
        }
        token = !piece.empty();
        out.generated_text += piece;
      }
    }
    if (!token) continue;
    if (!have_token)
      out.ttft = std::chrono::duration<double>(e.at - r.started).count();
    else
      out.itl.push_back(std::chrono::duration<double>(e.at - last).count());
    have_token = true;
    last = e.at;
  }
  if (!reported)
    out.output_tokens = tokenizer ? static_cast<int64_t>(tokenizer->encode(out.generated_text, true, false).size())
                                  : static_cast<int64_t>(out.itl.size() + (have_token ? 1 : 0));
  if (!have_token && p.output_len > 0) {
    out.error = "the response carried no token";
    return out;
  }
  out.success = true;
  return out;
}

// Counters from nibble's /metrics (their unlabelled totals); valid false from a server without them.
struct ServerCounters {
  bool valid = false;
  double device_steps = 0, device_idle = 0, device_busy = 0, mask_rows = 0, mask_seconds = 0;
};

ServerCounters server_counters(const Endpoint& endpoint) {
  ServerCounters c;
  const HttpResult r = http_request_sync(endpoint, "GET", "/metrics");
  if (r.status != 200) return c;
  std::istringstream lines(r.body);
  std::string line;
  auto value_of = [&](const char* name, double& out) {
    // "name{model_name=\"…\"} v": the series without an engine label (the sum over engines).
    if (line.rfind(name, 0) != 0 || line.size() <= std::strlen(name) || line[std::strlen(name)] != '{' ||
        line.find("engine=") != std::string::npos)
      return;
    out = std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
    c.valid = true;
  };
  while (std::getline(lines, line)) {
    value_of("nibble:device_steps_total", c.device_steps);
    value_of("nibble:device_idle_seconds_total", c.device_idle);
    value_of("nibble:device_step_seconds_total", c.device_busy);
    value_of("nibble:grammar_mask_rows_total", c.mask_rows);
    value_of("nibble:grammar_mask_seconds_total", c.mask_seconds);
  }
  return c;
}

}  // namespace

int run_bench_serve(const BenchServeOptions& o) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "nibble bench serve: %s\n", m.c_str());
    return 1;
  };
  // Checked before any request goes out: a metric we cannot compute must not print as nothing.
  for (const std::string& metric : split(o.percentile_metrics)) {
    const auto& known = SUPPORTED_PERCENTILE_METRICS;
    if (std::find(std::begin(known), std::end(known), metric) == std::end(known)) {
      std::string list;
      for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      return fail("--percentile-metrics: '" + metric + "' is not computed by nibble bench serve (supported: " + list +
                  ")");
    }
  }
  for (const std::string& p : split(o.metric_percentiles)) {
    char* end = nullptr;
    const double q = std::strtod(p.c_str(), &end);
    if (p.empty() || *end != 0 || !(q > 0 && q <= 100))
      return fail("--metric-percentiles: '" + p + "' is not a number in (0, 100]");
  }
  Result<Endpoint> endpoint = resolve_endpoint(o.base_url, o.host, o.port);
  if (!endpoint) return fail(endpoint.status().message());
  const std::string path = !o.endpoint.empty()          ? o.endpoint
                           : o.backend == "openai-chat" ? "/v1/chat/completions"
                           : o.backend == "nibble"      ? "/generate"
                                                        : "/v1/completions";
  std::string model = o.model;
  if (model.empty()) {
    auto served = first_served_model(*endpoint);
    if (!served) return fail(served.status().message());
    model = *served;
  }
  std::string tokenizer_path = o.tokenizer;
  if (tokenizer_path.empty() && std::filesystem::is_directory(model)) tokenizer_path = model;
  if (tokenizer_path.empty()) {
    HttpResult r = http_request_sync(*endpoint, "GET", "/get_model_info");
    const json j = json::parse(r.body, nullptr, false);
    if (r.status == 200 && !j.is_discarded()) tokenizer_path = j.value("tokenizer_path", "");
  }
  std::unique_ptr<text::Tokenizer> tokenizer;
  if (!tokenizer_path.empty()) {
    auto loaded = text::Tokenizer::load(tokenizer_path);
    if (!loaded) return fail("--tokenizer: " + loaded.status().message());
    tokenizer = std::move(loaded.value());
  } else if (o.dataset_name != "jsonl") {
    return fail("the " + o.dataset_name + " dataset needs a tokenizer: give --tokenizer DIR");
  }

  Result<std::vector<BenchPrompt>> prompts = Status::error("--dataset-name must be random, sharegpt or jsonl");
  if (o.dataset_name == "random")
    prompts = random_dataset(*tokenizer, o.random);
  else if (o.dataset_name == "sharegpt")
    prompts = sharegpt_dataset(o.dataset_path, *tokenizer, o.random.num_prompts, o.output_len, o.random.seed);
  else if (o.dataset_name == "jsonl")
    prompts = jsonl_dataset(o.dataset_path, tokenizer.get(), o.random.num_prompts,
                            o.output_len > 0 ? o.output_len : o.random.output_len);
  if (!prompts) return fail(prompts.status().message());
  const size_t n = prompts->size();

  // Arrival times: gamma-distributed gaps with mean 1/rate (shape = burstiness; 1 is Poisson).
  std::vector<double> arrival(n, 0.0);
  if (!std::isinf(o.request_rate)) {
    if (!(o.request_rate > 0) || !(o.burstiness > 0)) return fail("--request-rate and --burstiness must be > 0");
    std::mt19937_64 rng(o.random.seed);
    std::gamma_distribution<double> gap(o.burstiness, 1.0 / (o.request_rate * o.burstiness));
    double t = 0;
    for (size_t i = 0; i < n; ++i) {
      arrival[i] = t;
      t += gap(rng);
    }
  }

  Result<Structured> structured = load_structured(o);
  if (!structured) return fail(structured.status().message());
  const ServerCounters before = server_counters(*endpoint);

  boost::asio::io_context io;
  std::vector<RequestOutcome> outcomes(n);
  std::atomic<uint64_t> done{0};
  std::deque<size_t> ready;  // arrived, waiting for a concurrency slot
  int64_t in_flight = 0;
  const auto start = SteadyClock::now();
  SteadyClock::time_point last_finish = start;
  std::function<void()> launch_ready;
  launch_ready = [&] {
    while (!ready.empty() && (o.max_concurrency <= 0 || in_flight < o.max_concurrency)) {
      const size_t i = ready.front();
      ready.pop_front();
      ++in_flight;
      const double offset = std::chrono::duration<double>(SteadyClock::now() - start).count();
      http_post(io, *endpoint, path, request_body(o, model, (*prompts)[i], *structured),
                [&, i, offset](HttpResult&& r) {
                  outcomes[i] = parse_response(o, r, (*prompts)[i], tokenizer.get());
                  outcomes[i].start_offset = offset;
                  last_finish = std::max(last_finish, r.finished);
                  --in_flight;
                  ++done;
                  launch_ready();
                });
    }
  };
  std::vector<std::unique_ptr<boost::asio::steady_timer>> timers;
  for (size_t i = 0; i < n; ++i) {
    timers.push_back(std::make_unique<boost::asio::steady_timer>(
        io, start + std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(arrival[i]))));
    timers.back()->async_wait([&, i](boost::system::error_code) {
      ready.push_back(i);
      launch_ready();
    });
  }
  {
    std::unique_ptr<ProgressBar> bar;
    if (!o.disable_progress) bar = std::make_unique<ProgressBar>("bench serve", n, done, "requests", "req");
    io.run();
  }
  const double duration = std::chrono::duration<double>(last_finish - start).count();

  BenchSettings settings;
  settings.backend = o.backend;
  settings.model = model;
  settings.tokenizer = tokenizer_path;
  settings.dataset = o.dataset_name;
  settings.num_prompts = static_cast<int64_t>(n);
  settings.request_rate = o.request_rate;
  settings.burstiness = o.burstiness;
  settings.max_concurrency = o.max_concurrency;
  settings.percentile_metrics = split(o.percentile_metrics);
  for (const std::string& p : split(o.metric_percentiles)) settings.metric_percentiles.push_back(std::stod(p));
  BenchSummary summary = summarize(outcomes, duration, settings);
  std::fwrite(summary.printed.data(), 1, summary.printed.size(), stdout);
  // The server's own view of the run (nibble's /metrics; absent from other servers): the GPU's idle
  // time between steps, and structured output's mask time per constrained row and step.
  const ServerCounters after = server_counters(*endpoint);
  if (after.valid && before.valid) {
    const double steps = after.device_steps - before.device_steps, rows = after.mask_rows - before.mask_rows;
    const double idle = after.device_idle - before.device_idle, busy = after.device_busy - before.device_busy;
    if (steps > 0) {
      std::printf("%-40s %.2f%% (%.1f us a step)\n", "Device idle between steps:", 100.0 * idle / (idle + busy),
                  1e6 * idle / steps);
      summary.result["device_idle_fraction"] = idle / (idle + busy);
    }
    if (rows > 0) {
      std::printf("%-40s %.1f us (%.0f rows)\n",
                  "Grammar mask time a row and step:", 1e6 * (after.mask_seconds - before.mask_seconds) / rows, rows);
      summary.result["grammar_mask_us_per_row"] = 1e6 * (after.mask_seconds - before.mask_seconds) / rows;
    }
  }
  summary.result["structured"] = o.structured;
  for (const RequestOutcome& r : outcomes)
    if (!r.success) {
      std::fprintf(stderr, "first failure: %s\n", r.error.c_str());
      break;
    }
  if (o.save_result) {
    std::string name = o.result_filename;
    if (name.empty()) name = o.backend + "-" + summary.result["date"].get<std::string>() + ".json";
    const std::filesystem::path file = std::filesystem::path(o.result_dir) / name;
    std::ofstream out(file);
    out << summary.result.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
    if (!out) return fail("cannot write " + file.string());
    std::fprintf(stderr, "saved %s\n", file.string().c_str());
  }
  return 0;
}

}  // namespace nibble::tools
