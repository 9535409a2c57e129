"""NVFP4 activation quantization (static and per-token): nibble's host quantizer bit-exact against
an independent torch implementation of the Blackwell formula (docs/format.md, TensorRT-LLM
cvt_warp_fp16_to_fp4 with exact reciprocals)."""
import pytest
import torch

import nvfp4_ref
import nvfp4_tool

def reference(x: torch.Tensor, global_per_row: torch.Tensor):
    codes, sf = nvfp4_ref.quantize(x, global_per_row)
    packed = (codes[:, 1::2] << 4) | codes[:, 0::2]
    return packed, sf.view(torch.uint8)


def make_activations(kind: str, rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, cols, generator=gen)
    if kind == "outliers":
        x[:, torch.randint(0, cols, (3,), generator=gen)] *= 40.0  # outlier channels, as in LLMs
    elif kind == "mixed_rows":
        x *= torch.logspace(-4, 3, rows).unsqueeze(1)  # rows from tiny to huge
        x[rows // 2] = 0.0
    elif kind == "bf16":
        x = x.to(torch.bfloat16).float()
    return x


SHAPES = [(1, 16), (7, 2048), (64, 768), (129, 4096)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["normal", "outliers", "mixed_rows", "bf16"])
def test_per_token_bit_exact(build_dir, seed, shape, kind):
    x = make_activations(kind, *shape, torch.Generator().manual_seed(seed))
    token_scale, g = nvfp4_ref.per_token_scales(x)
    packed, sf = reference(x, g)
    ours = nvfp4_tool.run(build_dir, "per-token", x)
    assert torch.equal(ours["row_scales"], token_scale)
    assert torch.equal(ours["block_scales"], sf), "E4M3 block scales differ"
    assert torch.equal(ours["packed"], packed), f"{(ours['packed'] != packed).sum()} bytes differ"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["normal", "outliers", "mixed_rows", "bf16"])
@pytest.mark.parametrize("calibration", [0.25, 1.0, 8.0])  # calibrated amax vs the data's amax
def test_static_bit_exact(build_dir, seed, shape, kind, calibration):
    x = make_activations(kind, *shape, torch.Generator().manual_seed(seed))
    input_scale = (x.abs().max().clamp_min(1e-3) * calibration / 2688.0).item()
    input_scale = torch.tensor(input_scale, dtype=torch.float32)
    g = (torch.tensor(1.0) / input_scale).expand(shape[0])
    packed, sf = reference(x, g)
    ours = nvfp4_tool.run(build_dir, "static", x, scale=input_scale.item())
    assert ours["scale"].item() == input_scale.item()
    assert torch.equal(ours["block_scales"], sf), "E4M3 block scales differ"
    assert torch.equal(ours["packed"], packed), f"{(ours['packed'] != packed).sum()} bytes differ"
    # Dequantized value = e2m1 · (e4m3 · input_scale); saturated where data exceeds calibration.
    e2m1 = nvfp4_ref.E2M1_VALUES
    codes = torch.stack([ours["packed"] & 0xF, ours["packed"] >> 4], -1).view(shape).long()
    sf_f = ours["block_scales"].view(torch.float8_e4m3fn).float().repeat_interleave(16, 1)
    assert torch.equal(ours["dequant"], e2m1[codes] * (sf_f * input_scale))
    fake = nvfp4_ref.fake_quantize(x, "static", input_scale)
    assert torch.allclose(ours["dequant"], fake, rtol=1e-6, atol=0)  # same values, other rounding order
