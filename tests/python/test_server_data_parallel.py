"""--data-parallel-size: several engines behind one endpoint (issue 66). Routing by cached prefix and
by load, per-engine metrics that sum to the totals, control calls reaching every engine, and an engine
that fails taken out while the others keep serving. CPU engines here; the GPU run sets
NIBBLE_TEST_SERVE_ARGS="--backend cuda --data-parallel-size 2" for the other server tests too."""
import random
import threading
import time

import pytest
import requests

from conftest import SERVE_ARGS
from nibble_server import NibbleServer

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def serve(build_dir, model, log, *args, env=None):
    # The GPU run's arguments, with this test's engine count last (it wins).
    return NibbleServer(build_dir, model, log, "--served-model-name", "tiny", *SERVE_ARGS, *args, env=env)


def engines(s) -> list:
    return requests.get(s.url + "/server_info").json()["engines"]


def complete(s, prompt: str, max_tokens: int = 4) -> requests.Response:
    return requests.post(s.url + "/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens,
                                                          "temperature": 0, "ignore_eos": True}, timeout=120)


def fingerprint(s, prompt: str) -> list:
    """The greedy tokens' logprobs: they differ between two random models even where the text agrees."""
    r = requests.post(s.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 6, "temperature": 0,
                                                       "ignore_eos": True, "logprobs": 1}, timeout=120)
    assert r.status_code == 200, r.text
    return [round(x, 3) for x in r.json()["choices"][0]["logprobs"]["token_logprobs"]]


def random_prompt(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def dp2(build_dir, tiny_models, tmp_path_factory):
    s = serve(build_dir, tiny_models["a"], tmp_path_factory.mktemp("log") / "dp2.log", "--data-parallel-size", "2")
    yield s
    assert s.stop() == 0, s.log()


def test_prompts_sharing_a_prefix_go_to_one_engine_and_others_spread(dp2, seed):
    rng = random.Random(seed)
    before = [e["routed_requests"] for e in engines(dp2)]
    # A shared prefix of ~100 words (several 16-token blocks), then a short suffix each: SGLang's
    # cache-aware rule sends every one after the first to the engine that holds the prefix.
    prefix = random_prompt(rng, 100)
    for i in range(6):
        assert complete(dp2, prefix + " " + random_prompt(rng, 3)).status_code == 200
    after = [e["routed_requests"] for e in engines(dp2)]
    moved = [a - b for a, b in zip(after, before)]
    assert sorted(moved) == [0, 6], moved
    # Unrelated prompts, one at a time (both engines idle): a miss goes to the engine whose routing
    # table is smaller (SGLang's rule when loads are level), which spreads the cached prefixes.
    for i in range(6):
        state = engines(dp2)
        smaller = min(range(2), key=lambda j: (state[j]["routing_table_blocks"], j))
        assert complete(dp2, random_prompt(rng, 40)).status_code == 200
        routed = [e["routed_requests"] - b["routed_requests"] for e, b in zip(engines(dp2), state)]
        assert routed[smaller] == 1 and sum(routed) == 1, (state, routed)


def test_concurrent_requests_use_both_engines_and_metrics_sum(dp2, seed):
    rng = random.Random(seed)
    before = [e["routed_requests"] for e in engines(dp2)]
    prompts = [random_prompt(rng, 30) for _ in range(12)]
    results = [None] * len(prompts)

    def run(i):
        results[i] = complete(dp2, prompts[i], max_tokens=16)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16 for r in results)
    moved = [e["routed_requests"] - b for e, b in zip(engines(dp2), before)]
    assert min(moved) >= 3, moved  # least loaded: neither engine takes nearly all of them
    m = dp2.metrics()
    for name in ("nibble:generation_tokens_total", "nibble:prompt_tokens_total", "nibble:kv_cache_blocks",
                 "nibble:engine_steps_total", "nibble:e2e_request_latency_seconds_count"):
        parts = [m[f'{name}{{engine="{i}"}}'] for i in range(2)]
        assert m[name] == sum(parts), (name, m[name], parts)
        if name != "nibble:kv_cache_blocks":
            assert min(parts) > 0, (name, parts)
    assert m['nibble:engine_in_service{engine="0"}'] == 1 and m['nibble:engine_in_service{engine="1"}'] == 1
    info = requests.get(dp2.url + "/server_info").json()
    assert info["data_parallel_size"] == 2 and info["dp_size"] == 2 and len(info["internal_states"]) == 2


def test_engines_answer_as_one_engine_does(dp2, build_dir, tiny_models, tmp_path, seed):
    """Greedy completions are the same whichever engine runs them: each is the model."""
    rng = random.Random(seed)
    prompts = [random_prompt(rng, 20) for _ in range(6)]
    single = serve(build_dir, tiny_models["a"], tmp_path / "dp1.log", "--data-parallel-size", "1")
    try:
        expected = [complete(single, p, 8).json()["choices"][0]["text"] for p in prompts]
    finally:
        assert single.stop() == 0
    # The routing tables level (earlier tests left them uneven, timing-dependently): one at a time, a
    # prompt of 20 words (a full block or more) then goes to the engine whose table is smaller.
    assert requests.post(dp2.url + "/flush_cache").status_code == 200
    before = [e["routed_requests"] for e in engines(dp2)]
    got = [complete(dp2, p, 8).json()["choices"][0]["text"] for p in prompts]
    assert got == expected
    assert min(e["routed_requests"] - b for e, b in zip(engines(dp2), before)) >= 1  # both engines took part


