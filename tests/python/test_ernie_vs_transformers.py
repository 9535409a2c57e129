"""ERNIE-4.5-MoE on nibble's CPU reference against Hugging Face transformers (fp32, CPU): a tiny random
Ernie4_5_MoeForCausalLM made by transformers itself (a dense first layer, MoE layers with 8 experts top-2,
2 shared experts, an fp32 router with a non-zero score-correction bias, tied embeddings, interleaved
RoPE, no q/k norm), written in the ModelOpt NVFP4 layout (weights quantized by nvidia-modelopt's
NVFP4QTensor; router and bias fp32, embeddings and norms BF16, as ModelOpt exports it), then nibble's
logits of every generated position against transformers' on the dequantized weights: within 1e-3
relative (fp32 with another summation order; the gap seen is ~1e-6), and identical greedy tokens.
The same against transformers' own BF16 save quantized by `nibble quantize` (weights read back with
ModelOpt's NVFP4QTensor), and the synth presets against transformers' layout. All three activation
modes: W4A4 against the reference with every quantized linear's input fake-quantized (docs/format.md),
as test_reference_vs_transformers.py does for Qwen3.

Top-k routing and quantization are discontinuous: a position whose k-th and (k+1)-th biased scores,
or one of whose quantized values, sit within FRAGILE_REL of a boundary may flip under fp32
reordering; positions from the first such one on are not compared (nor greedy tokens past it)."""
import json
import subprocess

import numpy as np
import pytest
import torch
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
from transformers import Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM
from transformers.models.ernie4_5_moe import modeling_ernie4_5_moe

import qwen3_reference

PROMPT = [5, 17, 300, 2, 99, 411, 7, 256, 81, 3, 150, 42]
N_GENERATED = 24
TOLERANCE = 1e-3
FRAGILE_REL = 3e-6
SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, moe_intermediate_size=32, moe_k=2, moe_num_experts=8, moe_num_shared_experts=2,
             moe_layer_start_index=1, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=True)


def make_model(seed: int):
    torch.manual_seed(seed)
    config = Ernie4_5_MoeConfig(**SHAPE)
    config.architectures = ["Ernie4_5_MoeForCausalLM"]
    model = Ernie4_5_MoeForCausalLM(config).float().eval()
    with torch.no_grad():
        # Scales chosen so logits are well separated and routing is decisive (as for Qwen3).
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)
            elif "e_score_correction_bias" in name:
                p.normal_(0.0, 0.05)  # large enough to change choices against the plain top-k
            else:
                p.normal_(0.0, 0.1)
            if "mlp.gate.weight" not in name and "e_score_correction_bias" not in name:
                p.copy_(p.to(torch.bfloat16).float())  # checkpoints hold BF16; router and bias stay fp32
    return model


def linear_modules(model):
    """(checkpoint module name, weight) of every projection ModelOpt quantizes, experts per expert."""
    out = []
    for l, layer in enumerate(model.model.layers):
        p = f"model.layers.{l}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out.append((p + "self_attn." + n, getattr(layer.self_attn, n).weight))
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            experts = mlp.experts
            inter = experts.gate_up_proj.shape[1] // 2
            for e in range(experts.gate_up_proj.shape[0]):
                x = f"{p}mlp.experts.{e}."
                out.append((x + "gate_proj", experts.gate_up_proj.data[e, :inter]))
                out.append((x + "up_proj", experts.gate_up_proj.data[e, inter:]))
                out.append((x + "down_proj", experts.down_proj.data[e]))
            for n in ("gate_proj", "up_proj", "down_proj"):
                out.append((p + "mlp.shared_experts." + n, getattr(mlp.shared_experts, n).weight))
        else:
            for n in ("gate_proj", "up_proj", "down_proj"):
                out.append((p + "mlp." + n, getattr(mlp, n).weight))
    return out


