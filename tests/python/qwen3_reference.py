"""Tiny random Qwen3 / Qwen3-MoE models as differential-test references: a transformers model in fp32,
its ModelOpt NVFP4 checkpoint (weights quantized by nvidia-modelopt's NVFP4QTensor, input_scales from
a max-calibration pass) for nibble, and the same model with the checkpoint's dequantized weights and,
for the W4A4 modes, inputs of every quantized linear fake-quantized as docs/format.md says."""
import contextlib
import json
import pathlib

import torch
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen3_moe import modeling_qwen3_moe

import nvfp4_ref


def make_model(shape: dict, seed: int):
    torch.manual_seed(seed)
    moe = "num_experts" in shape
    common = dict(vocab_size=512, max_position_embeddings=512, rope_theta=1e6, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, attention_bias=False)
    config = (Qwen3MoeConfig if moe else Qwen3Config)(**common, **shape)
    config.architectures = ["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"]
    model = (Qwen3MoeForCausalLM if moe else Qwen3ForCausalLM)(config).float().eval()
    with torch.no_grad():
        # Scales chosen so logits are well separated (greedy decoding is stable under fp32
        # reordering) and routing is decisive.
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            elif "lm_head" in name:
                p.normal_(0.0, 0.3)
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.1)
            p.copy_(p.to(torch.bfloat16).float())  # checkpoints hold BF16 values
    return model


def linear_modules(model):
    """(checkpoint module name, weight getter/setter) of every projection, experts unfused."""
    out = []
    for l, layer in enumerate(model.model.layers):
        p = f"model.layers.{l}."
        attn = layer.self_attn
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out.append((p + "self_attn." + n, getattr(attn, n).weight))
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            I = mlp.experts.gate_up_proj.shape[1] // 2
            for e in range(mlp.experts.gate_up_proj.shape[0]):
                x = f"{p}mlp.experts.{e}."
                out.append((x + "gate_proj", mlp.experts.gate_up_proj.data[e, :I]))
                out.append((x + "up_proj", mlp.experts.gate_up_proj.data[e, I:]))
                out.append((x + "down_proj", mlp.experts.down_proj.data[e]))
        else:
            for n in ("gate_proj", "up_proj", "down_proj"):
                out.append((p + "mlp." + n, getattr(mlp, n).weight))
    return out


def fusion_key(name: str) -> str:
    stem, leaf = name.rsplit(".", 1)
    if leaf in ("q_proj", "k_proj", "v_proj"):
        return stem + ".qkv"
    if leaf in ("gate_proj", "up_proj"):
        return stem + ".gate_up"
    return name


# A value this close (relative) to a rounding or routing boundary is fragile: 3x the largest
# relative difference seen between nibble's and torch's fp32 activations (~1e-6).
FRAGILE_REL = 3e-6


