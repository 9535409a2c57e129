"""nibble's CPU reference forward against Hugging Face transformers (fp32, CPU) on tiny random
Qwen3-MoE / Qwen3 models in several shapes: logits of every generated position within 1e-3 relative
(fp32 with a different summation order; the gap seen is ~1e-6) and identical 32-token greedy
continuations. W4A4 modes (static, per-token) against the same model with fake-quantized inputs.

Quantization and top-k routing are discontinuous: a ~1e-6 reordering difference can flip a value
that sits on a rounding boundary or a near-tied router choice, and the flip reaches every later
position through attention. The reference marks such 'fragile' tokens (qwen3_reference.FRAGILE_REL);
positions from the first fragile token on are not compared (a few runs in ten have one)."""
import json
import os
import random
import subprocess

import numpy as np
import pytest
import torch

import qwen3_reference

SHAPES = {
    # GQA 2, head_dim 64, 8 experts top-2
    "moe_gqa2_d64_e8_k2": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                               intermediate_size=96, norm_topk_prob=True),
    # GQA 8, head_dim 128, 64 experts top-8
    "moe_gqa8_d128_e64_k8": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=1,
                                 head_dim=128, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=32,
                                 intermediate_size=96, norm_topk_prob=True),
    # MHA, top-1 without renormalization, a dense MLP layer between MoE layers
    "moe_mha_e16_k1_dense_layer": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                       num_key_value_heads=4, head_dim=64, num_experts=16, num_experts_per_tok=1,
                                       moe_intermediate_size=48, intermediate_size=96, norm_topk_prob=False,
                                       mlp_only_layers=[1]),
    # Qwen3 dense through the same code
    "dense_gqa2": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=64, intermediate_size=128),
}
PROMPT = [5, 17, 300, 2, 99, 411, 7, 256, 81, 3, 150, 42]
N_GENERATED = 32
TOLERANCE = 1e-3


