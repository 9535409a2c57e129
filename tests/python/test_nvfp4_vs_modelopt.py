"""NVFP4 weight quantization: nibble's host quantizer bit-exact against nvidia-modelopt's
NVFP4QTensor (CPU torch) on random tensors of several shapes and distributions."""
import pytest
import torch
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

import nvfp4_tool

SHAPES = [(16, 16), (3, 64), (128, 2048), (768, 128), (257, 96)]


def make_weight(kind: str, shape, gen: torch.Generator) -> torch.Tensor:
    rows, cols = shape
    w = torch.randn(rows, cols, generator=gen) * 0.02
    if kind == "heavy_tailed":
        # Student-t-like tails plus a few large outliers, as real weight matrices have.
        w = torch.randn(rows, cols, generator=gen) / torch.rand(rows, cols, generator=gen).clamp_min(0.02)
        idx = torch.randint(0, rows * cols, (max(1, rows * cols // 500),), generator=gen)
        w.view(-1)[idx] *= 50.0
    elif kind == "tiny":
        # One large value makes weight_scale_2 big, so the other blocks get subnormal E4M3 scales
        # (and some fall below 2^-9, exercising the clamp).
        w = torch.randn(rows, cols, generator=gen) * 1e-5
        w[0, 0] = 3.0
    elif kind == "zero_blocks":
        w.view(rows, cols // 16, 16)[torch.rand(rows, cols // 16, generator=gen) < 0.3] = 0.0
        w[0, :16] = 0.0
        w[-1, -16:] = -0.0  # ModelOpt's sign rule makes -0.0 code 0, not 8
    return w


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["normal", "heavy_tailed", "tiny", "zero_blocks"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_quantization_bit_exact(build_dir, seed, shape, kind, dtype):
    gen = torch.Generator().manual_seed(seed)
    w = make_weight(kind, shape, gen).to(dtype)
    qtensor, block_scale, scale_2 = NVFP4QTensor.quantize(w.clone(), 16)
    ours = nvfp4_tool.run(build_dir, "weight", w.float())

    assert ours["scale"].item() == scale_2.float().item()
    assert torch.equal(ours["block_scales"], block_scale.view(torch.uint8)), "E4M3 block scales differ"
    theirs = qtensor._quantized_data
    mismatch = (ours["packed"] != theirs).nonzero()
    assert mismatch.numel() == 0, f"{len(mismatch)} packed bytes differ, first at {mismatch[0].tolist()}"

    deq = qtensor.dequantize(dtype=torch.float32, scale=block_scale, double_scale=scale_2,
                             block_sizes={-1: 16})
    assert torch.equal(ours["dequant"], deq), "dequantized values differ"


def test_shared_weight_scale_2(build_dir, seed):
    """gate and up (or q, k, v) quantized with one shared weight_scale_2, as ModelOpt's export does."""
    gen = torch.Generator().manual_seed(seed)
    gate = torch.randn(64, 128, generator=gen) * 0.02
    up = torch.randn(64, 128, generator=gen) * 0.05
    shared = torch.maximum(NVFP4QTensor.get_weights_scaling_factor_2(gate),
                           NVFP4QTensor.get_weights_scaling_factor_2(up))
    q, bs, _ = NVFP4QTensor.quantize(gate.clone(), 16, weights_scaling_factor_2=shared)
    ours = nvfp4_tool.run(build_dir, "weight", gate, scale=shared.item())
    assert ours["scale"].item() == shared.item()
    assert torch.equal(ours["block_scales"], bs.view(torch.uint8))
    assert torch.equal(ours["packed"], q._quantized_data)


def test_errors_name_the_problem(build_dir):
    x = torch.ones(2, 32)
    x[1, 7] = float("nan")
    with pytest.raises(RuntimeError, match=r"non-finite value nan at \[1, 7\]"):
        nvfp4_tool.run(build_dir, "weight", x)
    with pytest.raises(RuntimeError, match="not a multiple of the NVFP4 block size"):
        nvfp4_tool.run(build_dir, "weight", torch.ones(2, 24))
