"""`nibble quantize` against nvidia-modelopt: the same tiny BF16 Qwen3-MoE quantized by ModelOpt's
own pipeline (max calibration + export_hf_checkpoint) and by nibble, from the same calibration
token ids. Every weight, weight_scale and weight_scale_2 bit for bit; input_scales as ModelOpt's max
calibration computes them, up to activation precision (ModelOpt runs the model in BF16, nibble's
calibration in fp32: amax values differ by BF16 rounding and its propagation; 0.6% seen, 2% allowed)."""
import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

from test_checkpoints import REPO, nibble


def load(folder):
    with safe_open(folder / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.fixture(scope="module")
def exported(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("quantize")
    seed = 3
    subprocess.run([sys.executable, str(REPO / "tests/python/fixtures/modelopt_export.py"), str(root / "modelopt"),
                    "--seed", str(seed), "--bf16-dir", str(root / "bf16"), "--calib-ids-out", str(root / "ids.json")],
                   check=True, capture_output=True)
    return root


def test_quantize_reproduces_modelopt(build_dir, exported):
    out = exported / "nibble"
    nibble(build_dir, "quantize", "--in", exported / "bf16", "--out", out, "--calib-ids", exported / "ids.json")
    theirs, ours = load(exported / "modelopt"), load(out)
    assert set(ours) == set(theirs)
    n_bitexact = 0
    for name, t in theirs.items():
        o = ours[name]
        assert o.dtype == t.dtype and o.shape == t.shape, name
        if name.endswith("input_scale"):
            rel = abs(o.item() - t.item()) / t.item()
            assert rel < 0.02, f"{name}: nibble {o.item():.6g} vs modelopt {t.item():.6g}"
            continue
        assert torch.equal(o.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), f"{name} differs"
        n_bitexact += 1
    assert n_bitexact > 100
    mine = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    ref = json.loads((exported / "modelopt" / "hf_quant_config.json").read_text())["quantization"]
    assert sorted(mine["exclude_modules"]) == sorted(ref["exclude_modules"])
    assert mine["quant_algo"] == ref["quant_algo"] and mine["group_size"] == ref["group_size"]
    report = json.loads(nibble(build_dir, "inspect", out, "--json").stdout)
    assert report["problems"] == []


def test_quantize_errors(build_dir, exported, tmp_path):
    proc = nibble(build_dir, "quantize", "--in", exported / "modelopt", "--out", tmp_path / "x", check=False)
    assert proc.returncode == 1 and "already quantized" in proc.stderr
    bad = tmp_path / "ids.json"
    bad.write_text("[[1, 2, 99999]]")
    proc = nibble(build_dir, "quantize", "--in", exported / "bf16", "--out", tmp_path / "y", "--calib-ids", bad,
                  check=False)
    assert proc.returncode == 1 and "token id 99999" in proc.stderr


def test_quantize_calibrates_on_text(build_dir, exported, tmp_path):
    bf16 = tmp_path / "bf16"
    shutil.copytree(exported / "bf16", bf16)
    text = tmp_path / "calib.txt"
    text.write_text("a b c d e f\n\n" * 50)  # single letters are ids < 512, inside the tiny model's vocab
    proc = nibble(build_dir, "quantize", "--in", bf16, "--out", tmp_path / "q", "--calib", text, check=False)
    assert proc.returncode == 1 and "--calib needs the model's tokenizer" in proc.stderr
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(REPO / "data/qwen3-tokenizer" / name, bf16 / name)
    out = nibble(build_dir, "quantize", "--in", bf16, "--out", tmp_path / "q", "--calib", text).stdout
    assert f"of {text}" in out
    assert json.loads(nibble(build_dir, "inspect", tmp_path / "q", "--json").stdout)["problems"] == []
    assert (tmp_path / "q" / "tokenizer.json").exists()
    out = nibble(build_dir, "quantize", "--in", bf16, "--out", tmp_path / "q2").stdout
    assert "of built-in text" in out
