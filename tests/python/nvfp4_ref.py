"""Torch reference of NVFP4 activation quantization as Blackwell kernels do it (docs/format.md,
TensorRT-LLM cvt_warp_fp16_to_fp4) with exact reciprocals, written independently of nibble."""
import torch

E2M1_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
ODD_MIDPOINTS = torch.tensor([0.75, 1.75, 3.5])  # ties here round up to the even code
E2M1_VALUES = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


def e2m1_rne(v: torch.Tensor) -> torch.Tensor:
    """Round to E2M1 codes, ties to even, saturating, keeping the sign bit (also of -0.0)."""
    sign = torch.signbit(v).to(torch.uint8)
    a = v.abs()
    code = torch.searchsorted(E2M1_MIDPOINTS, a.contiguous()).to(torch.uint8)
    code += (a.unsqueeze(-1) == ODD_MIDPOINTS).any(-1).to(torch.uint8)
    return (sign << 3) | code


def quantize(x: torch.Tensor, global_per_row: torch.Tensor):
    """x fp32 [rows, cols] → (codes uint8 [rows, cols], E4M3 block scales [rows, cols/16])."""
    rows, cols = x.shape
    blocks = x.reshape(rows, cols // 16, 16)
    g = global_per_row.reshape(rows, 1)
    amax = blocks.abs().amax(-1)
    rcp6 = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(6.0, dtype=torch.float32)
    sf = (g * (amax * rcp6)).clamp(max=448.0).to(torch.float8_e4m3fn)  # satfinite
    sf_f = sf.float()
    rcp_g = torch.tensor(1.0, dtype=torch.float32) / g
    out_scale = torch.where(sf_f != 0, 1.0 / (sf_f * rcp_g), torch.zeros_like(sf_f))
    codes = e2m1_rne(blocks * out_scale.unsqueeze(-1)).reshape(rows, cols)
    return codes, sf


def per_token_scales(x: torch.Tensor):
    """(token_scale, G) per row: token_scale = amax(row)/2688, G = 1/token_scale (0 for zero rows)."""
    token_scale = x.abs().amax(1) / 2688.0
    g = torch.where(token_scale > 0, 1.0 / token_scale, torch.zeros_like(token_scale))
    return token_scale, g


def fake_quantize(x: torch.Tensor, mode: str, input_scale=None) -> torch.Tensor:
    """Quantize then dequantize the rows of x (any leading shape) in mode none|static|per-token."""
    if mode == "none":
        return x
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).float()
    if mode == "static":
        scale = torch.as_tensor(input_scale, dtype=torch.float32)
        row_scale = scale.expand(x2.shape[0])
        g = (torch.tensor(1.0) / scale).expand(x2.shape[0])
    else:
        row_scale, g = per_token_scales(x2)
    codes, sf = quantize(x2, g)
    values = E2M1_VALUES[codes.long()] * sf.float().repeat_interleave(16, 1)
    return (values * row_scale.unsqueeze(1)).reshape(shape)


def _near(values: torch.Tensor, boundaries: torch.Tensor, rel: float) -> torch.Tensor:
    """values [..., n] → [...]: is any value within rel (relative) of any boundary?"""
    d = (values.unsqueeze(-1) - boundaries).abs() <= rel * boundaries
    return d.flatten(-2).any(-1)


E4M3_VALUES = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
E4M3_MIDPOINTS = (E4M3_VALUES[:-1] + E4M3_VALUES[1:]) / 2


def fragile_rows(x: torch.Tensor, mode: str, input_scale=None, rel: float = 1e-5) -> torch.Tensor:
    """Rows whose quantization is fragile: an element's scaled value x·out_scale or a block's
    G·amax/6 lies within `rel` of a rounding midpoint, so an fp32 reordering (~1e-6) elsewhere may
    round it the other way. Returns a bool per row of x.reshape(-1, last dim)."""
    x2 = x.reshape(-1, x.shape[-1]).float()
    if mode == "none":
        return torch.zeros(x2.shape[0], dtype=torch.bool)
    if mode == "static":
        g = (torch.tensor(1.0) / torch.as_tensor(input_scale, dtype=torch.float32)).expand(x2.shape[0])
    else:
        _, g = per_token_scales(x2)
    rows, cols = x2.shape
    blocks = x2.reshape(rows, cols // 16, 16)
    sf_value = g.reshape(rows, 1) * (blocks.abs().amax(-1) / 6.0)
    sf = sf_value.clamp(max=448.0).to(torch.float8_e4m3fn).float()
    out_scale = torch.where(sf != 0, g.reshape(rows, 1) / sf, torch.zeros_like(sf))
    scaled = (blocks * out_scale.unsqueeze(-1)).abs()
    return _near(scaled.reshape(rows, -1), E2M1_MIDPOINTS, rel) | _near(sf_value, E4M3_MIDPOINTS, rel)