@contextlib.contextmanager
def patched_experts(mode: str, scales: dict | None, observe: dict | None, fragile: set | None = None,
                    experts_class=modeling_qwen3_moe.Qwen3MoeExperts):
    """Qwen3MoeExperts.forward (or another experts class with the same fused layout, e.g.
    Ernie4_5_MoeExperts) with fake-quantized inputs (shared static scales from `scales`, or per token
    / per (token, expert) row), optional amax observation per expert, and the tokens whose
    quantization is fragile collected into `fragile`."""
    original = experts_class.forward

    def forward(self, hidden_states, top_k_index, top_k_weights):
        final = torch.zeros_like(hidden_states)
        layer = self._nibble_layer
        for e in range(self.num_experts):
            token_idx, top_k_pos = torch.where(top_k_index == e)
            if token_idx.numel() == 0:
                continue
            x = hidden_states[token_idx]
            prefix = f"model.layers.{layer}.mlp.experts.{e}."
            if observe is not None:
                for n in ("gate_proj", "up_proj"):
                    observe[prefix + n] = max(observe.get(prefix + n, 0.0), x.abs().max().item())
            if fragile is not None:
                flags = nvfp4_ref.fragile_rows(x, mode, scales and scales[f"layer{layer}.gate_up"], FRAGILE_REL)
                fragile.update(token_idx[flags].tolist())
            x = nvfp4_ref.fake_quantize(x, mode, scales and scales[f"layer{layer}.gate_up"])
            gate, up = torch.nn.functional.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
            act = self.act_fn(gate) * up
            if observe is not None:
                observe[prefix + "down_proj"] = max(observe.get(prefix + "down_proj", 0.0), act.abs().max().item())
            if fragile is not None:
                flags = nvfp4_ref.fragile_rows(act, mode, scales and scales[f"layer{layer}.down"], FRAGILE_REL)
                fragile.update(token_idx[flags].tolist())
            act = nvfp4_ref.fake_quantize(act, mode, scales and scales[f"layer{layer}.down"])
            y = torch.nn.functional.linear(act, self.down_proj[e]) * top_k_weights[token_idx, top_k_pos, None]
            final.index_add_(0, token_idx, y)
        return final

    experts_class.forward = forward
    try:
        yield
    finally:
        experts_class.forward = original


def tag_layers(model):
    for l, layer in enumerate(model.model.layers):
        if hasattr(layer.mlp, "experts"):
            layer.mlp.experts._nibble_layer = l


@contextlib.contextmanager
def dense_hooks(model, quantized: set, mode: str, input_scales: dict | None, observe: dict | None,
                fragile: set | None = None):
    """Forward pre-hooks on the dense projections: observe input amax and/or fake-quantize, and
    collect fragile tokens (batch of one sequence: rows are token positions). Also marks tokens
    whose router top-k choice is a near tie."""
    handles = []
    if fragile is not None:
        for layer in model.model.layers:
            if hasattr(layer.mlp, "experts"):
                def router_hook(mod, args, output):
                    probs = torch.softmax(output[0].float(), -1).sort(-1, descending=True).values
                    k = mod.top_k
                    if k < probs.shape[-1]:
                        tie = (probs[:, k - 1] - probs[:, k]) <= FRAGILE_REL * probs[:, k - 1]
                        fragile.update(tie.nonzero().flatten().tolist())
                handles.append(layer.mlp.gate.register_forward_hook(router_hook))
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name not in quantized:
            continue

        def hook(mod, args, name=name):
            x = args[0]
            if observe is not None:
                observe[name] = max(observe.get(name, 0.0), x.abs().max().item())
            if fragile is not None:
                flags = nvfp4_ref.fragile_rows(x, mode, input_scales and input_scales[name], FRAGILE_REL)
                fragile.update(flags.nonzero().flatten().tolist())
            if mode != "none":
                return (nvfp4_ref.fake_quantize(x, mode, input_scales and input_scales[name]),)
            return None

        handles.append(module.register_forward_pre_hook(hook))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def calibrate_and_quantize(model, linears, quantized: set, calib: torch.Tensor,
                           experts_class=modeling_qwen3_moe.Qwen3MoeExperts):
    """Max calibration of every quantized linear's input on `calib` (fp32, weights not yet quantized),
    as ModelOpt's max calibrator does, fused inputs sharing the max; then ModelOpt's NVFP4 quantization
    of those linears (fused groups share weight_scale_2), whose weights in `model` become the
    dequantized values. Returns (the quantized linears' checkpoint tensors, input scales by name)."""
    amax = {}
    with torch.no_grad(), dense_hooks(model, quantized, "none", None, amax), \
            patched_experts("none", None, amax, experts_class=experts_class):
        model(calib)
    fused_amax = {}
    for name in quantized:
        key = fusion_key(name)
        fused_amax[key] = max(fused_amax.get(key, 0.0), amax.get(name, 1.0))
    input_scales = {n: torch.tensor(fused_amax[fusion_key(n)] / 2688.0, dtype=torch.float32) for n in quantized}

    tensors, groups = {}, {}
    for name, weight in linears:
        if name in quantized:
            groups.setdefault(fusion_key(name), []).append((name, weight))
    with torch.no_grad():
        for members in groups.values():
            shared = max(NVFP4QTensor.get_weights_scaling_factor_2(w) for _, w in members)
            for name, weight in members:
                q, block_scale, scale_2 = NVFP4QTensor.quantize(weight.clone(), 16, weights_scaling_factor_2=shared)
                tensors[name + ".weight"] = q._quantized_data.contiguous()
                tensors[name + ".weight_scale"] = block_scale.contiguous()
                tensors[name + ".weight_scale_2"] = scale_2.reshape(()).clone()
                tensors[name + ".input_scale"] = input_scales[name].clone()
                weight.copy_(q.dequantize(dtype=torch.float32, scale=block_scale, double_scale=scale_2,
                                          block_sizes={-1: 16}))
    return tensors, input_scales


