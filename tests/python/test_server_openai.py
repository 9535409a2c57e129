"""`nibble serve` through the official openai client and plain HTTP: chat and completions, stream
and not, n > 1, stop strings, logprobs, usage, the SGLang and vLLM extra routes, and a matrix of bad
requests that must each get their status and an OpenAI error body while the server stays healthy."""
import json
import pathlib
import random
import subprocess

import openai
import pytest
import requests


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


# Token ids every served model has (the small synthetic ERNIE's vocabulary is 1,024): the tests run
# on Qwen3 and ERNIE checkpoints alike.
ID_LIMIT = 1024


def random_prompt_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(0, ID_LIMIT) for _ in range(n)]


def test_models_lists_the_served_name(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_chat_non_stream_and_stream_agree(client):
    messages = [{"role": "user", "content": "Say something."}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    choice = whole.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens >= 1
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    text, finish, usage, chunks = "", None, None, []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.usage:
            usage = chunk.usage
            assert chunk.choices == []
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    # As OpenAI, vLLM and FastDeploy stream it: a role-only first chunk, then the tokens.
    first = chunks[0].choices[0]
    assert first.delta.role == "assistant" and first.delta.content == "" and first.finish_reason is None
    assert chunks[1].choices[0].delta.content and chunks[1].choices[0].delta.role is None
    # FastDeploy's server-side timing on every token chunk: seconds since inference start, in order.
    stamps = [c.choices[0].model_extra["arrival_time"] for c in chunks[1:] if c.choices]
    assert stamps and all(0 <= a <= b for a, b in zip(stamps, stamps[1:])), stamps
    assert text == (choice.message.content or "")
    assert finish == choice.finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_content_parts_read_as_their_joined_text(client, seed):
    """Content as a list of text parts (how the openai client's typed messages and most apps send it)
    renders as the parts joined with newlines, as vLLM renders it for a string template: the same
    prompt and the same greedy reply as that string."""
    rng = random.Random(seed)
    words = ["Say", "something", "short", "about", "boxes", "of", "pencils", "12", "7"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randrange(1, 5))) for _ in range(rng.randrange(2, 4))]
    parts = client.chat.completions.create(
        model="tiny", max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                  {"role": "user", "content": [{"type": "text", "text": t} for t in texts]}])
    joined = client.chat.completions.create(
        model="tiny", max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "\n".join(texts)}])
    assert parts.usage.prompt_tokens == joined.usage.prompt_tokens
    assert parts.choices[0].message.content == joined.choices[0].message.content


def test_completions_stream_matches_non_stream(client, seed):
    rng = random.Random(seed)
    prompt = random_prompt_ids(rng, 7)
    whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=prompt, max_tokens=10, temperature=0, stream=True) if c.choices)
    assert streamed == whole.choices[0].text
    assert whole.usage.prompt_tokens == 7


def test_n_choices_are_seeded_and_distinct(client, seed):
    kwargs = dict(model="tiny", prompt="Once upon a time", max_tokens=8, temperature=1.0, n=4, seed=seed,
                  extra_body={"ignore_eos": True})
    first = client.completions.create(**kwargs)
    again = client.completions.create(**kwargs)
    assert sorted(c.index for c in first.choices) == [0, 1, 2, 3]
    texts = [c.text for c in sorted(first.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(again.choices, key=lambda c: c.index)]  # same seed, same draws
    assert len(set(texts)) > 1, texts  # choice i draws with seed + i
    assert first.usage.completion_tokens == 4 * 8


def test_stop_string_is_trimmed_and_reported(client, server, seed):
    rng = random.Random(seed)
    prompt = random_prompt_ids(rng, 5)
    base = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0,
                                     extra_body={"ignore_eos": True})
    text = base.choices[0].text
    if len(text) < 4:
        pytest.skip("greedy output too short to pick a stop string")
    stop = text[2:4]
    cut = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert cut.choices[0].text == text[:text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].model_extra.get("stop_reason") == stop
    kept = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0, stop=[stop],
                                     extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    assert kept.choices[0].text == text[:text.index(stop) + len(stop)]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=prompt, max_tokens=16, temperature=0, stop=[stop], stream=True,
        extra_body={"ignore_eos": True}) if c.choices)
    assert streamed == cut.choices[0].text  # the hold-back never leaked part of the stop string