def test_weight_update_flush_and_abort_reach_every_engine(dp2, tiny_models, seed):
    rng = random.Random(seed)
    prompts = [random_prompt(rng, 20) for _ in range(6)]
    routed = [e["routed_requests"] for e in engines(dp2)]
    before = [fingerprint(dp2, p) for p in prompts]
    assert min(e["routed_requests"] - r for e, r in zip(engines(dp2), routed)) >= 1  # both engines ran some
    swap = requests.post(dp2.url + "/update_weights_from_disk",
                         json={"model_path": str(tiny_models["b"]), "weight_version": "b"})
    assert swap.status_code == 200 and swap.json()["success"] is True, swap.text
    after = [fingerprint(dp2, p) for p in prompts]
    # Every prompt changed: had one engine kept model a, the prompts it ran would not have.
    assert all(a != b for a, b in zip(before, after)), list(zip(before, after))
    assert requests.get(dp2.url + "/get_model_info").json()["weight_version"] == "b"
    bad = requests.post(dp2.url + "/update_weights_from_disk", json={"model_path": str(tiny_models["other_layout"])})
    assert bad.status_code == 400 and "num_hidden_layers" in bad.json()["message"]
    back = requests.post(dp2.url + "/update_weights_from_disk", json={"model_path": str(tiny_models["a"])})
    assert back.json()["success"] is True
    assert [fingerprint(dp2, p) for p in prompts] == before
    # /flush_cache: every engine's prefix cache, and the router's memory of them.
    assert requests.post(dp2.url + "/flush_cache").status_code == 200
    assert all(e["routing_table_blocks"] == 0 for e in engines(dp2))
    # /abort_request finds the engine that runs the request.
    done = {}
    t = threading.Thread(target=lambda: done.setdefault("r", requests.post(
        dp2.url + "/generate", json={"text": prompts[0], "rid": "long-one",
                                     "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}})))
    t.start()
    deadline = time.time() + 30
    while sum(e["load"] for e in engines(dp2)) == 0 and time.time() < deadline:
        time.sleep(0.02)
    assert requests.post(dp2.url + "/abort_request", json={"rid": "long-one"}).status_code == 200
    t.join(60)
    assert done["r"].json()["meta_info"]["finish_reason"]["type"] == "abort", done["r"].text


def test_a_failing_engine_is_taken_out_and_the_other_keeps_serving(build_dir, tiny_models, tmp_path, seed):
    rng = random.Random(seed)
    # Engine 1's second model step fails (its first request's first decode step).
    s = serve(build_dir, tiny_models["a"], tmp_path / "fail.log", "--data-parallel-size", "2",
              env={"NIBBLE_DIAG_FAIL_ENGINE": "1:2"})
    try:
        replies = [complete(s, random_prompt(rng, 20)) for _ in range(8)]
        failed = [r for r in replies if r.status_code != 200]
        assert len(failed) == 1, [r.text for r in replies]
        assert "injected failure" in failed[0].text and "out of service" not in failed[0].text
        assert [e["in_service"] for e in engines(s)] == [True, False]
        # Everything after it ran on engine 0, in full.
        later = replies[replies.index(failed[0]) + 1:]
        assert later and all(r.json()["usage"]["completion_tokens"] == 4 for r in later)
        more = [complete(s, random_prompt(rng, 20)) for _ in range(4)]
        assert all(r.status_code == 200 for r in more)
        m = s.metrics()
        assert m['nibble:engine_in_service{engine="1"}'] == 0
        assert "out of service" in s.log()
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("value", ["0", "65", "two"])
def test_bad_engine_counts_are_start_up_errors(build_dir, tiny_models, tmp_path, value):
    import subprocess
    p = subprocess.run([str(build_dir / "nibble"), "serve", "--model", str(tiny_models["a"]), "--port", "0",
                        "--data-parallel-size", value], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "--data-parallel-size" in p.stderr + p.stdout


def test_sglang_spelling_of_the_flag_and_the_last_value_wins(build_dir, tiny_models, tmp_path):
    s = serve(build_dir, tiny_models["a"], tmp_path / "dpsize.log", "--dp-size", "2")
    try:
        assert len(engines(s)) == 2
        assert complete(s, "hello there").status_code == 200
    finally:
        assert s.stop() == 0
    # A flag given twice: the last value (argparse's rule, as vLLM and SGLang parse).
    s = serve(build_dir, tiny_models["a"], tmp_path / "twice.log", "--data-parallel-size", "3",
              "--data-parallel-size", "2")
    try:
        assert len(engines(s)) == 2
        assert complete(s, "hello there").status_code == 200
    finally:
        assert s.stop() == 0
