// /metrics in the Prometheus text format (version 0.0.4), named after vLLM's metrics with the
// nibble: prefix, labelled with the served model name.
#include <cstdio>
#include <sstream>

#include "server/context.h"

namespace nibble::server {
namespace {

std::string number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

class Writer {
 public:
  explicit Writer(std::string model) : label_("model_name=\"" + escape(model) + "\"") {}

  void metric(const char* name, const char* type, const char* help, double value, const std::string& extra = "") {
    header(name, type, help);
    sample(name, extra, value);
  }
  void header(const char* name, const char* type, const char* help) {
    out_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  }
  void sample(const std::string& name, const std::string& extra, double value) {
    out_ << name << '{' << label_ << (extra.empty() ? "" : "," + extra) << "} " << number(value) << '\n';
  }
  // A histogram's series (its header written before), with `extra` labels on each.
  void histogram_samples(const char* name, const std::string& extra, const engine::Histogram& h) {
    const std::string sep = extra.empty() ? "" : extra + ",";
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cumulative += h.counts[i];
      sample(std::string(name) + "_bucket", sep + "le=\"" + number(h.bounds[i]) + "\"",
             static_cast<double>(cumulative));
    }
    sample(std::string(name) + "_bucket", sep + "le=\"+Inf\"", static_cast<double>(h.count));
    sample(std::string(name) + "_sum", extra, h.sum);
    sample(std::string(name) + "_count", extra, static_cast<double>(h.count));
  }
  std::string str() const { return out_.str(); }

 private:
  static std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += c;
    }
    return out;
  }
  std::string label_;
  std::ostringstream out_;
};

}  // namespace

