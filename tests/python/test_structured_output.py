"""Structured output through the server: OpenAI's response_format (json_schema, json_object) and the
openai client's parse(), tool_choice "required" and a named function, vLLM's structured_outputs and
guided_* fields, SGLang's json_schema / regex / ebnf; 32 schemas greedy and sampled whose outputs must
parse and validate (jsonschema), regexes that must fullmatch, choices, an EBNF grammar; bad constraints
as 400s naming the field; constrained and unconstrained requests mixed; a fuzzed schema path. The
tiny random model has no idea what JSON is: every valid output here is the grammar's doing."""
import concurrent.futures
import json
import random
import re

import jsonschema
import openai
import pydantic
import pytest
import requests

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}  # the grammar applies from the first token

# Schemas whose every sentence is finite (bounded strings, numbers, arrays), so that a random model,
# forced by the grammar, must finish within max_tokens: each output must then parse and validate.
WORD = {"type": "string", "maxLength": 6}
SCHEMAS = [
    {"type": "boolean"},
    {"type": "integer", "minimum": -5, "maximum": 40},
    {"type": "string", "enum": ["red", "green", "blue"]},
    {"const": "fixed"},
    {"type": "null"},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {"type": "object", "properties": {"name": WORD, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                      "b": {"type": "boolean"}},
     "required": ["a"], "additionalProperties": False},  # b optional
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 1, "maxItems": 3},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2},
    {"type": "array", "items": WORD, "maxItems": 2},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["x", "y", "z"]}, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"inner": {"type": "object", "properties": {"v": {"type": "boolean"}},
                                                "required": ["v"], "additionalProperties": False}},
     "required": ["inner"], "additionalProperties": False},
    {"anyOf": [{"type": "boolean"}, {"type": "integer", "minimum": 0, "maximum": 3}]},
    {"anyOf": [{"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"],
                "additionalProperties": False},
               {"type": "object", "properties": {"kind": {"const": "b"}, "n": {"type": "integer", "minimum": 1,
                                                                              "maximum": 2}},
                "required": ["kind", "n"], "additionalProperties": False}]},
    {"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                       "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                      "required": ["x", "y"], "additionalProperties": False}},
     "type": "object", "properties": {"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}},
     "required": ["from", "to"], "additionalProperties": False},
    {"type": "string", "pattern": "^[a-c]{2,4}$"},
    {"type": "string", "pattern": "^[0-9]{3}-[0-9]{2}$"},
    {"type": "string", "minLength": 2, "maxLength": 4},
    {"type": "integer", "minimum": 100, "maximum": 199},
    {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
    {"type": "object", "properties": {"level": {"enum": ["low", "mid", "high"]}, "score": {"enum": [1, 2, 3]}},
     "required": ["level", "score"], "additionalProperties": False},
    {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}, "label": WORD,
                                      "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
     "required": ["id", "label", "flags"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"k": {"enum": ["p", "q"]}}, "required": ["k"],
                                "additionalProperties": False}, "minItems": 1, "maxItems": 2},
    {"type": "object", "properties": {}, "additionalProperties": False},
    {"type": "array", "maxItems": 0},
    {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}, "required": ["d"],
     "additionalProperties": False},
    {"enum": [True, None, 7, "seven"]},
    {"type": ["integer", "null"], "minimum": 0, "maximum": 5},
    {"type": "object", "properties": {"opt1": {"type": "boolean"}, "opt2": {"type": "null"}},
     "additionalProperties": False},  # nothing required
    {"type": "array", "prefixItems": [{"type": "boolean"}, {"enum": ["u", "v"]}], "items": False},
    {"type": "object", "properties": {"outer": {"type": "array", "items": {"type": "array", "items": {
        "type": "integer", "minimum": 0, "maximum": 1}, "maxItems": 2}, "maxItems": 2}},
     "required": ["outer"], "additionalProperties": False},
]


