"""Long context through the server: a RoPE scaling given at start (--rope-scaling, over a config that
--hf-overrides shrinks to 256 positions so the test stays small) lets requests past the model's own
max_position_embeddings through, up to the scaled context, and past that a 400 names the limit; a
--max-model-len beyond the context is a start-up error that says how to extend it."""
import concurrent.futures
import random
import subprocess

import requests

from conftest import SERVE_ARGS
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
