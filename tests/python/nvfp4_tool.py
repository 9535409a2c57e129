"""Runs build/tests/nvfp4_tool (nibble's host NVFP4 quantizers) on a torch tensor and reads back
its outputs as torch tensors."""
import pathlib
import subprocess
import tempfile

import numpy as np
import torch


def run(build_dir: pathlib.Path, mode: str, x: torch.Tensor, scale: float = 0.0) -> dict:
    rows, cols = x.shape
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        x.to(torch.float32).numpy().tofile(tmp / "in.f32")
        proc = subprocess.run(
            [str(build_dir / "tests" / "nvfp4_tool"), mode, str(tmp / "in.f32"), str(rows),
             str(cols), repr(float(scale)), str(tmp)],
            capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nvfp4_tool {mode} failed: {proc.stderr.strip()}")

        def read(name, dtype):
            return torch.from_numpy(np.fromfile(tmp / name, dtype=dtype))

        return {
            "packed": read("packed.u8", np.uint8).reshape(rows, cols // 2),
            "block_scales": read("block_scales.u8", np.uint8).reshape(rows, cols // 16),
            "scale": read("scale.f32", np.float32)[0],
            "row_scales": read("row_scales.f32", np.float32),
            "dequant": read("dequant.f32", np.float32).reshape(rows, cols),
        }
