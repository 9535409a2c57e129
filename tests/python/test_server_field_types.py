"""Every request field a route reads, set to a value of every JSON type, gets a 200 (a field the
route ignores, or a value it accepts), a 400 in the OpenAI error shape whose message is ours (a 404
for a model name it does not serve), never
a JSON library's ("type_error", "json.exception"), a 500 or a dropped connection; the server answers
normally after the ~1,400 requests."""
import json

import requests

MSG = [{"role": "user", "content": "hi"}]
WRONG = ["x", [1], {"a": 1}, None, True, -5, 1e30, 3.5, "", [], {}]
CHAT_FIELDS = [
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "n",
    "stream_options", "stop", "stop_token_ids", "seed", "logprobs", "top_logprobs", "logit_bias",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "ignore_eos", "skip_special_tokens",
    "tools", "tool_choice", "parallel_tool_calls", "response_format", "structured_outputs", "guided_json",
    "guided_regex", "guided_choice", "guided_grammar", "chat_template_kwargs", "add_generation_prompt",
    "continue_final_message", "user", "prompt_logprobs", "include_stop_str_in_output", "echo", "reasoning_effort",
    "metadata", "store", "service_tier", "spaces_between_special_tokens", "return_tokens_as_token_ids"]
COMPLETION_FIELDS = [
    "prompt", "max_tokens", "temperature", "echo", "suffix", "best_of", "logprobs", "n", "stop", "stream_options",
    "seed", "logit_bias", "prompt_logprobs", "top_k", "min_tokens", "structured_outputs", "guided_json",
    "response_format"]
GENERATE_FIELDS = ["text", "input_ids", "sampling_params", "rid", "return_logprob", "top_logprobs_num",
                   "logprob_start_len", "return_text_in_logprobs"]
SAMPLING_PARAMS = ["max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop",
                   "stop_token_ids", "json_schema", "regex", "ebnf", "n", "ignore_eos", "no_stop_trim",
                   "skip_special_tokens", "frequency_penalty", "presence_penalty", "repetition_penalty"]


# null where a length limit is read means no limit (the context's): a long generation, not an error.
UNLIMITED = {"max_tokens", "max_completion_tokens", "max_new_tokens"}


def wrong_values(field):
    return [w for w in WRONG if not (w is None and field in UNLIMITED)]


def bodies():
    for field in CHAT_FIELDS:
        for w in wrong_values(field):
            yield "/v1/chat/completions", {"messages": MSG, "max_tokens": 3, field: w}
    for field in COMPLETION_FIELDS:
        for w in wrong_values(field):
            yield "/v1/completions", {"prompt": "hi", "max_tokens": 3, field: w}
    for field in GENERATE_FIELDS:
        for w in WRONG:
            yield "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 3}, field: w}
    for field in SAMPLING_PARAMS:
        for w in wrong_values(field):
            yield "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 3, field: w}}
    for w in WRONG:  # inside messages, tools and constraints
        for messages in ([{"role": "user", "content": w}], [{"role": w, "content": "hi"}], [w],
                         [{"role": "user", "content": [{"type": "text", "text": w}]}],
                         [{"role": "user", "content": [{"type": w, "text": "a"}]}],
                         [{"role": "assistant", "content": None, "tool_calls": [w]}, MSG[0]],
                         [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": w}}]}, MSG[0]]):
            yield "/v1/chat/completions", {"messages": messages, "max_tokens": 3}
        for extra in ({"tools": [w]}, {"tools": [{"type": "function", "function": w}]},
                      {"tools": [{"type": "function", "function": {"name": w}}]},
                      {"tools": [{"type": "function", "function": {"name": "f", "parameters": w}}],
                       "tool_choice": "required"},
                      {"response_format": {"type": "json_schema", "json_schema": w}},
                      {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": w}}},
                      {"stream": True, "stream_options": {"include_usage": w}}):
            yield "/v1/chat/completions", {"messages": MSG, "max_tokens": 3, **extra}
    for path in ("/tokenize", "/detokenize", "/abort_request", "/update_weights_from_disk", "/flush_cache"):
        for w in WRONG:
            yield path, {"prompt": w, "tokens": w, "rid": w, "model_path": w, "model": w, "messages": w}


def test_every_field_of_every_type_is_accepted_or_a_clear_400(server):
    checked = 0
    for path, body in bodies():
        r = requests.post(server.url + path, json=body, timeout=60)
        checked += 1
        allowed = (200, 400, 404) if isinstance(body.get("model"), str) else (200, 400)
        assert r.status_code in allowed, (path, json.dumps(body)[:200], r.status_code, r.text[:300])
        assert "type_error" not in r.text and "json.exception" not in r.text, (path, body, r.text[:300])
        if r.status_code != 200 and "error" in r.json():
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text
    assert checked > 1000
    ok = requests.post(server.url + "/v1/chat/completions", json={"messages": MSG, "max_tokens": 3})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]
