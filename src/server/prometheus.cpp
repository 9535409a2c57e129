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
  void histogram(const char* name, const char* help, const engine::Histogram& h) {
    header(name, "histogram", help);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cumulative += h.counts[i];
      sample(std::string(name) + "_bucket", "le=\"" + number(h.bounds[i]) + "\"", static_cast<double>(cumulative));
    }
    sample(std::string(name) + "_bucket", "le=\"+Inf\"", static_cast<double>(h.count));
    sample(std::string(name) + "_sum", "", h.sum);
    sample(std::string(name) + "_count", "", static_cast<double>(h.count));
  }
  std::string str() const { return out_.str(); }

 private:
  static std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      if (c == '\n') { out += "\\n"; continue; }
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
  const engine::MetricsSnapshot m = model->engine->metrics();
  w.metric("nibble:num_requests_running", "gauge", "Sequences in the running batch.", static_cast<double>(m.requests_running));
  w.metric("nibble:num_requests_waiting", "gauge", "Sequences waiting to be scheduled.", static_cast<double>(m.requests_waiting));
  w.metric("nibble:kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use (1 = 100%).", m.kv_usage);
  w.metric("nibble:kv_cache_blocks", "gauge", "KV-cache blocks in total.", static_cast<double>(m.kv_blocks_total));
  w.metric("nibble:prompt_tokens_total", "counter", "Prompt tokens of requests that produced a token.",
           static_cast<double>(m.prompt_tokens));
  w.metric("nibble:generation_tokens_total", "counter", "Generated tokens.", static_cast<double>(m.generation_tokens));
  w.metric("nibble:num_preemptions_total", "counter", "Sequences preempted (recomputed later) for lack of KV blocks.",
           static_cast<double>(m.preemptions));
  w.metric("nibble:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
           static_cast<double>(m.prefix_queries));
  w.metric("nibble:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
           static_cast<double>(m.prefix_hits));
  w.header("nibble:request_success_total", "counter", "Finished requests by finish reason.");
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    auto it = m.finished.find(reason);
    w.sample("nibble:request_success_total", std::string("finished_reason=\"") + reason + "\"",
             it == m.finished.end() ? 0.0 : static_cast<double>(it->second));
  }
  w.histogram("nibble:time_to_first_token_seconds", "Time to first token (arrival to first token).", m.ttft);
  w.histogram("nibble:time_per_output_token_seconds", "Mean time per output token after the first, per request.", m.tpot);
  w.histogram("nibble:inter_token_latency_seconds", "Time between consecutive tokens of a sequence.", m.itl);
  w.histogram("nibble:e2e_request_latency_seconds", "Arrival to the last output of a request.", m.e2e);
  w.metric("nibble:engine_steps_total", "counter", "Model steps run.", static_cast<double>(m.steps));
  w.metric("nibble:step_model_seconds_total", "counter",
           "Time inside the model runner's calls (launching a step, and waiting to collect one: on the GPU "
           "mostly the device computing).",
           m.step_model_seconds);
  w.metric("nibble:step_engine_seconds_total", "counter",
           "The engine's own time around steps (scheduling, batches, detokenizing, outputs); with overlapped "
           "scheduling it runs while the device computes the step launched before.",
           m.step_engine_seconds);
  w.histogram("nibble:step_engine_seconds", "The engine's own time per step.", m.step_engine);
  w.metric("nibble:device_steps_total", "counter", "GPU steps launched back to back with the one before.",
           static_cast<double>(m.device_steps));
  w.metric("nibble:device_step_seconds_total", "counter", "The device time of those steps.", m.device_step_seconds);
  w.metric("nibble:device_idle_seconds_total", "counter",
           "How long the GPU sat idle before those steps, waiting for the host to queue them.", m.device_idle_seconds);
  w.histogram("nibble:device_idle_seconds", "The GPU's idle time before each step launched back to back.",
              m.device_idle);
  return w.str();
}

}  // namespace nibble::server
