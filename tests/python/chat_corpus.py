"""Seeded chat requests covering what chat templates branch on: system prompts, multi-turn
conversations, tools with tool_calls and tool responses, reasoning_content and <think> blocks,
enable_thinking on/off, add_generation_prompt on/off, documents, odd content."""
import json
import random

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "description": "City name"},
                                          "unit": {"type": "string", "enum": ["c", "f"]}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web (日本語 ok)",
                                      "parameters": {"type": "object", "properties": {
                                          "query": {"type": "string"}, "limit": {"type": "integer", "default": 5},
                                          "score": {"type": "number", "minimum": 0.5}}}}},
]
TEXTS = ["Hi!", "What's 2+2?", "  padded question  ", "Explain NVFP4 in one line.", "多语言：你好 😀",
         "line one\nline two\n", "Quote \"this\" and 'that' \\ backslash", "", "<tool_response>\nx\n</tool_response>"]


def tool_call(rng):
    tool = rng.choice(TOOLS)["function"]["name"]
    args = {"city": rng.choice(["Paris", "東京", "São Paulo"]), "unit": "c"} if tool == "get_weather" \
        else {"query": "nvfp4 hopper", "limit": rng.randint(1, 9), "score": 0.75}
    return {"id": f"call_{rng.randint(0, 9999)}", "type": "function",
            "function": {"name": tool, "arguments": json.dumps(args) if rng.random() < 0.5 else args}}


def conversation(rng: random.Random) -> dict:
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(["You are helpful.", "Be brief.\n", "系统提示"])})
    for turn in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": rng.choice(TEXTS)})
        if turn == 0 and rng.random() < 0.3:
            continue
        kind = rng.random()
        if kind < 0.3:  # a tool round trip
            calls = [tool_call(rng) for _ in range(rng.randint(1, 2))]
            messages.append({"role": "assistant", "content": rng.choice(["", "Let me check."]), "tool_calls": calls})
            for _ in calls:
                messages.append({"role": "tool", "content": json.dumps({"ok": True, "value": rng.randint(0, 99)})})
            messages.append({"role": "assistant", "content": "Done: " + rng.choice(TEXTS)})
        elif kind < 0.5:
            messages.append({"role": "assistant", "content": "Answer.", "reasoning_content": "I thought.\n"})
        elif kind < 0.65:
            messages.append({"role": "assistant", "content": "<think>\nstep by step\n</think>\n\nThe answer."})
        else:
            messages.append({"role": "assistant", "content": rng.choice(TEXTS)})
    if rng.random() < 0.3 and messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "And now?"})
    request = {"messages": messages, "add_generation_prompt": rng.random() < 0.8}
    if rng.random() < 0.4:
        request["tools"] = TOOLS[: rng.randint(1, 2)]
    if rng.random() < 0.5:
        request["chat_template_kwargs"] = {"enable_thinking": rng.random() < 0.5}
    if rng.random() < 0.2:
        request["documents"] = [{"title": "Doc", "text": "Some reference text that is fairly long indeed."},
                                {"text": "untitled doc"}]
    return request


def requests(seed: int, n: int = 120) -> list[dict]:
    rng = random.Random(seed)
    return [conversation(rng) for _ in range(n)]