def chat(server, body: dict, timeout=120) -> requests.Response:
    base = {"model": "tiny", "messages": [{"role": "user", "content": "Answer in JSON."}], **NO_THINK}
    return requests.post(server.url + "/v1/chat/completions", json={**base, **body}, timeout=timeout)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_every_schema_output_parses_and_validates(server, seed):
    assert len(SCHEMAS) >= 30

    def one(i_schema_greedy):
        i, schema, greedy = i_schema_greedy
        body = {"max_tokens": 200, "temperature": 0 if greedy else 1.0, "seed": seed + i,
                "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}}}
        r = chat(server, body)
        assert r.status_code == 200, (i, r.text)
        choice = r.json()["choices"][0]
        text = choice["message"]["content"]
        assert choice["finish_reason"] == "stop", (i, schema, text)
        value = json.loads(text)
        jsonschema.validate(value, schema)
        return text

    cases = [(i, s, g) for i, s in enumerate(SCHEMAS) for g in (True, False)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outputs = list(pool.map(one, cases))
    assert len(set(outputs)) > len(SCHEMAS) // 2  # the grammar constrains; it does not pick one answer


def test_object_properties_come_in_the_schemas_order(server):
    schema = {"type": "object", "properties": {"zeta": {"type": "boolean"}, "alpha": {"type": "boolean"}},
              "required": ["zeta", "alpha"], "additionalProperties": False}
    r = chat(server, {"max_tokens": 40, "temperature": 0,
                      "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}})
    text = r.json()["choices"][0]["message"]["content"]
    assert text.index('"zeta"') < text.index('"alpha"'), text


def test_json_object_starts_an_object(server, seed):
    for temperature in (0, 1.0):
        r = chat(server, {"max_tokens": 60, "temperature": temperature, "seed": seed,
                          "response_format": {"type": "json_object"}})
        choice = r.json()["choices"][0]
        text = choice["message"]["content"]
        assert text.startswith("{"), text
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict)


class Answer(pydantic.BaseModel):
    verdict: bool
    confidence: int = pydantic.Field(ge=0, le=10)
    label: str = pydantic.Field(max_length=5)


def test_openai_client_parse_returns_the_pydantic_object(client):
    completion = client.chat.completions.parse(
        model="tiny", messages=[{"role": "user", "content": "Judge."}], response_format=Answer, max_tokens=80,
        temperature=0, extra_body=NO_THINK)
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Answer)
    assert 0 <= parsed.confidence <= 10 and len(parsed.label) <= 5


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                         "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["a", "b"], "additionalProperties": False}}},
]


def check_calls(calls):
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in calls:
        assert call.function.name in by_name
        jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name])


def test_tool_choice_required_and_named_yield_valid_calls(client, seed):
    for temperature in (0, 1.0):
        c = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "What is 2 + 3?"}], tools=TOOLS,
            tool_choice="required", max_tokens=160, temperature=temperature, seed=seed, extra_body=NO_THINK)
        calls = c.choices[0].message.tool_calls
        assert calls, c
        if c.choices[0].finish_reason != "length":
            check_calls(calls)
    named = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather?"}], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=80, temperature=0.7, seed=seed,
        extra_body=NO_THINK)
    calls = named.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "add", named
    check_calls(calls)
    single = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Two things?"}], tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=160, temperature=1.0, seed=seed, extra_body=NO_THINK)
    assert len(single.choices[0].message.tool_calls) == 1


REGEXES = [r"[0-9]{3}-[a-z]{2}", r"(yes|no|maybe)", r"[A-Z][a-z]{1,5} [0-9]{1,2}", r"0x[0-9a-f]{4}",
           r"(ab|cd){2,3}!"]


def test_vllm_fields_on_completions_and_chat(server, seed):
    url = server.url + "/v1/completions"
    for i, pattern in enumerate(REGEXES):
        for fields in ({"structured_outputs": {"regex": pattern}}, {"guided_regex": pattern}):
            r = requests.post(url, json={"model": "tiny", "prompt": "x", "max_tokens": 30, "temperature": 1.0,
                                         "seed": seed + i, **fields}, timeout=60).json()
            assert re.fullmatch(pattern, r["choices"][0]["text"]), (pattern, r)
    choices = ["alpha", "beta", "gamma delta", "ε"]
    for fields in ({"structured_outputs": {"choice": choices}}, {"guided_choice": choices}):
        for t in range(3):
            r = requests.post(url, json={"model": "tiny", "prompt": "y", "max_tokens": 10, "temperature": 1.0,
                                         "seed": seed + t, **fields}, timeout=60).json()
            assert r["choices"][0]["text"] in choices, r
    schema = SCHEMAS[6]
    for fields in ({"structured_outputs": {"json": schema}}, {"guided_json": schema},
                   {"guided_json": json.dumps(schema)}):
        r = requests.post(url, json={"model": "tiny", "prompt": "z", "max_tokens": 60, "temperature": 0, **fields},
                          timeout=60).json()
        jsonschema.validate(json.loads(r["choices"][0]["text"]), schema)
    r = chat(server, {"max_tokens": 40, "temperature": 0, "structured_outputs": {"json_object": True}}).json()
    assert r["choices"][0]["message"]["content"].startswith("{")
    r = chat(server, {"max_tokens": 20, "temperature": 0.8, "guided_choice": ["up", "down"]}).json()
    assert r["choices"][0]["message"]["content"] in ("up", "down")


