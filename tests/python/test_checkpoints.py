"""Checkpoints end to end: `nibble synth` writes what Hugging Face tooling and nvidia-modelopt read
as a ModelOpt NVFP4 checkpoint; `nibble inspect` reads synth output and a checkpoint exported by
nvidia-modelopt itself; broken folders are reported, not crashed on."""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

REPO = pathlib.Path(__file__).resolve().parents[2]


def nibble(build_dir, *args, check=True):
    proc = subprocess.run([str(build_dir / "nibble"), *map(str, args)], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"nibble {' '.join(map(str, args))} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def load_all(folder: pathlib.Path) -> dict:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(folder / shard, "pt") as f:
            for name in f.keys():
                assert index["weight_map"][name] == shard
                tensors[name] = f.get_tensor(name)
    return tensors


@pytest.fixture(scope="module")
def tiny(build_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "tiny"
    nibble(build_dir, "synth", "--preset", "tiny-moe", "--out", out, "--seed", "7")
    return out


def test_synth_layout_is_modelopt_nvfp4(tiny):
    tensors = load_all(tiny)
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(tiny)
    assert config.architectures == ["Qwen3MoeForCausalLM"]
    hf_quant = json.loads((tiny / "hf_quant_config.json").read_text())["quantization"]
    assert hf_quant["quant_algo"] == "NVFP4" and hf_quant["group_size"] == 16
    embedded = json.loads((tiny / "config.json").read_text())["quantization_config"]
    assert embedded["quant_method"] == "modelopt" and embedded["ignore"] == hf_quant["exclude_modules"]
    assert "model.layers.0.mlp.gate" in hf_quant["exclude_modules"]

    p = "model.layers.1.mlp.experts.3."
    assert tensors[p + "up_proj.weight"].dtype == torch.uint8
    assert tensors[p + "up_proj.weight"].shape == (32, 16)
    assert tensors[p + "up_proj.weight_scale"].dtype == torch.float8_e4m3fn
    assert tensors[p + "up_proj.weight_scale"].shape == (32, 2)
    assert tensors[p + "up_proj.weight_scale_2"].shape == ()
    assert tensors[p + "up_proj.input_scale"].dtype == torch.float32
    # ModelOpt's export fuses gate/up and q/k/v: one weight_scale_2 and one input_scale each.
    assert tensors[p + "gate_proj.weight_scale_2"] == tensors[p + "up_proj.weight_scale_2"]
    assert tensors[p + "gate_proj.input_scale"] == tensors[p + "up_proj.input_scale"]
    a = "model.layers.0.self_attn."
    assert tensors[a + "q_proj.weight_scale_2"] == tensors[a + "v_proj.weight_scale_2"]
    assert tensors["model.layers.0.mlp.gate.weight"].dtype == torch.bfloat16
    assert "lm_head.weight" not in tensors  # tied embeddings in the tiny preset
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tiny / name).read_bytes() == (REPO / "data/qwen3-tokenizer" / name).read_bytes()
    gen = json.loads((tiny / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643]


def test_synth_weights_dequantize_to_the_intended_distribution(tiny):
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    tensors = load_all(tiny)
    values = []
    for name, t in tensors.items():
        if name.endswith(".weight_scale"):
            stem = name[: -len(".weight_scale")]
            packed = tensors[stem + ".weight"]
            q = NVFP4QTensor(torch.Size((packed.shape[0], packed.shape[1] * 2)), torch.float32, packed)
            values.append(q.dequantize(dtype=torch.float32, scale=t, double_scale=tensors[stem + ".weight_scale_2"],
                                       block_sizes={-1: 16}).flatten())
    w = torch.cat(values)
    # normal(0, 0.02) before quantization; E2M1 rounding keeps the spread within ~10%.
    assert abs(w.mean().item()) < 2e-3
    assert 0.017 < w.std().item() < 0.023, w.std().item()
    norms = torch.cat([t.float() for n, t in tensors.items() if n.endswith("norm.weight")])
    assert abs(norms.mean().item() - 1.0) < 0.02
    # Router rows have varied scales, so routing is uneven.
    router_row_std = tensors["model.layers.0.mlp.gate.weight"].float().std(dim=1)
    assert router_row_std.max() / router_row_std.min() > 1.3
    scales = torch.stack([t for n, t in tensors.items() if n.endswith("input_scale")])
    assert (scales > 0).all() and scales.unique().numel() > 4


def test_synth_is_deterministic(build_dir, tiny, tmp_path):
    again, other = tmp_path / "again", tmp_path / "other"
    nibble(build_dir, "synth", "--preset", "tiny-moe", "--out", again, "--seed", "7")
    nibble(build_dir, "synth", "--preset", "tiny-moe", "--out", other, "--seed", "8")
    shard = "model-00001-of-00002.safetensors"
    assert (again / shard).read_bytes() == (tiny / shard).read_bytes()
    assert (other / shard).read_bytes() != (tiny / shard).read_bytes()
    # The AVX2 generator and the portable one write the same bytes.
    portable = tmp_path / "portable"
    subprocess.run([str(build_dir / "nibble"), "synth", "--preset", "tiny-moe", "--out", str(portable), "--seed", "7"],
                   check=True, capture_output=True, env=dict(os.environ, NIBBLE_DIAG_NO_AVX2="1"))
    for shard_file in sorted(tiny.glob("*.safetensors")):
        assert (portable / shard_file.name).read_bytes() == shard_file.read_bytes(), shard_file.name


def test_synth_planted_maximum_makes_the_shared_scale_modelopt_exact(tiny):
    # weight_scale_2 = amax / (6 · 448) over the group, with the amax of the weights themselves:
    # the largest dequantized magnitude of a group reaches 6 · 448 · weight_scale_2 (block scale 448, code ±6).
    tensors = load_all(tiny)
    stem = "model.layers.0.mlp.experts.0.gate_proj"
    scale_2 = tensors[stem + ".weight_scale_2"].item()
    block_scales = tensors[stem + ".weight_scale"].float()
    assert block_scales.max().item() == 448.0
    assert 0.07 < scale_2 * 2688 < 0.074  # 0.02 × the generator's 3.67σ maximum


def test_inspect_json_on_synth(build_dir, tiny):
    report = json.loads(nibble(build_dir, "inspect", tiny, "--json").stdout)
    assert report["problems"] == []
    assert report["architecture"] == "Qwen3MoeForCausalLM"
    assert report["files"] == 2
    experts = report["modules"]["model.layers.*.mlp.experts.*.up_proj"]
    assert experts["count"] == 16 and experts["formats"] == {"NVFP4": 16}
    assert report["modules"]["model.layers.*.mlp.gate"]["formats"] == {"BF16": 2}
    tensors = load_all(tiny)
    assert report["parameters"] == sum(
        t.numel() * (2 if t.dtype == torch.uint8 else 1) for n, t in tensors.items()
        if n.endswith(".weight") and t.dim() > 0)


def test_synth_options_and_bad_values(build_dir, tmp_path):
    out = tmp_path / "m"
    nibble(build_dir, "synth", "--preset", "tiny-moe", "--out", out, "--layers", "3", "--experts", "4",
           "--quantize-attention", "no")
    report = json.loads(nibble(build_dir, "inspect", out, "--json").stdout)
    assert report["shape"]["layers"] == 3 and report["shape"]["experts"] == 4
    assert report["modules"]["model.layers.*.self_attn.q_proj"]["formats"] == {"BF16": 3}
    assert report["problems"] == []
    bad = nibble(build_dir, "synth", "--preset", "nope", "--out", out, check=False)
    assert bad.returncode != 0 and "nope" in bad.stderr


@pytest.fixture(scope="module")
def modelopt_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("modelopt") / "export"
    script = REPO / "tests/python/fixtures/modelopt_export.py"
    subprocess.run([sys.executable, str(script), str(out), "--seed", "1"], check=True, capture_output=True)
    return out


def test_inspect_loads_a_real_modelopt_export(build_dir, modelopt_export):
    report = json.loads(nibble(build_dir, "inspect", modelopt_export, "--json").stdout)
    assert report["problems"] == [], report["problems"]
    assert report["quantization"]["producer"].startswith("modelopt")
    assert report["modules"]["model.layers.*.mlp.experts.*.down_proj"]["formats"] == {"NVFP4": 16}
    assert report["modules"]["lm_head"]["formats"] == {"BF16": 1}


def test_broken_folders_are_reported(build_dir, tiny, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny, broken)
    shard = broken / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    proc = nibble(build_dir, "inspect", broken, check=False)
    assert proc.returncode == 1
    assert "model-00002-of-00002.safetensors" in proc.stdout and "truncated" in proc.stdout

    (broken / "config.json").write_text("{oops")
    proc = nibble(build_dir, "inspect", broken, check=False)
    assert proc.returncode == 1 and "config.json: not a JSON object" in proc.stdout
    proc = nibble(build_dir, "inspect", tmp_path / "does-not-exist", check=False)
    assert proc.returncode == 1 and "cannot open" in proc.stdout


def test_generate_with_an_fp8_kv_cache(build_dir, tiny, tmp_path):
    # --kv-cache-dtype fp8 on the CPU reference: the cache rounds K and V to E4M3, which moves the
    # logits a little (3 significant bits against BF16's 8: ~2% of max|logit| on this tiny model,
    # ~0.1% for a BF16 cache), never identically and never far; an unknown dtype is refused.
    import numpy as np
    logits = {}
    for kv in ("auto", "bf16", "fp8"):
        out = tmp_path / f"{kv}.npy"
        nibble(build_dir, "generate", "--model", tiny, "--prompt-ids", "1,2,3,4,5,6,7,8,9,10", "--max-tokens", "6",
               "--ignore-eos", "--backend", "cpu", "--kv-cache-dtype", kv, "--dump-logits", out)
        logits[kv] = np.load(out)
    scale = np.abs(logits["auto"]).max()
    fp8 = np.abs(logits["fp8"] - logits["auto"]).max() / scale
    bf16 = np.abs(logits["bf16"] - logits["auto"]).max() / scale
    assert 0 < bf16 < fp8 < 0.1, (bf16, fp8)
    proc = nibble(build_dir, "generate", "--model", tiny, "--prompt-ids", "1,2", "--kv-cache-dtype", "fp4", check=False)
    assert proc.returncode != 0 and "--kv-cache-dtype" in proc.stderr


def test_fp8_kv_cache_scales_from_a_modelopt_checkpoint(build_dir, tmp_path):
    # kv_cache_quant_algo FP8 with each layer's k_proj.k_scale / v_proj.v_scale (ModelOpt's export):
    # loads, inspect says so, and --kv-cache-dtype fp8 runs with the scales (auto keeps the usual cache).
    ckpt = tmp_path / "kvfp8"
    nibble(build_dir, "synth", "--preset", "tiny-moe", "--out", ckpt, "--seed", "4", "--kv-cache-fp8")
    assert json.loads((ckpt / "hf_quant_config.json").read_text())["quantization"]["kv_cache_quant_algo"] == "FP8"
    assert "FP8 KV-cache scales" in nibble(build_dir, "inspect", ckpt).stdout
    fp8 = nibble(build_dir, "generate", "--model", ckpt, "--prompt-ids", "1,2,3", "--max-tokens", "3", "--backend", "cpu",
                 "--kv-cache-dtype", "fp8")
    assert "calibrated k_scale / v_scale" in fp8.stderr and "fp8 KV" in fp8.stderr
    auto = nibble(build_dir, "generate", "--model", ckpt, "--prompt-ids", "1,2,3", "--max-tokens", "3", "--backend", "cpu")
    assert "used with --kv-cache-dtype fp8" in auto.stderr and "fp32 KV" in auto.stderr


def test_generate_with_text_prompt(build_dir, tiny):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    ids = tok.encode("Hello, world", add_special_tokens=False).ids
    as_ids = nibble(build_dir, "generate", "--model", tiny, "--prompt-ids", ",".join(map(str, ids)),
                    "--max-tokens", "6", "--ignore-eos").stdout
    generated = json.loads(as_ids)
    as_text = nibble(build_dir, "generate", "--model", tiny, "--prompt", "Hello, world", "--max-tokens", "6",
                     "--ignore-eos").stdout
    assert as_text == tok.decode(generated, skip_special_tokens=True) + "\n"
    proc = nibble(build_dir, "generate", "--model", tiny, check=False)
    assert proc.returncode == 1 and "give --prompt TEXT or --prompt-ids" in proc.stderr