def build(seed: int, out_dir):
    """Writes the NVFP4 checkpoint; returns the fp32 model holding the dequantized weights and the
    static input scales (per fused input, and per MoE layer's gate_up and down, as nibble shares them)."""
    model = make_model(seed)
    qwen3_reference.tag_layers(model)
    linears = linear_modules(model)
    calib = torch.randint(0, SHAPE["vocab_size"], (4, 24), generator=torch.Generator().manual_seed(seed))
    tensors, input_scales = qwen3_reference.calibrate_and_quantize(
        model, linears, {n for n, _ in linears}, calib, experts_class=modeling_ernie4_5_moe.Ernie4_5_MoeExperts)
    for name, p in model.state_dict().items():
        if name.endswith("norm.weight") or "embed_tokens" in name:
            tensors[name] = p.to(torch.bfloat16).contiguous()
        elif name.endswith("mlp.gate.weight") or "e_score_correction_bias" in name:
            # In memory the bias sits in the router (mlp.gate.moe_statics); on disk, as save_pretrained
            # and the published checkpoints write it, it is mlp.moe_statics.e_score_correction_bias.
            tensors[name.replace("mlp.gate.moe_statics", "mlp.moe_statics")] = p.float().contiguous()
    qwen3_reference.write_checkpoint(out_dir, model, tensors, ["lm_head", "model.layers.*.mlp.gate"])
    model._nibble_dense = {n for n, _ in linears if ".experts." not in n}
    return model, qwen3_reference.static_scales(model, input_scales)


def reference_logits(model, ids, static=None, mode_moe="none", mode_dense="none"):
    """(logits [len(ids), vocab], positions whose top-k choice sits on a near-tie or whose activation
    quantization sits on a rounding boundary) of the reference in the given activation modes."""
    fragile = set()
    original = modeling_ernie4_5_moe.Ernie4_5_MoeTopKRouter.forward

    def forward(self, hidden_states):
        with torch.no_grad():
            probs = torch.softmax(torch.nn.functional.linear(hidden_states.float(), self.weight.float()), dim=-1)
            scores = (probs + self.moe_statics.e_score_correction_bias.squeeze()).sort(dim=-1, descending=True).values
            gap = scores[:, self.top_k - 1] - scores[:, self.top_k]
            fragile.update(torch.nonzero(gap <= FRAGILE_REL * scores[:, 0].abs()).flatten().tolist())
        return original(self, hidden_states)

    modeling_ernie4_5_moe.Ernie4_5_MoeTopKRouter.forward = forward
    qwen3_reference.tag_layers(model)
    quantizing = mode_moe != "none" or mode_dense != "none"
    try:
        with torch.no_grad(), \
                qwen3_reference.dense_hooks(model, model._nibble_dense if quantizing else set(), mode_dense, static, None,
                                            fragile), \
                qwen3_reference.patched_experts(mode_moe, static, None, fragile,
                                                experts_class=modeling_ernie4_5_moe.Ernie4_5_MoeExperts):
            return model(torch.tensor([ids])).logits[0].float(), fragile
    finally:
        modeling_ernie4_5_moe.Ernie4_5_MoeTopKRouter.forward = original