# An EBNF grammar (vLLM's `grammar`, SGLang's `ebnf`) and the same language as a Python regex.
EBNF = 'root ::= animal (" and " animal)? "."\nanimal ::= "cat" | "dog" | "bird" [s]?'
EBNF_REGEX = r"(cat|dog|birds?)( and (cat|dog|birds?))?\."


def test_ebnf_outputs_parse(server, seed):
    for t in range(4):
        r = requests.post(server.url + "/v1/completions", json={
            "model": "tiny", "prompt": "Animals:", "max_tokens": 20, "temperature": 1.0, "seed": seed + t,
            "structured_outputs": {"grammar": EBNF}}, timeout=60).json()
        assert re.fullmatch(EBNF_REGEX, r["choices"][0]["text"]), r


def test_sglang_generate_sampling_params(server, seed):
    url = server.url + "/generate"
    schema = SCHEMAS[15]
    out = requests.post(url, json={"text": "go", "sampling_params": {
        "max_new_tokens": 80, "temperature": 0, "json_schema": json.dumps(schema)}}, timeout=60).json()
    jsonschema.validate(json.loads(out["text"]), schema)
    out = requests.post(url, json={"text": "go", "sampling_params": {
        "max_new_tokens": 20, "temperature": 1.0, "regex": REGEXES[0]}}, timeout=60).json()
    assert re.fullmatch(REGEXES[0], out["text"]), out
    out = requests.post(url, json={"text": "go", "sampling_params": {
        "max_new_tokens": 20, "temperature": 1.0, "ebnf": EBNF}}, timeout=60).json()
    assert re.fullmatch(EBNF_REGEX, out["text"]), out


def test_a_constraint_cut_by_max_tokens_ends_with_length_and_the_text_so_far(server):
    r = chat(server, {"max_tokens": 3, "temperature": 0,
                      "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMAS[22]}}})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"].startswith("{")
    assert r.json()["usage"]["completion_tokens"] == 3


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": "root ::= missing_rule"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
]


def test_bad_constraints_are_400s_naming_the_field_and_the_server_keeps_serving(server):
    for body, field in BAD:
        r = chat(server, {"max_tokens": 5, **body})
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert error["param"] == field, (body, error)
    r = chat(server, {"max_tokens": 5})
    assert r.status_code == 200


def nested_arrays(levels):
    schema = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


OVER_BUDGET = [  # past src/grammar/constraint_budget.h's bounds: refused before any compile
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": nested_arrays(100)}}},
     "response_format", "nests 101 levels deep"),
    ({"structured_outputs": {"json": {"type": "object",
                                      "properties": {f"p{i}": {"type": "string"} for i in range(300)}}}},
     "structured_outputs.json", "300 optional properties"),
    ({"structured_outputs": {"regex": "([a-z]{1,100}[0-9]{1,100}){1,9}"}}, "structured_outputs.regex",
     "bounds repetitions of"),
    ({"guided_grammar": "root ::= " + " | ".join(f'"w{i}"' for i in range(12000))}, "guided_grammar", "bytes long"),
]


def test_constraints_past_the_compile_budget_are_400s_naming_the_bound(server):
    for body, field, bound in OVER_BUDGET:
        r = chat(server, {"max_tokens": 5, **body})
        assert r.status_code == 400, (field, r.text)
        error = r.json()["error"]
        assert error["param"] == field and bound in error["message"], (field, error)
    assert chat(server, {"max_tokens": 5}).status_code == 200


