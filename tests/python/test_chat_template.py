"""Chat templates rendered by nibble's Jinja interpreter against transformers' apply_chat_template
(jinja2) with the same template: the real Qwen3 template and a Llama-3-style template from
tests/data, on ≥ 50 seeded conversations each; errors raised by the template are errors in both."""
import json
import random
import shutil
import subprocess

import pytest
from transformers import AutoTokenizer

import chat_corpus
from test_checkpoints import REPO, nibble

QWEN = REPO / "data/qwen3-tokenizer"


def hf_render(tokenizer, request, template=None):
    kwargs = dict(request.get("chat_template_kwargs") or {})
    try:
        return {"prompt": tokenizer.apply_chat_template(
            request["messages"], tools=request.get("tools"), documents=request.get("documents"),
            add_generation_prompt=request.get("add_generation_prompt", True), tokenize=False,
            chat_template=template, **kwargs)}
    except Exception as e:  # noqa: BLE001 - any template error
        return {"error": str(e)}


def ours(build_dir, model_dir, requests):
    text = "\n".join(json.dumps(r) for r in requests) + "\n"
    proc = subprocess.run([str(build_dir / "tests/chat_tool"), str(model_dir)], input=text, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.split("\n")[:-1]]


@pytest.fixture(scope="module")
def requests():
    seed = random.SystemRandom().randrange(2**31)
    print(f"[seed] chat corpus: {seed}")
    return chat_corpus.requests(seed)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama_style")
    shutil.copy(QWEN / "tokenizer.json", d / "tokenizer.json")
    config = json.loads((QWEN / "tokenizer_config.json").read_text())
    config["bos_token"] = "<|begin_of_text|>"
    config.pop("chat_template")
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    shutil.copy(REPO / "tests/data/llama3_style_chat_template.jinja", d / "chat_template.jinja")
    return d


@pytest.mark.parametrize("family", ["qwen3", "llama3_style"])
def test_templates_match_transformers(build_dir, requests, llama_dir, family):
    model_dir = QWEN if family == "qwen3" else llama_dir
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    template = (model_dir / "chat_template.jinja").read_text() if family != "qwen3" else None
    expected = [hf_render(tokenizer, r, template) for r in requests]
    got = ours(build_dir, model_dir, requests)
    n_prompts = sum("prompt" in e for e in expected)
    assert n_prompts >= 50
    for r, e, g in zip(requests, expected, got):
        if "error" in e:
            assert "error" in g, f"transformers raised {e['error']!r}, nibble rendered for {r}"
        else:
            assert g.get("prompt") == e["prompt"], f"request {json.dumps(r)}\nnibble: {g!r}\nhf: {e['prompt']!r}"


def test_template_errors_are_clear(build_dir, llama_dir, tmp_path):
    bad_role = {"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}
    (tmp_path / "r.json").write_text(json.dumps(bad_role))
    proc = nibble(build_dir, "render-chat", "--model", llama_dir, "--request", tmp_path / "r.json", check=False)
    assert proc.returncode == 1 and "Unsupported role: robot" in proc.stderr
    (tmp_path / "r.json").write_text(json.dumps({"messages": "nope"}))
    proc = nibble(build_dir, "render-chat", "--model", QWEN, "--request", tmp_path / "r.json", check=False)
    assert proc.returncode == 1 and "'messages' must be a list" in proc.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% if x %}unclosed"}))
    (tmp_path / "ok.json").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    proc = nibble(build_dir, "render-chat", "--model", broken, "--request", tmp_path / "ok.json", check=False)
    assert proc.returncode == 1 and "missing {% endif %}" in proc.stderr