def compare(build_dir, model, static, ckpt, tmp_path, mode_moe="none", mode_dense="none"):
    """nibble's logits of its own greedy continuation against the reference on the same ids, up to the
    first fragile position; greedy tokens where the reference's margin is clear. Returns positions compared."""
    dump = tmp_path / f"logits_{mode_moe}_{mode_dense}.npy"
    proc = subprocess.run(
        [str(build_dir / "nibble"), "generate", "--model", str(ckpt), "--backend", "cpu",
         "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", str(N_GENERATED), "--ignore-eos",
         "--act-quant-moe", mode_moe, "--act-quant-dense", mode_dense, "--dump-logits", str(dump)],
        capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    tokens = [int(t) for t in proc.stdout.strip().strip("[]").split(",")]
    logits = torch.from_numpy(np.load(dump))
    ref, fragile = reference_logits(model, PROMPT + tokens[:-1], static, mode_moe, mode_dense)
    ref = ref[len(PROMPT) - 1:]
    first_fragile = min(fragile, default=len(PROMPT) + N_GENERATED) - (len(PROMPT) - 1)
    err = ((logits - ref).abs().amax(1) / ref.abs().amax(1))[:max(0, first_fragile)]
    print(f"{mode_moe}/{mode_dense}: {len(err)}/{len(tokens)} positions checked, max relative error "
          f"{err.max() if len(err) else 0:.2e}, fragile positions {sorted(fragile)}")
    for i, e in enumerate(err.tolist()):
        assert e <= TOLERANCE, f"position {len(PROMPT) - 1 + i}: relative error {e:.2e} > {TOLERANCE:.0e}"
    for i in range(min(len(tokens), max(0, first_fragile))):
        top2 = ref[i].topk(2).values
        if top2[0] - top2[1] > 1e-4 * top2[0].abs():
            assert tokens[i] == int(ref[i].argmax()), f"greedy token {i} differs"
    return len(err)


def test_cpu_reference_matches_transformers(build_dir, tmp_path, seed):
    model, static = build(seed, tmp_path / "ckpt")
    assert compare(build_dir, model, static, tmp_path / "ckpt", tmp_path) >= 8


@pytest.mark.parametrize("modes", [("static", "static"), ("per-token", "per-token"), ("per-token", "none")])
def test_w4a4_modes_match_fake_quant_reference(build_dir, tmp_path, seed, modes):
    """The W4A4 modes: every quantized linear's input fake-quantized in the reference as docs/format.md
    says (shared experts and the dense layer in the dense mode, routed experts in the MoE mode)."""
    # A value on a rounding boundary inside the prompt leaves nothing to compare. One seed in about
    # seven has one early enough to leave fewer than 8 positions (per-token, 30 seeds: 4), and CI met
    # three in a row once, so the next seed is tried, up to six; one of them must compare 8 positions.
    for attempt in range(6):
        ckpt = tmp_path / f"ckpt{attempt}"
        model, static = build(seed + attempt, ckpt)
        if compare(build_dir, model, static, ckpt, tmp_path, *modes) >= 8:
            return
    pytest.fail("six seeds in a row had a fragile value within the first positions")


def test_bias_changes_the_routing(tmp_path, seed):
    """The fixture's correction bias really chooses experts (else the test above would not see it)."""
    model = make_model(seed)
    changed = 0
    with torch.no_grad():
        h = torch.randn(64, SHAPE["hidden_size"])
        for layer in model.model.layers[1:]:
            gate = layer.mlp.gate
            probs = torch.softmax(h @ gate.weight.T, dim=-1)
            plain = probs.topk(SHAPE["moe_k"]).indices.sort().values
            biased = (probs + gate.moe_statics.e_score_correction_bias.squeeze()).topk(SHAPE["moe_k"]).indices.sort().values
            changed += int((plain != biased).any(dim=1).sum())
    assert changed > 0


def test_synth_preset_has_transformers_layout(build_dir, tmp_path):
    """`nibble synth --preset tiny-ernie` writes the tensors transformers' own save_pretrained writes for
    that config (NVFP4 linears as ModelOpt names them), the router and its bias in fp32, and runs."""
    from safetensors import safe_open
    out = tmp_path / "synth"
    subprocess.run([str(build_dir / "nibble"), "synth", "--preset", "tiny-ernie", "--out", str(out), "--seed", "4"],
                   check=True, capture_output=True)
    config = json.loads((out / "config.json").read_text())
    config.pop("quantization_config")
    hf_config = Ernie4_5_MoeConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    hf_dir = tmp_path / "hf"
    Ernie4_5_MoeForCausalLM(hf_config).save_pretrained(hf_dir)
    with safe_open(hf_dir / "model.safetensors", "pt") as f:
        expected = set(f.keys())
    synth = {}
    for shard in out.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            synth.update({k: f.get_tensor(k) for k in f.keys()})
    quantized = {k[: -len(".weight_scale")] for k in synth if k.endswith(".weight_scale")}
    plain = {k for k in synth if not any(k.startswith(q + ".") for q in quantized)}
    assert plain | {q + ".weight" for q in quantized} == expected
    assert "model.layers.1.mlp.shared_experts.down_proj" in quantized and "model.layers.0.mlp.gate_proj" in quantized
    assert synth["model.layers.1.mlp.gate.weight"].dtype == torch.float32
    assert synth["model.layers.1.mlp.moe_statics.e_score_correction_bias"].dtype == torch.float32
    assert synth["model.layers.1.mlp.moe_statics.e_score_correction_bias"].abs().max() > 0
    proc = subprocess.run([str(build_dir / "nibble"), "generate", "--model", str(out), "--backend", "cpu",
                           "--prompt-ids", "5,17,300", "--max-tokens", "4", "--ignore-eos"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().strip("[]").split(",")) == 4


def load_nvfp4_into(model, ckpt_dir):
    """Writes the dequantized weights of an NVFP4 checkpoint (and its unquantized tensors) into the
    transformers model, experts fused as transformers holds them in memory."""
    from safetensors import safe_open
    tensors = {}
    for shard in ckpt_dir.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys()})

    def weight(stem):
        if stem + ".weight_scale" not in tensors:
            return tensors[stem + ".weight"].float()
        packed = tensors[stem + ".weight"]
        q = NVFP4QTensor(torch.Size((packed.shape[0], packed.shape[1] * 2)), torch.float32, packed)
        return q.dequantize(dtype=torch.float32, scale=tensors[stem + ".weight_scale"],
                            double_scale=tensors[stem + ".weight_scale_2"], block_sizes={-1: 16})

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj"):
                stem = name[: -len("gate_up_proj")]
                for e in range(p.shape[0]):
                    p[e].copy_(torch.cat([weight(f"{stem}{e}.gate_proj"), weight(f"{stem}{e}.up_proj")]))
            elif name.endswith("experts.down_proj"):
                stem = name[: -len("down_proj")]
                for e in range(p.shape[0]):
                    p[e].copy_(weight(f"{stem}{e}.down_proj"))
            elif "e_score_correction_bias" in name:
                p.copy_(tensors[name.replace("mlp.gate.moe_statics", "mlp.moe_statics")].float())
            else:
                p.copy_(weight(name[: -len(".weight")]))