def test_logprobs_are_a_distribution_and_greedy_picks_the_top(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert all(lp <= 0 for lp in tops)
        assert entry.logprob == pytest.approx(tops[0], abs=1e-6)  # greedy took the most likely token
        assert entry.token == entry.top_logprobs[0].token
    c = requests.post(r"%s/v1/completions" % client.base_url.__str__().rstrip("/").removesuffix("/v1"),
                      json={"prompt": "hi", "max_tokens": 3, "temperature": 0, "logprobs": 2}).json()
    lp = c["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 3
    assert all(len(t) <= 2 for t in lp["top_logprobs"])


def test_logit_bias_forces_and_bans_tokens(client, server, seed):
    """OpenAI's logit_bias through the official client and /generate: +100 on a token makes every
    sampled token that one (greedy or seeded), -100 on the greedy choice makes the model take another."""
    rng = random.Random(seed)
    ids = random_prompt_ids(rng, 8)
    def generate(params):
        r = requests.post(server.url + "/generate", json={"input_ids": ids, "sampling_params": {
            "max_new_tokens": 4, "ignore_eos": True, **params}})
        assert r.status_code == 200, r.text
        return r.json()["output_ids"]
    greedy = generate({"temperature": 0})
    forced = rng.randrange(0, ID_LIMIT)
    assert generate({"temperature": 0, "logit_bias": {str(forced): 100}}) == [forced] * 4
    assert generate({"temperature": 1.0, "seed": rng.randrange(1 << 30), "logit_bias": {str(forced): 100}}) == [forced] * 4
    banned = generate({"temperature": 0, "logit_bias": {str(greedy[0]): -100}})
    assert banned[0] != greedy[0]
    # The official client sends it as a dict of string ids: the greedy top logprob is the forced token's.
    c = client.completions.create(model="tiny", prompt=ids, max_tokens=3, temperature=0, logit_bias={str(forced): 100},
                                  logprobs=1, extra_body={"ignore_eos": True})
    assert c.usage.completion_tokens == 3 and c.choices[0].finish_reason == "length"
    plain = client.completions.create(model="tiny", prompt=ids, max_tokens=3, temperature=0, logprobs=1,
                                      extra_body={"ignore_eos": True})
    assert c.choices[0].logprobs.token_logprobs[0] <= plain.choices[0].logprobs.token_logprobs[0]  # raw logprobs


def test_sglang_generate_and_max_new_tokens_zero(server, seed):
    rng = random.Random(seed)
    ids = random_prompt_ids(rng, 6)
    r = requests.post(server.url + "/generate", json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": 5, "temperature": 0, "ignore_eos": True}}).json()
    assert len(r["output_ids"]) == 5
    assert r["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert r["meta_info"]["prompt_tokens"] == 6
    zero = requests.post(server.url + "/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 0}}).json()
    assert zero["output_ids"] == [] and zero["text"] == ""
    assert zero["meta_info"]["finish_reason"]["type"] == "length"
    events = []
    with requests.post(server.url + "/generate", json={"text": "hello", "stream": True, "sampling_params": {
            "max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}, stream=True) as resp:
        for line in resp.iter_lines():
            if line.startswith(b"data: "):
                events.append(line[6:].decode())
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert len(last["output_ids"]) == 4 and last["meta_info"]["finish_reason"]["type"] == "length"
    batch = requests.post(server.url + "/generate", json={"text": ["a", "b"], "sampling_params": {
        "max_new_tokens": 2, "temperature": 0, "ignore_eos": True}}).json()
    assert isinstance(batch, list) and len(batch) == 2


def test_tokenize_detokenize_and_prefix_cache(server):
    t = requests.post(server.url + "/tokenize", json={"prompt": "Hello world, hello nibble!"}).json()
    assert t["count"] == len(t["tokens"]) > 0
    d = requests.post(server.url + "/detokenize", json={"tokens": t["tokens"]}).json()
    assert d["prompt"] == "Hello world, hello nibble!"
    chat = requests.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > 3
    # The same 40-token prompt twice: the second finds its full blocks in the prefix cache.
    prompt = list(range(ID_LIMIT - 40, ID_LIMIT))
    before = server.metrics()
    for _ in range(2):
        requests.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    after = server.metrics()
    assert after["nibble:prefix_cache_hits_total"] - before["nibble:prefix_cache_hits_total"] >= 32


def test_model_and_server_info(server, tiny_models):
    info = requests.get(server.url + "/get_model_info").json()
    assert info["model_path"] == str(tiny_models["a"])
    assert info["weight_version"] == "default"
    assert requests.get(server.url + "/get_server_info").json()["max_num_seqs"] == 256
    # SGLang's current name for it answers the same.
    current, older = requests.get(server.url + "/server_info").json(), requests.get(server.url + "/get_server_info").json()
    assert current.keys() == older.keys() and current["max_num_seqs"] == 256
    assert requests.get(server.url + "/health_generate").status_code == 200
    text = requests.get(server.url + "/metrics").text
    for name in ("nibble:num_requests_running", "nibble:kv_cache_usage_perc", "nibble:prompt_tokens_total",
                 "nibble:time_to_first_token_seconds_bucket", "nibble:time_per_output_token_seconds_count",
                 "nibble:inter_token_latency_seconds_sum", "nibble:e2e_request_latency_seconds_count",
                 "nibble:prefix_cache_hits_total"):
        assert name in text


def test_step_timers_split_model_and_engine_time(server):
    """/metrics splits the engine thread's stepping time into the runner's (the model) and the engine's
    own; a 5-token completion is at least 5 steps (one prefill, four decodes)."""
    before = server.metrics()
    r = requests.post(server.url + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 5, "ignore_eos": True})
    assert r.status_code == 200
    after = server.metrics()
    steps = after["nibble:engine_steps_total"] - before["nibble:engine_steps_total"]
    assert steps >= 5
    assert after["nibble:step_model_seconds_total"] > before["nibble:step_model_seconds_total"]
    assert after["nibble:step_engine_seconds_total"] > before["nibble:step_engine_seconds_total"]
    assert after["nibble:step_engine_seconds_count"] == after["nibble:engine_steps_total"]
    assert after["nibble:step_engine_seconds_sum"] == pytest.approx(after["nibble:step_engine_seconds_total"], rel=1e-6)


def test_reset_prefix_cache_empties_the_cache(server, seed):
    """vLLM's POST /reset_prefix_cache: the next identical prompt finds nothing cached."""
    prompt = [random.Random(seed).randrange(100, ID_LIMIT) for _ in range(48)]
    for _ in range(2):
        requests.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    r = requests.post(server.url + "/reset_prefix_cache")
    assert r.status_code == 200
    again = requests.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = requests.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}).json()
    assert cached["usage"]["prompt_tokens_details"]["cached_tokens"] >= 32
    assert requests.get(server.url + "/reset_prefix_cache").status_code == 405


def test_nul_and_control_characters_reach_the_model(server, tiny_models, build_dir, tmp_path):
    """Text after a NUL once vanished (a NUL-terminated normalizer): every route keeps it, with
    the reference tokenizer's ids: Hugging Face tokenizers for tokenizer.json, SentencePiece itself
    for a tokenizer.model (transformers' conversion differs from it around control characters)."""
    text = "a\u0000b c d\u0001\u007f\u0085 e"
    model_file = tiny_models["a"] / "tokenizer.model"
    if model_file.exists():
        spm = pytest.importorskip("sentencepiece")
        want = spm.SentencePieceProcessor(model_file=str(model_file)).encode(text)
    else:
        from tokenizers import Tokenizer
        want = Tokenizer.from_file(str(tiny_models["a"] / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert len(want) > 5
    assert requests.post(server.url + "/tokenize", json={"prompt": text}).json()["tokens"] == want
    usage = requests.post(server.url + "/v1/completions", json={"prompt": text, "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == len(want)
    path = tmp_path / "nul.txt"
    path.write_bytes(text.encode())
    cli = subprocess.run([str(build_dir / "nibble"), "tokenize", "--model", str(tiny_models["a"]), "--file", str(path)],
                         capture_output=True, text=True, check=True)
    assert json.loads(cli.stdout) == want


def test_chat_template_kwargs_reach_the_template(server):
    def count(kwargs):
        body = {"messages": [{"role": "user", "content": "hi"}]}
        if kwargs is not None:
            body["chat_template_kwargs"] = kwargs
        return requests.post(server.url + "/tokenize", json=body).json()["count"]
    # Qwen3's template adds an empty <think></think> block when thinking is off (ERNIE's has no switch).
    if "enable_thinking" not in chat_template(server):
        pytest.skip("the served chat template has no enable_thinking")
    assert count({"enable_thinking": False}) > count(None)


def chat_template(server) -> str:
    model = pathlib.Path(requests.get(server.url + "/get_model_info").json()["model_path"])
    jinja = model / "chat_template.jinja"
    return jinja.read_text() if jinja.exists() else json.loads((model / "tokenizer_config.json").read_text()).get(
        "chat_template", "")


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]
BAD_REQUESTS = [
    ("POST", CHAT, "{not json", 400, "not valid JSON"),
    ("POST", CHAT, "[1, 2]", 400, "JSON object"),
    ("POST", CHAT, {}, 400, "messages"),
    ("POST", CHAT, {"messages": "hi"}, 400, "messages"),
    ("POST", CHAT, {"messages": [{"role": "user"}]}, 400, "'content' is required for role 'user'"),
    ("POST", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "must be a string or a list of content parts"),
    ("POST", CHAT, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]},
     400, "messages[0].content[1]: 'image_url' parts are not supported"),
    ("POST", CHAT, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400, "needs a string 'text'"),
    ("POST", "/tokenize", {"messages": [{"role": "user", "content": [{"type": "video_url"}]}]}, 400, "'video_url' parts"),
    ("POST", CHAT, {"messages": MSG, "temperature": "hot"}, 400, "temperature"),
    ("POST", CHAT, {"messages": MSG, "temperature": -1}, 400, "temperature"),
    ("POST", CHAT, {"messages": MSG, "top_p": 0}, 400, "top_p"),
    ("POST", CHAT, {"messages": MSG, "n": 0}, 400, "'n'"),
    ("POST", CHAT, {"messages": MSG, "max_tokens": -5}, 400, "max_tokens"),
    ("POST", CHAT, {"messages": MSG, "max_tokens": 10**9}, 400, "This model's maximum context length is"),
    ("POST", CHAT, {"messages": MSG, "model": "gpt-4"}, 404, "model"),
    ("POST", CHAT, {"messages": MSG, "stop": 5}, 400, "stop"),
    ("POST", CHAT, {"messages": MSG, "top_logprobs": 3}, 400, "logprobs"),
    ("POST", CHAT, {"messages": MSG, "tool_choice": "required", "tools": []}, 400, "tool_choice"),
    ("POST", CHAT, {"messages": MSG, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("POST", CHAT, {"messages": MSG, "logit_bias": [1, 5]}, 400, "logit_bias"),
    ("POST", CHAT, {"messages": MSG, "logit_bias": {"one": 5}}, 400, "logit_bias"),
    ("POST", CHAT, {"messages": MSG, "logit_bias": {"1": 101}}, 400, "[-100, 100]"),
    ("POST", CHAT, {"messages": MSG, "logit_bias": {"1": "up"}}, 400, "logit_bias"),
    ("POST", CHAT, {"messages": MSG, "logit_bias": {str(10**9): 1}}, 400, "token ids in [0,"),
    ("POST", CHAT, {"messages": MSG, "min_tokens": 9, "max_tokens": 3}, 400, "min_tokens"),
    ("POST", COMPLETIONS, {}, 400, "prompt"),
    ("POST", COMPLETIONS, {"prompt": [1, -3]}, 400, "prompt"),
    ("POST", COMPLETIONS, {"prompt": [10**9]}, 400, "prompt"),
    ("POST", COMPLETIONS, {"prompt": "OVER_MAX_MODEL_LEN", "max_tokens": 1}, 400, "This model's maximum context length is"),
    ("POST", COMPLETIONS, {"prompt": "hi", "suffix": "end"}, 400, "suffix"),
    ("POST", COMPLETIONS, {"prompt": "hi", "best_of": 3}, 400, "best_of"),
    ("POST", COMPLETIONS, {"prompt": "hi", "stop_token_ids": [-1]}, 400, "stop_token_ids"),
    ("POST", "/generate", {"sampling_params": {}}, 400, "text"),
    ("POST", "/generate", {"text": "a", "input_ids": [1]}, 400, "text"),
    ("POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": "many"}}, 400, "max_new_tokens"),
    ("POST", "/detokenize", {"tokens": ["a"]}, 400, "tokens"),
    ("POST", "/tokenize", {}, 400, "prompt"),
    ("POST", "/update_weights_from_disk", {}, 400, "model_path"),
    ("POST", "/update_weights_from_disk", {"model_path": "/nonexistent/model"}, 400, "nonexistent"),
    ("POST", "/abort_request", {}, 400, "rid"),
    ("GET", "/v1/nothing-here", None, 404, "no route"),
    ("GET", CHAT, None, 405, "not allowed"),
]


def test_bad_requests_get_their_status_and_an_openai_error_body(server):
    max_model_len = requests.get(server.url + "/v1/models").json()["data"][0]["max_model_len"]
    for method, path, body, status, needle in BAD_REQUESTS:
        if isinstance(body, dict) and body.get("prompt") == "OVER_MAX_MODEL_LEN":
            body = dict(body, prompt=[7] * (max_model_len + 1))
        data = body if isinstance(body, str) else (json.dumps(body) if body is not None else None)
        r = requests.request(method, server.url + path, data=data, headers={"Content-Type": "application/json"})
        assert r.status_code == status, (path, body, r.status_code, r.text)
        if path == "/update_weights_from_disk" and "success" in r.json():  # SGLang's reply shape
            assert r.json()["success"] is False and needle in r.json()["message"], r.text
            continue
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
        assert err["code"] == status
        assert needle in err["message"] or needle == err["param"], (body, err)
    # Still serving.
    assert requests.get(server.url + "/health").status_code == 200
    ok = requests.post(server.url + COMPLETIONS, json={"prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_openai_client_raises_bad_request_for_invalid_input(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=MSG, temperature=-3)
