"""Tensor parallelism over processes (issue 68: --nnodes, --node-rank, --dist-init-addr, SGLang's flags)
on a machine with two GPUs or more, each node seeing one (CUDA_VISIBLE_DEVICES), as two hosts would:
node 1 runs its rank for node 0, which serves; the greedy answers equal the one-process `--tp 2`
server's, and node 1 leaves when node 0 stops. Needs
NIBBLE_TEST_GPUS >= 2 and a checkpoint whose widths split on the GPU (NIBBLE_TEST_SERVER_MODEL, e.g.
the 4-layer slice of Qwen3-30B-A3B); `scripts/device.sh tests` sets both on multi-GPU kinds."""
import os
import pathlib
import socket
import subprocess

import pytest
import requests

from nibble_server import NibbleServer

GPUS = int(os.environ.get("NIBBLE_TEST_GPUS", "0"))
MODEL = os.environ.get("NIBBLE_TEST_SERVER_MODEL")
pytestmark = pytest.mark.skipif(GPUS < 2 or not MODEL, reason="two GPUs and NIBBLE_TEST_SERVER_MODEL needed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def greedy(url: str, prompt: str) -> list:
    r = requests.post(url + "/v1/completions", timeout=300, json={
        "model": "a", "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "logprobs": 1})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["tokens"]


def test_two_processes_answer_as_one(build_dir, tmp_path):
    prompts = ["The capital of France is", "def fibonacci(n):", "In 1969, the first"]
    common = ["--backend", "cuda", "--served-model-name", "a", "--tp", "2"]
    one = NibbleServer(build_dir, pathlib.Path(MODEL), tmp_path / "one.log", *common)
    try:
        want = [greedy(one.url, p) for p in prompts]
    finally:
        one.stop()
    address = f"127.0.0.1:{free_port()}"
    nodes = ["--nnodes", "2", "--dist-init-addr", address]
    follower_log = open(tmp_path / "node1.log", "w")
    # Each node sees one GPU, as two hosts would.
    follower = subprocess.Popen([str(build_dir / "nibble"), "serve", "--model", MODEL, *common, *nodes,
                                 "--node-rank", "1"], stdout=follower_log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, CUDA_VISIBLE_DEVICES="1"))
    try:
        leader = NibbleServer(build_dir, pathlib.Path(MODEL), tmp_path / "node0.log", *common, *nodes,
                              "--node-rank", "0", env={"CUDA_VISIBLE_DEVICES": "0"})
        try:
            got = [greedy(leader.url, p) for p in prompts]
        finally:
            leader.stop()
        assert follower.wait(timeout=60) == 0, (tmp_path / "node1.log").read_text()
    finally:
        if follower.poll() is None:
            follower.kill()
    assert got == want