def test_nibble_quantize_of_a_bf16_checkpoint(build_dir, tmp_path, seed):
    """transformers' own BF16 save (router and bias in BF16 there) → `nibble quantize` → nibble's
    forward against transformers holding the dequantized weights (read back with ModelOpt's
    NVFP4QTensor), as in the test above."""
    model = make_model(seed).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    out = tmp_path / "nvfp4"
    proc = subprocess.run([str(build_dir / "nibble"), "quantize", "--in", str(tmp_path / "bf16"), "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    quant = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert any("mlp.gate" in p for p in quant["exclude_modules"])  # the router stays unquantized
    model = make_model(seed)  # fresh in fp32: .to(bfloat16) also rounded the RoPE frequency buffer
    load_nvfp4_into(model, out)
    dump = tmp_path / "logits.npy"
    proc = subprocess.run(
        [str(build_dir / "nibble"), "generate", "--model", str(out), "--backend", "cpu",
         "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", str(N_GENERATED), "--ignore-eos",
         "--dump-logits", str(dump)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    tokens = [int(t) for t in proc.stdout.strip().strip("[]").split(",")]
    ref, fragile = reference_logits(model, PROMPT + tokens[:-1])
    ref = ref[len(PROMPT) - 1:]
    first_fragile = min(fragile, default=len(PROMPT) + N_GENERATED) - (len(PROMPT) - 1)
    err = ((torch.from_numpy(np.load(dump)) - ref).abs().amax(1) / ref.abs().amax(1))[:max(0, first_fragile)]
    print(f"{len(err)} positions checked, max relative error {err.max() if len(err) else 0:.2e}")
    assert len(err) >= 8 or fragile
    assert (err <= TOLERANCE).all(), err


def test_chunked_prefill_gives_the_same_logits(build_dir, tmp_path, seed):
    """The paged KV cache with interleaved RoPE: a prompt prefilled in chunks of 5 gives exactly the
    logits and tokens of one prefill (same math per token, in the same order)."""
    build(seed, tmp_path / "ckpt")
    runs = []
    for chunk in (0, 5):
        dump = tmp_path / f"logits_{chunk}.npy"
        proc = subprocess.run(
            [str(build_dir / "nibble"), "generate", "--model", str(tmp_path / "ckpt"), "--backend", "cpu",
             "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", "8", "--ignore-eos",
             "--prefill-chunk", str(chunk), "--dump-logits", str(dump)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        runs.append((proc.stdout.strip(), np.load(dump)))
    assert runs[0][0] == runs[1][0]
    assert np.array_equal(runs[0][1], runs[1][1])
