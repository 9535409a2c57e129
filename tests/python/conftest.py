"""Shared pytest fixtures: where the build is, and a fresh printed seed per test."""
import os
import pathlib
import random

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def build_dir() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("NIBBLE_BUILD_DIR", REPO / "build"))
    if not (path / "nibble").exists():
        pytest.fail(f"no nibble build in {path}: build first (scripts/test.sh does)")
    return path


@pytest.fixture
def seed(request) -> int:
    value = int(os.environ.get("NIBBLE_TEST_SEED", random.SystemRandom().randrange(2**31)))
    print(f"[seed] {request.node.name}: NIBBLE_TEST_SEED={value}")
    return value


# The server tests run on the GPU too: NIBBLE_TEST_PRESET=small-moe (a checkpoint the GPU kernels
# take) and NIBBLE_TEST_SERVE_ARGS="--backend cuda" (`scripts/device.sh tests` sets both);
# NIBBLE_TEST_SERVER_MODEL serves an existing checkpoint as model "a" (the full-size synthetic one there).
PRESET = os.environ.get("NIBBLE_TEST_PRESET", "tiny-moe")
SERVE_ARGS = os.environ.get("NIBBLE_TEST_SERVE_ARGS", "").split()
SERVER_MODEL = os.environ.get("NIBBLE_TEST_SERVER_MODEL")


def _synth(build_dir: pathlib.Path, out: pathlib.Path, *args: str, preset: str = PRESET) -> pathlib.Path:
    import subprocess
    subprocess.run([str(build_dir / "nibble"), "synth", "--preset", preset, "--out", str(out), *args],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def tiny_models(build_dir, tmp_path_factory) -> dict:
    """Tiny random Qwen3-MoE checkpoints: two of the same layout (seeds 0, 1) and one with 3 layers."""
    root = tmp_path_factory.mktemp("models")
    return {"a": pathlib.Path(SERVER_MODEL) if SERVER_MODEL else _synth(build_dir, root / "a", "--seed", "0"),
            "b": _synth(build_dir, root / "b", "--seed", "1"),
            "other_layout": _synth(build_dir, root / "c", "--seed", "2", "--layers", "3")}


@pytest.fixture(scope="module")
def server(build_dir, tiny_models, tmp_path_factory):
    """`nibble serve` on tiny model "a", shared by a test module."""
    from nibble_server import NibbleServer
    s = NibbleServer(build_dir, tiny_models["a"], tmp_path_factory.mktemp("log") / "serve.log",
                     "--served-model-name", "tiny", *SERVE_ARGS)
    yield s
    assert s.stop() == 0, s.log()
