"""Long context through the server: a RoPE scaling given at start (--rope-scaling, over a config that
--hf-overrides shrinks to 256 positions so the test stays small) lets requests past the model's own
max_position_embeddings through, up to the scaled context, and past that a 400 names the limit; a
--max-model-len beyond the context is a start-up error that says how to extend it."""
import concurrent.futures
import pathlib
import random
import subprocess
import time

import pytest
import requests

from conftest import SERVE_ARGS, SERVER_MODEL
from nibble_server import NibbleServer
from test_server_openai import random_prompt_ids

SMALL = '{"max_position_embeddings": 256}'
YARN = '{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}'


def test_yarn_serves_past_the_models_positions_up_to_the_scaled_context(build_dir, tiny_models, tmp_path, seed):
    s = NibbleServer(build_dir, tiny_models["a"], tmp_path / "serve.log", "--served-model-name", "tiny",
                     "--hf-overrides", SMALL, "--rope-scaling", YARN, "--kv-cache-memory-gb", "1", *SERVE_ARGS)
    try:
        models = requests.get(s.url + "/v1/models", timeout=10).json()
        assert models["data"][0]["max_model_len"] == 1024  # original 256 · factor 4
        rng = random.Random(seed)
        prompt = random_prompt_ids(rng, 700)  # past the 256 positions the config has
        r = requests.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 8,
                                                           "temperature": 0, "ignore_eos": True}, timeout=300)
        assert r.status_code == 200, r.text
        assert r.json()["usage"] == {"prompt_tokens": 700, "completion_tokens": 8, "total_tokens": 708,
                                     "prompt_tokens_details": {"cached_tokens": 0}}
        too_long = requests.post(s.url + "/v1/completions", timeout=60,
                                 json={"model": "tiny", "prompt": random_prompt_ids(rng, 1100), "max_tokens": 8})
        assert too_long.status_code == 400
        assert "maximum context length is 1024 tokens" in too_long.json()["error"]["message"], too_long.text
    finally:
        s.stop()


