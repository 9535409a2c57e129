#!/usr/bin/env python3
"""Structured output against a running `nibble serve` with the standard library only (the GPU
machines have no jsonschema or openai): N constrained requests (a JSON schema, a regex, a choice, a
forced tool call) mixed with unconstrained ones, all in flight together; every constrained output
must parse and satisfy its constraint. Prints one line per kind and exits non-zero on a failure.
Usage: structured_smoke.py [--port 8766] [--n 64] [--rounds 1] (round r seeds its requests r * n + k)"""
import argparse
import concurrent.futures
import json
import re
import sys
import urllib.error
import urllib.request

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}
REGEX = r"[0-9]{3}-[a-z]{2,4}"
CHOICES = ["red", "green", "blue"]
TOOL = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}}
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def post(port, path, body):
    req = urllib.request.Request(f"http://localhost:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:  # the server's error body says what went wrong
        raise AssertionError(f"HTTP {e.code}: {e.read().decode(errors='replace')[:300]}") from None


def check_schema(v):
    assert isinstance(v, dict) and set(v) == {"name", "age", "tags"}, v
    assert isinstance(v["name"], str) and len(v["name"]) <= 12, v
    assert isinstance(v["age"], int) and 0 <= v["age"] <= 120, v
    assert isinstance(v["tags"], list) and len(v["tags"]) <= 3 and all(t in "abc" for t in v["tags"]), v


def one(port, k, seed):
    kind = ["schema", "regex", "choice", "tool", "plain"][k % 5]
    chat = {"messages": [{"role": "user", "content": f"Request {k}."}], "temperature": 1.0,
            "seed": seed, **NO_THINK}
    if kind == "schema":
        out = post(port, "/v1/chat/completions", {**chat, "max_tokens": 120, "response_format": {
            "type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}})
        c = out["choices"][0]
        assert c["finish_reason"] == "stop", c
        try:
            value = json.loads(c["message"]["content"])
        except json.JSONDecodeError as e:
            raise AssertionError(f"{e}: {c['message']['content']!r}") from None
        check_schema(value)
    elif kind == "regex":
        out = post(port, "/v1/completions", {"prompt": f"id {k}:", "max_tokens": 20, "temperature": 1.0,
                                             "seed": seed, "structured_outputs": {"regex": REGEX}})
        assert re.fullmatch(REGEX, out["choices"][0]["text"]), out
    elif kind == "choice":
        out = post(port, "/v1/completions", {"prompt": "colour:", "max_tokens": 8, "temperature": 1.0,
                                             "seed": seed, "guided_choice": CHOICES})
        assert out["choices"][0]["text"] in CHOICES, out
    elif kind == "tool":
        out = post(port, "/v1/chat/completions", {**chat, "max_tokens": 80, "tools": [TOOL], "tool_choice": "required",
                                                  "parallel_tool_calls": False})
        calls = out["choices"][0]["message"]["tool_calls"]
        assert len(calls) == 1 and calls[0]["function"]["name"] == "add", out
        args = json.loads(calls[0]["function"]["arguments"])
        assert set(args) == {"a", "b"} and all(0 <= args[x] <= 99 for x in "ab"), args
    else:
        out = post(port, "/v1/chat/completions", {**chat, "max_tokens": 64})
        assert out["choices"][0]["message"]["content"] is not None, out
    return kind


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    passed, failed = {}, []
    for r in range(a.rounds):
        with concurrent.futures.ThreadPoolExecutor(a.n) as pool:
            futures = {pool.submit(one, a.port, k, r * a.n + k): r * a.n + k for k in range(a.n)}
            for f in concurrent.futures.as_completed(futures):
                try:
                    kind = f.result()
                    passed[kind] = passed.get(kind, 0) + 1
                except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the others
                    failed.append(f"request {futures[f]} (its seed): {e!r}"[:500])
    print("structured smoke: passed " + ", ".join(f"{k} {v}" for k, v in sorted(passed.items())) +
          f"; failed {len(failed)}")
    for line in failed[:8]:
        print("  " + line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
