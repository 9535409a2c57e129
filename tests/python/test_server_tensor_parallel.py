"""--tensor-parallel-size / --enable-expert-parallel / --nnodes through the server (issue 68) on the CPU backend:
one model whose ranks run on threads answers as the single-rank server does; shapes that do not split
and flags that do not combine are start-up errors naming what was wrong; /server_info reports the
parallel layout."""
import random
import subprocess

import pytest
import requests

from nibble_server import NibbleServer
from test_server_openai import random_prompt_ids


def greedy(s: NibbleServer, prompt: list, n: int = 12) -> dict:
    r = requests.post(s.url + "/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "logprobs": 2})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]


@pytest.mark.parametrize("layout", [["--tensor-parallel-size", "2"], ["--tp", "4", "--enable-expert-parallel"]])
def test_ranks_answer_as_one_rank(build_dir, tiny_models, tmp_path, seed, layout):
    """Greedy tokens equal the single-rank server's up to the first near tie: the ranks' partial sums
    meet in another order (logits within ~1e-7, test_tensor_parallel.cpp), which can flip only a tie."""
    rng = random.Random(seed)
    prompts = [random_prompt_ids(rng, rng.randrange(5, 40)) for _ in range(4)]
    one = NibbleServer(build_dir, tiny_models["a"], tmp_path / "one.log", "--served-model-name", "tiny",
                       "--backend", "cpu")
    try:
        want = [greedy(one, p) for p in prompts]
    finally:
        one.stop()
    split = NibbleServer(build_dir, tiny_models["a"], tmp_path / "split.log", "--served-model-name", "tiny",
                         "--backend", "cpu", *layout)
    try:
        info = requests.get(split.url + "/server_info", timeout=10).json()
        assert info["tensor_parallel_size"] == int(layout[1])
        assert info["enable_expert_parallel"] == ("--enable-expert-parallel" in layout)
        for p, w in zip(prompts, want):
            got = greedy(split, p)
            for token, other, top in zip(w["tokens"], got["tokens"], w["top_logprobs"]):
                if token != other:
                    best = sorted(top.values(), reverse=True)
                    assert best[0] - best[1] < 1e-4, (token, other, top)
                    break
    finally:
        split.stop()


@pytest.mark.parametrize("args, message", [
    (["--tensor-parallel-size", "3"], "num_attention_heads 4 does not split across 3 ranks"),
    (["--tensor-parallel-size", "4"], "moe_intermediate_size 32 does not split into multiples of 16"),
    (["--enable-expert-parallel"], "--enable-expert-parallel deals the experts over --tensor-parallel-size ranks"),
    (["--tensor-parallel-size", "0"], "--tensor-parallel-size must be in [1, 64]"),
    (["--tp", "2", "--nnodes", "2"], "--nnodes > 1 needs --dist-init-addr host:port"),
    (["--tp", "3", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:29500"], "does not split over 2 nodes"),
    (["--nnodes", "2", "--node-rank", "2"], "--node-rank in [0, --nnodes)"),
    (["--tp", "2", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:29500"], "--nnodes > 1 runs on the GPU backend"),
])
def test_layouts_that_do_not_split_are_start_up_errors(build_dir, tiny_models, args, message):
    proc = subprocess.run([str(build_dir / "nibble"), "serve", "--model", str(tiny_models["a"]), "--port", "0",
                           "--backend", "cpu", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