def test_a_max_model_len_past_the_context_is_a_start_up_error(build_dir, tiny_models):
    proc = subprocess.run([str(build_dir / "nibble"), "serve", "--model", str(tiny_models["a"]), "--port", "0",
                           "--hf-overrides", SMALL, "--max-model-len", "2000", *SERVE_ARGS],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--max-model-len 2000 exceeds the model's context length (256: max_position_embeddings" in proc.stderr
    bad = subprocess.run([str(build_dir / "nibble"), "serve", "--model", str(tiny_models["a"]), "--port", "0",
                          "--rope-scaling", '{"rope_type": "dynamic", "factor": 2.0}', *SERVE_ARGS],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "rope type 'dynamic' is not supported" in bad.stderr, bad.stderr


def test_long_requests_share_a_cached_document_and_survive_preemption(build_dir, tiny_models, tmp_path, seed):
    """Past the model's own positions (YaRN as above): two questions over one 600-token document share its
    KV blocks (the second finds them cached) and answer as they do from a cold cache; three such requests
    at once (the document once and 3 x 420 tokens of their own: 1,860) outgrow a KV cache of 1,600 tokens,
    so one is preempted and recomputed, and all three answer as they do alone (greedy on the CPU
    reference: bit for bit; on the GPU a recomputed prefill runs other kernels, so there only the
    lengths are compared)."""
    s = NibbleServer(build_dir, tiny_models["a"], tmp_path / "serve.log", "--served-model-name", "tiny",
                     "--hf-overrides", SMALL, "--rope-scaling", YARN, "--num-kv-blocks", "100",
                     "--max-num-batched-tokens", "256", *SERVE_ARGS)
    try:
        rng = random.Random(seed)
        document = random_prompt_ids(rng, 600)
        questions = [document + random_prompt_ids(rng, 20) for _ in range(3)]

        def ask(prompt):
            r = requests.post(s.url + "/v1/completions", timeout=300, json={
                "model": "tiny", "prompt": prompt, "max_tokens": 400, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            return r.json()

        first, second = ask(questions[0]), ask(questions[1])
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 592  # the document's whole blocks
        assert requests.post(s.url + "/flush_cache", timeout=30).status_code == 200
        alone = [ask(q)["choices"][0]["text"] for q in questions]
        exact = "cuda" not in SERVE_ARGS
        if exact:
            assert alone[:2] == [first["choices"][0]["text"], second["choices"][0]["text"]]
        assert requests.post(s.url + "/flush_cache", timeout=30).status_code == 200
        before = s.metrics().get("nibble:num_preemptions_total", 0.0)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            together = list(pool.map(ask, questions))
        assert s.metrics()["nibble:num_preemptions_total"] > before, "the KV cache was meant to run out"
        if exact:
            assert [t["choices"][0]["text"] for t in together] == alone
        assert all(t["usage"]["completion_tokens"] == 400 for t in together)
    finally:
        s.stop()


# On the GPU (`scripts/device.sh long-context`): the full-size Qwen3-30B-A3B with Qwen's own YaRN recipe
# (its model card: factor 4 over 32,768 positions, 131,072 in all) at 32k, 64k and 128k tokens.
QWEN_YARN = '{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}'
FULL_SIZE = SERVER_MODEL is not None and "cuda" in SERVE_ARGS
full_size_only = pytest.mark.skipif(not FULL_SIZE, reason="the full-size model on the GPU (NIBBLE_TEST_SERVER_MODEL)")


def agrees(want: dict, got: dict) -> None:
    """Two completions of one prompt answer alike: the first token's logprob within 0.05 nats, and the
    tokens equal up to the first where `want`'s lead over its runner-up is under 0.05 nats. On the GPU a
    prefill in other chunks, or a batch beside others, runs other kernels whose sums round differently
    (~1e-3 in the logits, more once a recomputed 24k-token prefill's K/V replace decoded ones: a flip at
    a 0.022 lead was seen), which may flip only such a near tie; a lost or scrambled context moves the
    whole distribution (a random model's margins are small, so its tokens alone would say little)."""
    w, g = want["choices"][0]["logprobs"], got["choices"][0]["logprobs"]
    first = w["tokens"][0]
    assert first in g["top_logprobs"][0], (first, g["top_logprobs"][0])
    assert abs(g["top_logprobs"][0][first] - w["top_logprobs"][0][first]) < 0.05, (w["top_logprobs"][0], g["top_logprobs"][0])
    for token, other, top in zip(w["tokens"], g["tokens"], w["top_logprobs"]):
        if token != other:
            best = sorted(top.values(), reverse=True)
            assert best[0] - best[1] < 0.05, (token, other, top)
            return


def complete(server: NibbleServer, prompt: list, max_tokens: int, logprobs: int = 5) -> dict:
    r = requests.post(server.url + "/v1/completions", timeout=600, json={
        "model": "big", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        "logprobs": logprobs})
    assert r.status_code == 200, r.text[:500]
    out = r.json()
    assert out["usage"]["prompt_tokens"] == len(prompt) and out["usage"]["completion_tokens"] == max_tokens
    return out


@full_size_only
def test_full_size_32k_64k_and_128k_requests_in_chunks_from_a_cached_document(build_dir, tmp_path, seed):
    """Chunked prefill (8,192 tokens a step) of 32k, 64k and 128k prompts; a 400 past 131,072; two
    questions over a 32k document, the second from the prefix cache, answering as from a cold cache."""
    s = NibbleServer(build_dir, pathlib.Path(SERVER_MODEL), tmp_path / "serve.log", "--served-model-name", "big",
                     "--rope-scaling", QWEN_YARN, "--max-num-batched-tokens", "8192", *SERVE_ARGS)
    try:
        assert requests.get(s.url + "/v1/models", timeout=10).json()["data"][0]["max_model_len"] == 131072
        rng = random.Random(seed)
        for n in (32768, 65536, 131072 - 16):
            start = time.time()
            complete(s, random_prompt_ids(rng, n), 16)
            print(f"[long] {n} prompt tokens + 16: {time.time() - start:.1f} s")
        too_long = requests.post(s.url + "/v1/completions", timeout=60, json={
            "model": "big", "prompt": random_prompt_ids(rng, 131073), "max_tokens": 1})
        assert too_long.status_code == 400 and "131072" in too_long.json()["error"]["message"], too_long.text
        document = random_prompt_ids(rng, 32768)
        questions = [document + random_prompt_ids(rng, 64) for _ in range(2)]
        complete(s, questions[0], 32)
        cached = complete(s, questions[1], 32)
        assert cached["usage"]["prompt_tokens_details"]["cached_tokens"] >= 32768
        assert requests.post(s.url + "/flush_cache", timeout=30).status_code == 200
        cold = complete(s, questions[1], 32)
        assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        agrees(cold, cached)
    finally:
        s.stop()


@full_size_only
def test_full_size_long_requests_survive_preemption(build_dir, tmp_path, seed):
    """Three 24k-token requests at once outgrow a KV cache of 51,200 tokens (two prompts fill all but
    2,048 of it, and each grows by 1,200): one is preempted and recomputed, and each answers as alone."""
    rng = random.Random(seed)
    prompts = [random_prompt_ids(rng, 24576) for _ in range(3)]
    s = NibbleServer(build_dir, pathlib.Path(SERVER_MODEL), tmp_path / "serve.log", "--served-model-name", "big",
                     "--rope-scaling", QWEN_YARN, "--max-num-batched-tokens", "8192", "--num-kv-blocks", "3200",
                     *SERVE_ARGS)
    try:
        alone = []
        for p in prompts:
            alone.append(complete(s, p, 1200))
            assert requests.post(s.url + "/flush_cache", timeout=30).status_code == 200
        before = s.metrics().get("nibble:num_preemptions_total", 0.0)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            together = list(pool.map(lambda p: complete(s, p, 1200), prompts))
        assert s.metrics()["nibble:num_preemptions_total"] > before, "the KV cache was meant to run out"
        for want, got in zip(alone, together):
            agrees(want, got)
    finally:
        s.stop()


@full_size_only
def test_full_size_fp8_cache_at_128k(build_dir, tmp_path, seed):
    """With an FP8 KV cache a 128k request is served, and its first token is one of the BF16 cache's top
    five (a lost or scrambled context would draw from the whole vocabulary)."""
    long_prompt = random_prompt_ids(random.Random(seed), 131072 - 16)
    s = NibbleServer(build_dir, pathlib.Path(SERVER_MODEL), tmp_path / "serve_bf16.log", "--served-model-name", "big",
                     "--rope-scaling", QWEN_YARN, "--max-num-batched-tokens", "8192", *SERVE_ARGS)
    try:
        bf16 = complete(s, long_prompt, 8)
    finally:
        s.stop()
    s = NibbleServer(build_dir, pathlib.Path(SERVER_MODEL), tmp_path / "serve_fp8.log", "--served-model-name", "big",
                     "--rope-scaling", QWEN_YARN, "--max-num-batched-tokens", "8192", "--kv-cache-dtype", "fp8",
                     *SERVE_ARGS)
    try:
        fp8 = complete(s, long_prompt, 8)
    finally:
        s.stop()
    first_fp8 = fp8["choices"][0]["logprobs"]["tokens"][0]
    assert first_fp8 in bf16["choices"][0]["logprobs"]["top_logprobs"][0], (first_fp8, bf16["choices"][0]["logprobs"])
