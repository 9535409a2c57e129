"""What real clients send and expect (issue 71), each checked the way the client reads it: the
openai SDK's objects and exceptions, lm-evaluation-harness's log-likelihood requests, a browser's
CORS preflight, and raw sockets for HTTP pipelining and Expect: 100-continue."""
import json
import random
import socket
import time

import openai
import pytest
import requests

from conftest import SERVE_ARGS
from test_server_openai import ID_LIMIT, random_prompt_ids

# Prompt logprobs against the logprob of the same token drawn as the next one. On the CPU both come
# from the same reference code (the only difference: a prefix-cache hit reads K/V rounded to BF16,
# which a fresh prefill of the same positions also stores and reads): 1e-3. On the GPU the two runs
# take different kernels at different row counts (skinny vs wgmma GEMMs): 0.05.
LOGPROB_TOL = 0.05 if "cuda" in SERVE_ARGS else 1e-3


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def completions(server, **body):
    r = requests.post(server.url + "/v1/completions", json=dict({"model": "tiny"}, **body), timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_no_tool_calls_means_none_not_an_empty_list(client, server):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert r.choices[0].message.tool_calls is None
    raw = requests.post(server.url + "/v1/chat/completions",
                        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).json()
    assert "tool_calls" not in raw["choices"][0]["message"]


def test_a_tool_loops_second_turn_is_served(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    for assistant in ({"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "assistant", "tool_calls": [call]}):
        messages = [{"role": "user", "content": "Weather in Paris?"}, assistant,
                    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
        r = client.chat.completions.create(model="tiny", messages=messages, tools=tools, max_tokens=3)
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def lm_eval_loglikelihood(server, contexts, continuations):
    """lm-evaluation-harness's local-completions request for log-likelihoods (lm_eval/models/
    openai_completions.py: _create_payload with generate=False, parse_logprobs), on token ids."""
    payload = {"model": "tiny", "prompt": [c + k for c, k in zip(contexts, continuations)], "temperature": 0,
               "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}
    out = requests.post(server.url + "/v1/completions", json=payload, timeout=120).json()
    results = []
    for choice, ctxlen in zip(sorted(out["choices"], key=lambda c: c["index"]), [len(c) for c in contexts]):
        lp = choice["logprobs"]
        logprob = sum(lp["token_logprobs"][ctxlen:-1])
        is_greedy = all(tok == max(top.values())
                        for tok, top in zip(lp["token_logprobs"][ctxlen:-1], lp["top_logprobs"][ctxlen:-1]))
        results.append((logprob, is_greedy, choice))
    return results


def forced_next_logprob(server, prefix, token):
    """The raw logprob of `token` after `prefix`, drawn as the next token (logit_bias forces it;
    logprobs are those of the raw distribution)."""
    out = completions(server, prompt=prefix, max_tokens=1, temperature=0, logprobs=0, logit_bias={str(token): 100})
    lp = out["choices"][0]["logprobs"]
    assert out["choices"][0]["text"] is not None and len(lp["token_logprobs"]) == 1
    return lp["token_logprobs"][0]


def test_echo_with_logprobs_gives_prompt_logprobs_as_lm_eval_reads_them(server, seed):
    rng = random.Random(seed)
    contexts = [random_prompt_ids(rng, rng.randrange(3, 12)) for _ in range(2)]
    continuations = [random_prompt_ids(rng, rng.randrange(1, 5)) for _ in range(2)]
    results = lm_eval_loglikelihood(server, contexts, continuations)
    assert len(results) == 2
    for (logprob, is_greedy, choice), ctx, cont in zip(results, contexts, continuations):
        ids = ctx + cont
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ids) + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing precedes it
        assert logprob < 0 and isinstance(is_greedy, bool)
        for i in range(1, len(ids) + 1):
            top = lp["top_logprobs"][i]
            assert lp["tokens"][i] in top and top[lp["tokens"][i]] == lp["token_logprobs"][i]
            assert 1 <= len(top) <= 2 and all(v <= 0 for v in top.values())
        # Differential: each continuation token's prompt logprob is its logprob as the next token.
        for k in range(len(ctx), len(ids)):
            assert lp["token_logprobs"][k] == pytest.approx(forced_next_logprob(server, ids[:k], ids[k]), abs=LOGPROB_TOL)


def test_echo_logprobs_stream_and_max_tokens_zero(server, seed):
    rng = random.Random(seed)
    ids = random_prompt_ids(rng, 9)
    whole = completions(server, prompt=ids, max_tokens=2, temperature=0, logprobs=3, echo=True, ignore_eos=True)
    lp = whole["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 2
    r = requests.post(server.url + "/v1/completions", json={"prompt": ids, "max_tokens": 2, "temperature": 0,
                                                             "logprobs": 3, "echo": True, "ignore_eos": True,
                                                             "stream": True}, stream=True, timeout=120)
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    text = ""
    for line in r.iter_lines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        choice = json.loads(line[6:])["choices"][0]
        text += choice["text"]
        for key in streamed:
            streamed[key] += (choice["logprobs"] or {}).get(key, [])
    assert text == whole["choices"][0]["text"]
    assert streamed == lp
    prefill_only = completions(server, prompt=ids, max_tokens=0, logprobs=0, echo=True)["choices"][0]["logprobs"]
    assert prefill_only["token_logprobs"] == lp["token_logprobs"][:len(ids)]


def test_completion_top_logprobs_hold_the_sampled_token(server, seed):
    for k in (0, 2):
        out = completions(server, prompt="Once upon a time", max_tokens=6, temperature=1.0, seed=seed, logprobs=k,
                          ignore_eos=True)
        lp = out["choices"][0]["logprobs"]
        for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            assert top[token] == logprob
            assert len(top) <= k + 1 and (k > 0 or len(top) == 1)


def test_over_long_prompts_use_openais_wording(client, server):
    max_model_len = requests.get(server.url + "/v1/models").json()["data"][0]["max_model_len"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=[7] * (max_model_len + 1), max_tokens=1)
    assert f"This model's maximum context length is {max_model_len} tokens" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=max_model_len)
    assert f"This model's maximum context length is {max_model_len} tokens. However, you requested" in e.value.message


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 404 and "gpt-4" in e.value.message


def test_max_completion_tokens_wins_and_top_logprobs_zero_is_accepted(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7, "max_completion_tokens": 2,
            "ignore_eos": True, "top_logprobs": 0}
    r = requests.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2


def test_continue_final_message_is_assistant_prefill(server):
    messages = [{"role": "user", "content": "Count to five."}, {"role": "assistant", "content": "1, 2, 3,"}]
    tok = requests.post(server.url + "/tokenize", json={"messages": messages, "add_generation_prompt": False,
                                                         "continue_final_message": True}).json()
    text = requests.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"]
    assert text.endswith("1, 2, 3,")
    closed = requests.post(server.url + "/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()
    assert closed["count"] > tok["count"]  # the turn's end marker is gone
    r = requests.post(server.url + "/v1/chat/completions", json={
        "messages": messages, "add_generation_prompt": False, "continue_final_message": True, "max_tokens": 3})
    assert r.status_code == 200, r.text
    both = requests.post(server.url + "/v1/chat/completions", json={"messages": messages, "continue_final_message": True})
    assert both.status_code == 400 and "add_generation_prompt" in both.json()["error"]["message"]


def test_reasoning_is_sent_under_both_names(server):
    think = requests.post(server.url + "/tokenize", json={"prompt": "<think>", "add_special_tokens": False}).json()
    if think["count"] != 1:
        pytest.skip("the served tokenizer has no <think> token")
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
            "logit_bias": {str(think["tokens"][0]): 100}}
    message = requests.post(server.url + "/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert message["reasoning"] == message["reasoning_content"] == "<think><think>"
    r = requests.post(server.url + "/v1/chat/completions", json=dict(body, stream=True), stream=True)
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in r.iter_lines()
              if line.startswith(b"data: {") and json.loads(line[6:])["choices"]]
    assert "".join(d.get("reasoning", "") for d in deltas) == "<think><think>"
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "<think><think>"


def http_exchange(port, data: bytes, expect: int, pause: float = 0.0, timeout: float = 20.0) -> list[bytes]:
    """Sends `data` (byte by byte with `pause` between when pause > 0) and reads until `expect`
    whole responses (Content-Length framed) came back."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        if pause:
            for i in range(len(data)):
                sock.sendall(data[i:i + 1])
                time.sleep(pause)
        else:
            sock.sendall(data)
        buffer, responses = b"", []
        deadline = time.time() + timeout
        while len(responses) < expect and time.time() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buffer += chunk
            while b"\r\n\r\n" in buffer:
                head, rest = buffer.split(b"\r\n\r\n", 1)
                length = int([h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0])
                if len(rest) < length:
                    break
                responses.append(head + b"\r\n\r\n" + rest[:length])
                buffer = rest[length:]
        return responses
    finally:
        sock.close()


def request_bytes(method, path, body=None, extra=""):
    payload = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
    return head.encode() + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload


def test_pipelined_requests_are_all_answered_in_order(server):
    data = (request_bytes("GET", "/health") +
            request_bytes("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}) +
            request_bytes("GET", "/v1/models"))
    start = time.time()
    responses = http_exchange(server.port, data, 3)
    assert len(responses) == 3 and time.time() - start < 15
    assert all(r.startswith(b"HTTP/1.1 200") for r in responses)
    assert b"text_completion" in responses[1] and b'"object":"list"' in responses[2].replace(b" ", b"")
    # One request split across many small writes.
    small = request_bytes("POST", "/tokenize", {"prompt": "hello"})
    responses = http_exchange(server.port, small, 1, pause=0.002)
    assert len(responses) == 1 and b'"count"' in responses[0]


def test_expect_100_continue_gets_the_interim_response(server):
    body = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Expect: 100-continue\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        sock.settimeout(0.5)  # curl waits 1 s before sending the body anyway
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.settimeout(30)
        sock.sendall(body)
        reply = b""
        while b"text_completion" not in reply:
            chunk = sock.recv(65536)
            assert chunk, reply
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200")
    finally:
        sock.close()


def test_cors_defaults_allow_any_origin(server):
    pre = requests.options(server.url + "/v1/chat/completions", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 200
    assert pre.headers["Access-Control-Allow-Origin"] == "*"
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    assert pre.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    r = requests.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                      headers={"Origin": "https://app.example"})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Origin" not in requests.get(server.url + "/health").headers  # no Origin, no CORS


def test_cors_flags_and_the_api_key(build_dir, tiny_models, tmp_path):
    from nibble_server import NibbleServer
    s = NibbleServer(build_dir, tiny_models["a"], tmp_path / "serve.log", "--served-model-name", "tiny",
                     "--allowed-origins", '["https://app.example"]', "--allowed-methods", '["GET", "POST"]',
                     "--allowed-headers", '["Authorization"]', "--allow-credentials", "--api-key", "k3y",
                     "--kv-cache-memory-gb", "1", *SERVE_ARGS)  # a fixed KV budget beside the module's server
    try:
        def preflight(origin, method="POST", headers="authorization"):
            return requests.options(s.url + "/v1/completions", headers={
                "Origin": origin, "Access-Control-Request-Method": method, "Access-Control-Request-Headers": headers})
        ok = preflight("https://app.example")
        assert ok.status_code == 200  # answered before the API key is asked for
        assert ok.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert ok.headers["Access-Control-Allow-Credentials"] == "true" and ok.headers["Vary"] == "Origin"
        assert preflight("https://evil.example").status_code == 400
        assert preflight("https://app.example", method="DELETE").status_code == 400
        assert preflight("https://app.example", headers="x-custom").status_code == 400
        origin = {"Origin": "https://app.example"}
        denied = requests.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}, headers=origin)
        assert denied.status_code == 401  # the key still applies
        assert denied.headers["Access-Control-Allow-Origin"] == "https://app.example"
        allowed = requests.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                                headers=dict(origin, Authorization="Bearer k3y"))
        assert allowed.status_code == 200
        other = requests.post(s.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                              headers={"Origin": "https://evil.example", "Authorization": "Bearer k3y"})
        assert other.status_code == 200 and "Access-Control-Allow-Origin" not in other.headers
    finally:
        assert s.stop() == 0, s.log()


def test_bad_cors_flags_fail_at_start(build_dir, tiny_models, tmp_path):
    import subprocess
    r = subprocess.run([str(build_dir / "nibble"), "serve", "--model", str(tiny_models["a"]), "--port", "0",
                        "--allowed-origins", "https://app.example"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--allowed-origins must be a JSON list" in r.stdout + r.stderr