def test_constrained_and_unconstrained_requests_mixed(server, seed):
    """Unconstrained greedy outputs are the same beside constrained requests as alone: the masks touch
    only their own rows. Compared up to the first token whose lead over the runner-up (alone) is under
    0.1 nats: on the GPU a batch's kernels round differently from one row's, which may flip a near tie
    (a leaked mask would change a clear-margin token)."""
    plain = {"max_tokens": 24, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    alone = [chat(server, {**plain, "messages": [{"role": "user", "content": f"Topic {k}."}]}).json()
             for k in range(4)]

    def clear_tokens(out, like=None):
        content = out["choices"][0]["logprobs"]["content"]
        if like is not None:
            return [t["token"] for t in content[:len(like)]]
        tokens = []
        for t in content:
            top = t["top_logprobs"]
            if len(top) > 1 and top[0]["logprob"] - top[1]["logprob"] < 0.1:
                break
            tokens.append(t["token"])
        return tokens

    def constrained(k):
        return chat(server, {"max_tokens": 120, "temperature": 1.0, "seed": seed + k,
                             "response_format": {"type": "json_schema",
                                                 "json_schema": {"name": "m", "schema": SCHEMAS[k % 8 + 5]}}}).json()

    def unconstrained(k):
        return chat(server, {**plain, "messages": [{"role": "user", "content": f"Topic {k}."}]}).json()

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        c = [pool.submit(constrained, k) for k in range(8)]
        u = [pool.submit(unconstrained, k) for k in range(4)]
        for k, f in enumerate(c):
            out = f.result()
            jsonschema.validate(json.loads(out["choices"][0]["message"]["content"]), SCHEMAS[k % 8 + 5])
        for k, f in enumerate(u):
            want = clear_tokens(alone[k])
            assert clear_tokens(f.result(), want) == want, k


def test_fuzzed_schemas_never_break_the_server(server, seed):
    rng = random.Random(seed)
    keys = ["type", "properties", "items", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "pattern",
            "minItems", "maxItems", "minimum", "maximum", "required", "additionalProperties", "format", "not",
            "minLength", "maxLength", "$defs", "if", "then"]
    values = [None, True, False, 0, -1, 3, 2 ** 40, 1.5, "", "string", "object", "array", "integer", "#/$defs/x",
              "[a-", "^(a|b)*$", [], ["a"], {}]

    def random_value(depth):
        kind = rng.randrange(4 if depth < 3 else 1)
        if kind == 1:
            return {rng.choice(keys): random_value(depth + 1) for _ in range(rng.randrange(1, 4))}
        if kind == 2:
            return [random_value(depth + 1) for _ in range(rng.randrange(0, 3))]
        return rng.choice(values)

    statuses = {}
    for i in range(60):
        schema = {rng.choice(keys): random_value(1) for _ in range(rng.randrange(1, 4))}
        r = requests.post(server.url + "/v1/completions", json={
            "model": "tiny", "prompt": "f", "max_tokens": 8, "temperature": 1.0, "seed": i, "guided_json": schema},
            timeout=120)
        assert r.status_code in (200, 400), (schema, r.status_code, r.text)
        if r.status_code == 400:
            assert r.json()["error"]["param"] == "guided_json"
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    print("fuzzed schemas by status:", statuses)


def test_grammar_metrics(server):
    text = requests.get(server.url + "/metrics", timeout=10).text
    rows = [line for line in text.splitlines() if line.startswith("nibble:grammar_mask_rows_total")]
    assert rows and float(rows[0].split()[-1]) > 0
    assert "nibble:grammar_compile_cache_hits_total" in text


def test_a_reasoning_model_thinks_freely_then_follows_the_grammar(server, seed):
    """With thinking left open (Qwen3's template by default), the first token may open <think>; what
    follows </think> — or the whole output when it does not open with <think> — is the grammar's."""
    for t in range(3):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Think, then answer."}], "max_tokens": 40,
                "temperature": 1.0, "seed": seed + t,
                "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMAS[5]}}}
        r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        content = (message.get("content") or "").lstrip()
        assert message.get("reasoning_content") or content.startswith("{"), message
        if r.json()["choices"][0]["finish_reason"] == "stop" and content:
            jsonschema.validate(json.loads(content), SCHEMAS[5])


def test_strict_tools_under_auto_constrain_the_calls_the_model_opens(server, client, seed):
    """tool_choice auto with "strict": true: free text, but a <tool_call> the model opens must name a
    tool, and a strict tool's arguments follow its schema. The random model rarely opens one by itself:
    a logit_bias on the <tool_call> token makes it open one whenever the grammar lets it."""
    ids = requests.post(server.url + "/tokenize", json={"model": "tiny", "prompt": "<tool_call>"}, timeout=10)
    tokens = ids.json()["tokens"]
    assert len(tokens) == 1, tokens
    strict = [{**TOOLS[1], "function": {**TOOLS[1]["function"], "strict": True}},
              {**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}]
    seen = 0
    for t in range(3):
        c = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Add."}], tools=strict, tool_choice="auto",
            max_tokens=120, temperature=1.0, seed=seed + t, logit_bias={str(tokens[0]): 100},
            extra_body=NO_THINK)
        calls = c.choices[0].message.tool_calls or []
        complete = calls if c.choices[0].finish_reason != "length" else calls[:-1]
        check_calls(complete)
        seen += len(complete)
    assert seen > 0
    bad = requests.post(server.url + "/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
        "tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "nonsense"}}}]},
        timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tools", bad.text
