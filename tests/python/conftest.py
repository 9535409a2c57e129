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