def nibble_generate(build_dir, model_dir, tmp_path, mode_moe="none", mode_dense="none", chunk=0, extra=()):
    dump = tmp_path / f"logits_{mode_moe}_{mode_dense}_{chunk}.npy"
    proc = subprocess.run(
        [str(build_dir / "nibble"), "generate", "--model", str(model_dir),
         "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", str(N_GENERATED), "--ignore-eos",
         "--act-quant-moe", mode_moe, "--act-quant-dense", mode_dense, "--dump-logits", str(dump),
         "--prefill-chunk", str(chunk), *extra],
        capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    tokens = [int(t) for t in proc.stdout.strip().strip("[]").split(",")]
    return tokens, torch.from_numpy(np.load(dump))


def relative_errors(ours: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (ours - ref).abs().amax(1) / ref.abs().amax(1)


def check_logits(model, scales, tokens, logits, mode_moe, mode_dense):
    """Compares nibble's logits of the generated positions with the reference on the same ids."""
    ref, fragile = qwen3_reference.reference_logits(model, scales, PROMPT + tokens[:-1], mode_moe, mode_dense)
    ref = ref[len(PROMPT) - 1:]
    err = relative_errors(logits, ref)
    first_fragile = min(fragile, default=len(PROMPT) + N_GENERATED)
    checked = err[: max(0, first_fragile - (len(PROMPT) - 1))]
    print(f"{mode_moe}/{mode_dense}: {len(checked)}/{len(err)} positions checked, max relative error "
          f"{checked.max() if len(checked) else 0:.2e}, fragile tokens {sorted(fragile)}")
    for i, e in enumerate(checked.tolist()):
        assert e <= TOLERANCE, f"position {len(PROMPT) - 1 + i}: relative error {e:.2e} > {TOLERANCE:.0e}"
    return ref


def greedy_reference(model, scales, mode_moe, mode_dense):
    """Greedy continuation, or None where a near-tie makes greedy decoding itself fragile."""
    ids = list(PROMPT)
    for _ in range(N_GENERATED):
        logits, fragile = qwen3_reference.reference_logits(model, scales, ids, mode_moe, mode_dense)
        top2 = logits[-1].topk(2).values
        if fragile or (top2[0] - top2[1]) <= 1e-4 * top2[0].abs():
            return None
        ids.append(int(logits[-1].argmax()))
    return ids[len(PROMPT):]


@pytest.fixture(scope="module", params=list(SHAPES))
def reference(request, tmp_path_factory):
    name = request.param
    out = tmp_path_factory.mktemp(name)
    seed = random.SystemRandom().randrange(2**31) if "NIBBLE_TEST_SEED" not in os.environ \
        else int(os.environ["NIBBLE_TEST_SEED"])
    print(f"[seed] {name}: NIBBLE_TEST_SEED={seed}")
    model, scales = qwen3_reference.build(SHAPES[name], seed=seed, out_dir=out)
    return model, scales, out


def test_mode_none_matches_transformers(build_dir, reference, tmp_path):
    model, scales, ckpt = reference
    tokens, logits = nibble_generate(build_dir, ckpt, tmp_path)
    ref_tokens = greedy_reference(model, scales, "none", "none")
    if ref_tokens is None:
        print("greedy comparison skipped: a near-tie in the reference continuation")
    else:
        assert tokens == ref_tokens, "greedy continuation differs"
    check_logits(model, scales, tokens, logits, "none", "none")


@pytest.mark.parametrize("modes", [("static", "static"), ("per-token", "per-token"), ("per-token", "none")])
def test_w4a4_modes_match_fake_quant_reference(build_dir, reference, tmp_path, modes):
    model, scales, ckpt = reference
    mode_moe, mode_dense = modes
    tokens, logits = nibble_generate(build_dir, ckpt, tmp_path, mode_moe, mode_dense)
    ref = check_logits(model, scales, tokens, logits, mode_moe, mode_dense)
    assert tokens == logits.argmax(1).tolist()  # greedy: each token is the argmax of its logits



def test_chunked_prefill_gives_the_same_logits(build_dir, reference, tmp_path):
    _, _, ckpt = reference
    tokens, logits = nibble_generate(build_dir, ckpt, tmp_path)
    chunked_tokens, chunked_logits = nibble_generate(build_dir, ckpt, tmp_path, chunk=5)
    assert chunked_tokens == tokens
    assert torch.equal(chunked_logits, logits)


# RoPE scaling at positions past the pretraining context (original_max_position_embeddings 32; the
# prompt and its continuation reach 44): YaRN from the checkpoint's config, linear from --rope-scaling
# over a config without it (the flag's path). rope_theta 1e4 puts YaRN's ramp over pairs 0..6.
ROPE_SCALINGS = {
    "yarn_in_config": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                        "rope_theta": 1e4}, False),
    "yarn_mscale": ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
                     "rope_theta": 1e4, "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16}, False),
    "linear_by_flag": ({"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}, True),
}


@pytest.mark.parametrize("name", list(ROPE_SCALINGS))
def test_rope_scaling_matches_transformers(build_dir, tmp_path, seed, name):
    rope, by_flag = ROPE_SCALINGS[name]
    shape = dict(SHAPES["moe_gqa2_d64_e8_k2"], rope_parameters=dict(rope))
    model, scales = qwen3_reference.build(shape, seed=seed, out_dir=tmp_path / "ckpt")
    config_path = tmp_path / "ckpt" / "config.json"
    config = json.loads(config_path.read_text())
    extra = ()
    if by_flag:  # the checkpoint says default RoPE; the flag brings the scaling
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": rope["rope_theta"]}
        config_path.write_text(json.dumps(config))
        extra = ("--rope-scaling", json.dumps({k: v for k, v in rope.items() if k != "rope_theta"}))
    else:
        assert config["rope_parameters"]["rope_type"] == rope["rope_type"], config
    tokens, logits = nibble_generate(build_dir, tmp_path / "ckpt", tmp_path, extra=extra)
    check_logits(model, scales, tokens, logits, "none", "none")
    # The scaling matters at these positions: the same checkpoint with default RoPE gives other logits.
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": rope["rope_theta"]}
    config_path.write_text(json.dumps(config))
    _, plain_logits = nibble_generate(build_dir, tmp_path / "ckpt", tmp_path)
    assert relative_errors(plain_logits, logits).max() > 10 * TOLERANCE


def test_attention_in_bf16(build_dir, tmp_path, seed):
    shape = SHAPES["moe_gqa2_d64_e8_k2"]
    model, scales = qwen3_reference.build(shape, seed=seed, out_dir=tmp_path / "ckpt", quantize_attention=False)
    tokens, logits = nibble_generate(build_dir, tmp_path / "ckpt", tmp_path, "static", "static")
    check_logits(model, scales, tokens, logits, "static", "static")