std::string prometheus_text(ServingContext& ctx) {
  Writer w(ctx.options.served_model_name);
  auto model = ctx.model();
  w.metric("nibble:model_loaded", "gauge", "1 once the model is loaded and serving.", model ? 1 : 0);
  w.metric("nibble:http_connections", "gauge", "Open HTTP connections.",
           static_cast<double>(ctx.http_stats->open_connections.load()));
  w.metric("nibble:http_requests_total", "counter", "HTTP requests received.",
           static_cast<double>(ctx.http_stats->requests.load()));
  if (!model) return w.str();
  // The engines' sum unlabelled (what one engine reports alone), and with data parallelism each
  // engine's under engine="i" as well (vLLM's label for its data-parallel engines).
  std::vector<std::pair<std::string, engine::MetricsSnapshot>> series = {{"", model->engine->metrics()}};
  if (model->engine->size() > 1) {
    const std::vector<engine::MetricsSnapshot> parts = model->engine->engine_metrics();
    for (size_t i = 0; i < parts.size(); ++i) series.emplace_back("engine=\"" + std::to_string(i) + "\"", parts[i]);
  }
  auto join = [](const std::string& a, const std::string& b) { return a.empty() ? b : b.empty() ? a : a + "," + b; };
  auto each = [&](const char* name, const char* type, const char* help, auto value) {
    w.header(name, type, help);
    for (const auto& [label, m] : series) w.sample(name, label, static_cast<double>(value(m)));
  };
  auto histogram = [&](const char* name, const char* help, auto pick) {
    w.header(name, "histogram", help);
    for (const auto& [label, m] : series) w.histogram_samples(name, label, pick(m));
  };
  using S = engine::MetricsSnapshot;
  each("nibble:num_requests_running", "gauge", "Sequences in the running batch.",
       [](const S& m) { return m.requests_running; });
  each("nibble:num_requests_waiting", "gauge", "Sequences waiting to be scheduled.",
       [](const S& m) { return m.requests_waiting; });
  each("nibble:kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use (1 = 100%).",
       [](const S& m) { return m.kv_usage; });
  each("nibble:kv_cache_blocks", "gauge", "KV-cache blocks in total.", [](const S& m) { return m.kv_blocks_total; });
  each("nibble:prompt_tokens_total", "counter", "Prompt tokens of requests that produced a token.",
       [](const S& m) { return m.prompt_tokens; });
  each("nibble:generation_tokens_total", "counter", "Generated tokens.",
       [](const S& m) { return m.generation_tokens; });
  each("nibble:num_preemptions_total", "counter", "Sequences preempted (recomputed later) for lack of KV blocks.",
       [](const S& m) { return m.preemptions; });
  each("nibble:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
       [](const S& m) { return m.prefix_queries; });
  each("nibble:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
       [](const S& m) { return m.prefix_hits; });
  w.header("nibble:request_success_total", "counter", "Finished requests by finish reason.");
  for (const auto& [label, m] : series)
    for (const char* reason : {"stop", "length", "abort", "error"}) {
      auto it = m.finished.find(reason);
      w.sample("nibble:request_success_total", join(label, std::string("finished_reason=\"") + reason + "\""),
               it == m.finished.end() ? 0.0 : static_cast<double>(it->second));
    }
  histogram("nibble:time_to_first_token_seconds", "Time to first token (arrival to first token).",
            [](const S& m) -> const engine::Histogram& { return m.ttft; });
  histogram("nibble:time_per_output_token_seconds", "Mean time per output token after the first, per request.",
            [](const S& m) -> const engine::Histogram& { return m.tpot; });
  histogram("nibble:inter_token_latency_seconds", "Time between consecutive tokens of a sequence.",
            [](const S& m) -> const engine::Histogram& { return m.itl; });
  histogram("nibble:e2e_request_latency_seconds", "Arrival to the last output of a request.",
            [](const S& m) -> const engine::Histogram& { return m.e2e; });
  each("nibble:engine_steps_total", "counter", "Model steps run.", [](const S& m) { return m.steps; });
  each("nibble:step_model_seconds_total", "counter",
       "Time inside the model runner's calls (launching a step, and waiting to collect one: on the GPU "
       "mostly the device computing).",
       [](const S& m) { return m.step_model_seconds; });
  each("nibble:step_engine_seconds_total", "counter",
       "The engine's own time around steps (scheduling, batches, detokenizing, outputs); with overlapped "
       "scheduling it runs while the device computes the step launched before.",
       [](const S& m) { return m.step_engine_seconds; });
  histogram("nibble:step_engine_seconds", "The engine's own time per step.",
            [](const S& m) -> const engine::Histogram& { return m.step_engine; });
  each("nibble:device_steps_total", "counter", "GPU steps launched back to back with the one before.",
       [](const S& m) { return m.device_steps; });
  each("nibble:device_step_seconds_total", "counter", "The device time of those steps.",
       [](const S& m) { return m.device_step_seconds; });
  each("nibble:device_idle_seconds_total", "counter",
       "How long the GPU sat idle before those steps, waiting for the host to queue them.",
       [](const S& m) { return m.device_idle_seconds; });
  histogram("nibble:device_idle_seconds", "The GPU's idle time before each step launched back to back.",
            [](const S& m) -> const engine::Histogram& { return m.device_idle; });
  each("nibble:grammar_mask_rows_total", "counter",
       "Structured output: grammar masks filled on the CPU (one per constrained row and step).",
       [](const S& m) { return m.grammar_mask_rows; });
  each("nibble:grammar_mask_seconds_total", "counter", "Structured output: the engine thread's time filling them.",
       [](const S& m) { return m.grammar_mask_seconds; });
  if (model->grammar) {
    const grammar::GrammarCompiler::Stats g = model->grammar->stats();
    w.header("nibble:grammar_compile_cache_hits_total", "counter", "Structured output: constraints found compiled.");
    w.sample("nibble:grammar_compile_cache_hits_total", "", static_cast<double>(g.hits));
    w.header("nibble:grammar_compile_cache_misses_total", "counter", "Structured output: constraints compiled.");
    w.sample("nibble:grammar_compile_cache_misses_total", "", static_cast<double>(g.misses));
    w.header("nibble:grammar_compile_seconds_total", "counter", "Structured output: time compiling them.");
    w.sample("nibble:grammar_compile_seconds_total", "", g.compile_seconds);
  }
  if (model->engine->size() > 1) {
    w.header("nibble:engine_in_service", "gauge",
             "1 while a data-parallel engine takes requests, 0 once a failure took it out.");
    for (const engine::EngineReplicaInfo& r : model->engine->replicas())
      w.sample("nibble:engine_in_service", "engine=\"" + std::to_string(r.index) + "\"", r.in_service ? 1 : 0);
  }
  return w.str();
}

}  // namespace nibble::server