def write_checkpoint(out_dir: pathlib.Path, model, tensors: dict, exclude: list[str]):
    """model.safetensors, config.json and ModelOpt's hf_quant_config.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    model.config.save_pretrained(out_dir)
    (out_dir / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.47.0"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                         "exclude_modules": exclude}}))


def static_scales(model, input_scales: dict) -> dict:
    """Static mode shares one scale per fused input: q/k/v max, and per MoE layer the max over
    experts for gate/up and for down (as the Blackwell MoE kernels do)."""
    static = dict(input_scales)
    for l in range(len(model.model.layers)):
        for stage, leaves in (("gate_up", ("gate_proj", "up_proj")), ("down", ("down_proj",))):
            vals = [s for n, s in input_scales.items()
                    if n.startswith(f"model.layers.{l}.mlp.experts.") and n.rsplit(".", 1)[1] in leaves]
            if vals:
                static[f"layer{l}.{stage}"] = max(vals)
    return static


def build(shape: dict, seed: int, out_dir: pathlib.Path, quantize_attention: bool = True):
    """Writes the ModelOpt NVFP4 checkpoint to out_dir; returns the fp32 reference model holding the
    dequantized weights and a dict of the checkpoint's input scales."""
    model = make_model(shape, seed)
    tag_layers(model)
    linears = linear_modules(model)
    quantized = {n for n, _ in linears if quantize_attention or ".self_attn." not in n}
    calib = torch.randint(0, 512, (4, 24), generator=torch.Generator().manual_seed(seed))
    tensors, input_scales = calibrate_and_quantize(model, linears, quantized, calib)
    for name, weight in linears:
        if name not in quantized:
            tensors[name + ".weight"] = weight.to(torch.bfloat16).contiguous()
    for name, p in model.state_dict().items():
        if name.endswith("norm.weight") or "embed_tokens" in name or name == "lm_head.weight" \
                or name.endswith("mlp.gate.weight"):
            tensors[name] = p.to(torch.bfloat16).contiguous()
    write_checkpoint(out_dir, model, tensors,
                     ["lm_head", "model.layers.*.mlp.gate"] + ([] if quantize_attention else ["*self_attn*"]))
    model._nibble_quantized = quantized
    return model, static_scales(model, input_scales)


def reference_logits(model, static_scales: dict, ids: list[int], mode_moe: str, mode_dense: str):
    """(logits [len(ids), vocab], fragile token positions) of the reference model on ids with the
    given activation modes. A fragile position has a quantization input or router choice within
    FRAGILE_REL of a boundary, where an fp32 reordering may legitimately flip the result."""
    dense_quantized = {n for n in model._nibble_quantized if ".experts." not in n}
    fragile = set()
    with torch.no_grad(), dense_hooks(model, dense_quantized, mode_dense, static_scales, None, fragile), \
            patched_experts(mode_moe, static_scales, None, fragile):
        return model(torch.tensor([ids])).logits[0].float(), fragile
