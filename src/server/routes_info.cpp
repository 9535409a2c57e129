// The read-only routes: /health, /metrics, /version, /v1/models, SGLang's /get_model_info and
// /server_info (also under its older name /get_server_info).
#include "server/context.h"

namespace nibble::server {

void handle_health(ServingContext& ctx, const HttpRequest&, Responder responder) {
  if (ctx.draining) ctx.health_refused = true;
  if (ready_model(ctx, responder)) responder->respond(200, "text/plain", "");
}

void handle_metrics(ServingContext& ctx, const HttpRequest&, Responder responder) {
  responder->respond(200, "text/plain; version=0.0.4", prometheus_text(ctx));
}

void handle_version(ServingContext& ctx, const HttpRequest&, Responder responder) {
  respond_json(responder, 200, {{"version", ctx.options.version}});
}

void handle_models(ServingContext& ctx, const HttpRequest&, Responder responder) {
  auto model = ctx.model();
  json entry = {{"id", ctx.options.served_model_name}, {"object", "model"},
                {"created", ctx.started_at},           {"owned_by", "nibble"},
                {"root", ctx.options.model_path},      {"parent", nullptr}};
  if (model) entry["max_model_len"] = model->engine->config().max_model_len;
  respond_json(responder, 200, {{"object", "list"}, {"data", json::array({entry})}});
}

void handle_model_info(ServingContext& ctx, const HttpRequest&, Responder responder) {
  auto model = ready_model(ctx, responder);
  if (!model) return;
  const engine::ModelInfo info = model->engine->model_info();
  respond_json(responder, 200,
               {{"model_path", info.model_path},
                {"tokenizer_path", model->tokenizer_path},
                {"is_generation", true},
                {"weight_version", info.weight_version},
                {"served_model_name", ctx.options.served_model_name},
                {"architecture", model->engine->model_config().architecture},
                {"max_model_len", model->engine->config().max_model_len}});
}

void handle_server_info(ServingContext& ctx, const HttpRequest&, Responder responder) {
  const ServerOptions& o = ctx.options;
  json info = {{"version", o.version},
               {"model_path", o.model_path},
               {"served_model_name", o.served_model_name},
               {"host", o.host},
               {"port", o.port},
               {"max_num_seqs", o.max_num_seqs},
               {"max_num_batched_tokens", o.max_num_batched_tokens},
               {"scheduler_delay_factor", o.scheduler_delay_factor},
               {"block_size", o.block_size},
               {"kv_cache_dtype", o.kv_cache_dtype},
               {"backend", o.backend},
               {"moe_backend", o.moe_backend},
               {"gemm_backend", o.gemm_backend},
               {"attention_backend", o.attention_backend},
               {"decode_attention", o.decode_attention},
               {"act_quant_moe", o.act_quant_moe},
               {"act_quant_dense", o.act_quant_dense},
               {"tensor_parallel_size", o.tensor_parallel_size},
               {"enable_expert_parallel", o.expert_parallel},
               {"data_parallel_size", o.data_parallel_size},
               {"dp_size", o.data_parallel_size},
               {"enable_prefix_caching", o.enable_prefix_caching},
               {"disable_overlap_schedule", o.disable_overlap_schedule},
               {"skip_server_warmup", o.skip_server_warmup},
               {"enforce_eager", o.enforce_eager}};
  if (auto model = ctx.model()) {
    info["max_model_len"] = model->engine->config().max_model_len;
    info["runner"] = model->backend;
    // One entry per engine (SGLang lists its data-parallel ranks' states the same way).
    const std::vector<engine::MetricsSnapshot> parts = model->engine->engine_metrics();
    const std::vector<engine::EngineReplicaInfo> replicas = model->engine->replicas();
    json states = json::array(), engines = json::array();
    for (size_t i = 0; i < parts.size(); ++i) {
      const engine::MetricsSnapshot& m = parts[i];
      const engine::EngineReplicaInfo& r = replicas[i];
      states.push_back({{"num_running", m.requests_running},
                        {"num_waiting", m.requests_waiting},
                        {"kv_cache_usage", m.kv_usage},
                        {"kv_cache_blocks", m.kv_blocks_total}});
      engines.push_back({{"index", r.index},
                         {"device", r.device},
                         {"in_service", r.in_service},
                         {"load", r.load},
                         {"routed_requests", r.routed},
                         {"routing_table_blocks", r.cached_prefixes}});
    }
    info["internal_states"] = states;
    info["engines"] = engines;
  }
  respond_json(responder, 200, info);
}

}  // namespace nibble::server
