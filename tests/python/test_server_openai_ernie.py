"""The openai-client server tests of test_server_openai.py, on a synthetic ERNIE-4.5-MoE (SentencePiece
tokenizer, ERNIE's chat format, shared experts): the same routes, errors and streaming hold for it."""
import os

import pytest

from conftest import _synth
from test_server_openai import *  # noqa: F401,F403 - the same tests, collected here again

ERNIE_PRESET = "small-ernie" if os.environ.get("NIBBLE_TEST_PRESET", "").startswith("small") else "tiny-ernie"


@pytest.fixture(scope="module")
def tiny_models(build_dir, tmp_path_factory):
    """Overrides conftest's Qwen3 checkpoints for this module's server."""
    root = tmp_path_factory.mktemp("ernie")
    return {"a": _synth(build_dir, root / "a", "--seed", "0", preset=ERNIE_PRESET)}
