"""The shipped default model (data/default-model, issue 18): a ModelOpt NVFP4 checkpoint of at most
16 MB that `nibble serve` serves when no --model is given, and that answers held-apart GSM8K-like
problems (a generator seed other than its training seed 0), greedy, on the CPU backend: 8-shot
completions through `nibble eval gsm8k` (SGLang's format) and plain chat turns."""
import json
import re
import subprocess
import sys

import requests
from transformers import AutoTokenizer

from conftest import REPO
from nibble_server import NibbleServer

MODEL = REPO / "data" / "default-model"
# Measured on 1,319 held-apart questions (docs/numerics.md): 0.88 W4A16 on the CPU backend. The issue's
# bar is 0.5; on 80 questions one binomial standard deviation is ~0.04, so missing it is a real regression.
MIN_ACCURACY = 0.5


def held_apart_seed(seed: int) -> int:
    return seed if seed != 0 else 1  # the training problems come from seed 0


def test_default_model_is_a_small_modelopt_nvfp4_checkpoint(build_dir):
    size = sum(f.stat().st_size for f in MODEL.iterdir())
    assert size <= 16 * 2**20, size
    assert json.loads((MODEL / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == "NVFP4"
    report = json.loads(subprocess.run([str(build_dir / "nibble"), "inspect", str(MODEL), "--json"], check=True,
                                       capture_output=True, text=True).stdout)
    assert report["problems"] == []
    assert "train_tiny_moe.py" in (MODEL / "README.md").read_text()


def test_chat_requests_render_to_the_trained_text(build_dir, tmp_path):
    """A chat request renders (transformers' apply_chat_template and nibble's renderer alike) to exactly
    the ChatML text the model was trained on, up to the start of its answer."""
    sys.path.insert(0, str(REPO / "scripts"))
    from train_tiny_moe import chat_block
    question = "A box holds 12 pencils. Liam fills 7 boxes. How many pencils are in the boxes altogether?"
    trained = chat_block({"question": question, "answer": "ANSWER"}).split("ANSWER")[0]
    messages = [{"role": "user", "content": question}]
    assert AutoTokenizer.from_pretrained(str(MODEL)).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True) == trained
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"messages": messages}))
    rendered = subprocess.run([str(build_dir / "nibble"), "render-chat", "--model", str(MODEL), "--request", str(request)],
                              check=True, capture_output=True, text=True).stdout
    assert rendered == trained


def test_default_serve_answers_held_apart_problems(build_dir, tmp_path, seed):
    data = tmp_path / "heldout.jsonl"
    subprocess.run([str(build_dir / "nibble"), "eval", "make-gsm8k-like", "--out", str(data), "--n", "120",
                    "--seed", str(held_apart_seed(seed))], check=True, capture_output=True)
    server = NibbleServer(build_dir, None, tmp_path / "serve.log", "--backend", "cpu")
    try:
        assert [m["id"] for m in requests.get(server.url + "/v1/models", timeout=10).json()["data"]] == \
            ["nibble-tiny-moe-gsm8k"]
        r = subprocess.run([str(build_dir / "nibble"), "eval", "gsm8k", "--data", str(data), "--num-questions", "80",
                            "--parallel", "80", "--port", str(server.port)], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr
        accuracy = float(re.search(r"Accuracy: ([0-9.]+)", r.stdout).group(1))
        invalid = float(re.search(r"Invalid: ([0-9.]+)", r.stdout).group(1))
        print(r.stdout)
        assert accuracy >= MIN_ACCURACY and invalid <= 0.1, r.stdout

        # Chat: the model was trained on ChatML turns too, so a bare question gets a worked answer.
        items = [json.loads(line) for line in data.read_text().splitlines()][80:100]
        right = 0
        for item in items:
            reply = requests.post(server.url + "/v1/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": item["question"]}], "temperature": 0, "max_tokens": 200}).json()
            choice = reply["choices"][0]
            assert choice["finish_reason"] == "stop", choice  # it ends its turn (<|im_end|>)
            numbers = re.findall(r"\d+", choice["message"]["content"].replace(",", ""))
            right += bool(numbers) and numbers[-1] == item["answer"].split("#### ")[-1]
        print(f"chat: {right}/{len(items)} right")
        assert right >= MIN_ACCURACY * len(items)
    finally:
        assert server.stop() == 0, server.log()
