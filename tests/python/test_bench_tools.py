"""`nibble bench serve` and `nibble eval gsm8k` against a scripted mock server whose latencies and
answers are known (every printed number is checked: the aggregation exactly against numpy from the
saved per-request data, the timings against the script within scheduling jitter), and against
`nibble serve` itself; `nibble eval make-gsm8k-like` checked for GSM8K's format and correct sums."""
import asyncio
import json
import pathlib
import random
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
import requests

from conftest import REPO

TTFT_S, ITL_S, FAIL_EVERY = 0.120, 0.040, 5  # mock: first token after 120 ms, then one per 40 ms; every 5th request fails
# A prompt holding this fails too. Long and bracketed: random-token prompts held "FAIL" for seed 1720983024.
FAIL_MARKER = "[[scripted failure]]"
# Scheduling and loopback delays: the mock runs in a Python thread beside pytest on a 2-core CI
# machine, so medians can land tens of ms late (never early: the script's sleeps are lower bounds).
JITTER_S = 0.100


def server_arrival_time(request: int, chunk: int) -> float:
    """The mock's scripted FastDeploy arrival_time (s since inference start) of a request's chunk."""
    return 0.001 * request + S_ITL_S * chunk


S_ITL_S = 0.020  # the mock's server-side gap between chunks


class MockServer:
    """An OpenAI-style server in a thread: streamed completions with scripted timing, and
    non-streamed completions that answer GSM8K questions right, wrong or not at all."""

    def __init__(self, answers: dict[str, str] | None = None, fail_every: int = FAIL_EVERY):
        self.answers = answers or {}
        self.fail_every = fail_every
        self.count = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)

    async def _handle(self, reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        first = head.split(b"\r\n")[0].decode()
        length = int(re.search(rb"Content-Length: (\d+)", head, re.I).group(1)) if b"Content-Length" in head else 0
        body = json.loads(await reader.readexactly(length)) if length else {}
        path = first.split()[1]

        async def send(status: int, payload: dict):
            data = json.dumps(payload).encode()
            writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (status, len(data), data))
            await writer.drain()
        if path == "/v1/models":
            await send(200, {"object": "list", "data": [{"id": "mock"}]})
        elif path == "/v1/completions" and body.get("stream"):
            self.count += 1
            k = self.count  # this request's number (others arrive while it streams)
            if (self.fail_every and k % self.fail_every == 0) or FAIL_MARKER in body.get("prompt", ""):
                await send(500, {"error": {"message": "scripted failure", "code": 500}})
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                             b"Connection: close\r\n\r\n")

                def chunk(payload):
                    data = b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"
                    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await asyncio.sleep(TTFT_S)
                for i in range(body["max_tokens"]):
                    if i:
                        await asyncio.sleep(ITL_S)
                    chunk({"choices": [{"index": 0, "text": "tok ", "finish_reason": None,
                                        "arrival_time": server_arrival_time(k, i)}]})
                    await writer.drain()
                chunk({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": body["max_tokens"]}})
                chunk(b"[DONE]")
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        elif path == "/v1/completions":
            question = body["prompt"].rsplit("Question: ", 1)[1].rsplit("\nAnswer:", 1)[0]
            await send(200, {"choices": [{"index": 0, "text": self.answers.get(question, "no idea"),
                                          "finish_reason": "stop"}], "usage": {"completion_tokens": 7}})
        else:
            await send(404, {"error": {"message": "no route"}})
        writer.close()


def run_nibble(build_dir, *args, timeout=300) -> subprocess.CompletedProcess:
    r = subprocess.run([str(build_dir / "nibble"), *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr + r.stdout
    return r


def printed_value(stdout: str, label: str) -> float:
    match = re.search(re.escape(label) + r"\s+([0-9.]+|inf)", stdout)
    assert match, f"{label!r} not in:\n{stdout}"
    return float(match.group(1))


def test_bench_serve_against_a_scripted_server(build_dir, tmp_path, seed):
    mock = MockServer()
    try:
        n, out_len, in_len = 25, 4, 30
        r = run_nibble(build_dir, "bench", "serve", "--base-url", f"http://127.0.0.1:{mock.port}",
                       "--tokenizer", str(pathlib.Path(__file__).parents[2] / "data" / "qwen3-tokenizer"),
                       "--num-prompts", str(n), "--random-input-len", str(in_len), "--random-output-len", str(out_len),
                       "--seed", str(seed), "--max-concurrency", "8", "--percentile-metrics",
                       "s_decode,ttft,s_ttft,tpot,itl,s_itl,e2el,s_e2el,input_len,s_input_len,output_len",
                       "--metric-percentiles", "80,95,99,99.9", "--save-result", "--result-dir", str(tmp_path),
                       "--result-filename", "result.json", "--disable-tqdm")
    finally:
        mock.stop()
    out = r.stdout
    result = json.loads((tmp_path / "result.json").read_text())
    failed = n // FAIL_EVERY
    # Counts are exact: scripted failures are counted, not hidden; lengths are token-exact.
    assert result["completed"] == n - failed and result["failed"] == failed
    assert printed_value(out, "Successful requests:") == n - failed
    assert printed_value(out, "Failed requests:") == failed
    assert printed_value(out, "Maximum request concurrency:") == 8
    assert result["total_output_tokens"] == (n - failed) * out_len
    assert result["total_input_tokens"] == (n - failed) * in_len
    assert sum(1 for e in result["errors"] if "scripted failure" in e) == failed
    # The summary is numpy's statistics of the saved per-request data, exactly.
    ok = [i for i, e in enumerate(result["errors"]) if not e]
    ttfts = np.array([result["ttfts"][i] for i in ok]) * 1000
    itls = np.array([x for i in ok for x in result["itls"][i]]) * 1000
    assert len(itls) == (n - failed) * (out_len - 1)
    for name, values in (("ttft", ttfts), ("itl", itls)):
        assert result[f"mean_{name}_ms"] == pytest.approx(values.mean(), rel=1e-12)
        assert result[f"median_{name}_ms"] == pytest.approx(np.median(values), rel=1e-12)
        assert result[f"std_{name}_ms"] == pytest.approx(values.std(), rel=1e-9, abs=1e-9)
        for p in (80, 95, 99, 99.9):
            key = f"p{p:g}_{name}_ms"
            assert result[key] == pytest.approx(np.percentile(values, p), rel=1e-12)
            assert printed_value(out, f"P{p:g} {name.upper()} (ms):") == pytest.approx(result[key], abs=0.006)
    # FastDeploy's server-side metrics (benchmark_serving.py calculate_metrics) from the scripted
    # arrival_time of each chunk: s_ttft = a[1], s_itl = gaps of a[1:] but the last, s_e2el = a[-1],
    # s_decode = (tokens - 1) / (a[-1] - a[1]); lengths as counted.
    good = [k for k in range(1, n + 1) if k % FAIL_EVERY]
    a = {k: [server_arrival_time(k, i) for i in range(out_len)] for k in good}
    expected = {"s_ttft": np.array([a[k][1] for k in good]) * 1000,
                "s_itl": np.array([a[k][j + 2] - a[k][j + 1] for k in good for j in range(out_len - 3)]) * 1000,
                "s_e2el": np.array([a[k][-1] for k in good]) * 1000}
    for name, values in expected.items():
        assert result[f"mean_{name}_ms"] == pytest.approx(values.mean(), rel=1e-9)
        assert result[f"median_{name}_ms"] == pytest.approx(np.median(values), rel=1e-9)
        assert result[f"p99_{name}_ms"] == pytest.approx(np.percentile(values, 99), rel=1e-9)
        assert printed_value(out, f"Mean {name.upper()} (ms):") == pytest.approx(values.mean(), abs=0.006)
    decode = (out_len - 1) / (S_ITL_S * (out_len - 2))
    assert result["mean_s_decode"] == pytest.approx(decode, rel=1e-9)
    assert printed_value(out, "Mean Decode:") == pytest.approx(decode, abs=0.006)
    assert result["mean_input_len"] == in_len and result["mean_s_input_len"] == 1  # the mock's usage says 1
    assert result["mean_output_len"] == out_len and result["p99_output_len"] == out_len
    sections = [line.strip("-") for line in out.splitlines() if line.startswith("--")]
    assert sections == ["Decode Speed (tok/s)", "Time to First Token", "Infer Time to First Token",
                        "Time per Output Token (excl. 1st token)", "Inter-token Latency", "Infer Inter-token Latency",
                        "End-to-end Latency", "Infer End-to-end Latency", "Input Length", "Infer Input Length",
                        "Output Length"]
    duration = result["duration"]
    assert printed_value(out, "Benchmark duration (s):") == pytest.approx(duration, abs=0.006)
    assert result["request_throughput"] == pytest.approx((n - failed) / duration, rel=1e-12)
    assert result["output_throughput"] == pytest.approx((n - failed) * out_len / duration, rel=1e-12)
    assert result["total_token_throughput"] == pytest.approx((n - failed) * (in_len + out_len) / duration, rel=1e-12)
    # The timings are the script's, within jitter.
    assert TTFT_S * 1000 <= result["median_ttft_ms"] <= (TTFT_S + JITTER_S) * 1000
    # A late chunk shortens the gap after it, so ITL may dip below the script a little.
    assert ITL_S * 1000 - 20 <= result["median_itl_ms"] <= (ITL_S + JITTER_S) * 1000
    assert ITL_S * 1000 - 20 <= result["median_tpot_ms"] <= (ITL_S + JITTER_S) * 1000
    expected_e2e = TTFT_S + (out_len - 1) * ITL_S
    assert expected_e2e * 1000 <= result["median_e2el_ms"] <= (expected_e2e + 2 * JITTER_S) * 1000
    assert result["max_concurrent_requests"] <= 8
    assert out.startswith("============ Serving Benchmark Result ============\n")
    assert out.rstrip().endswith("=" * 50)


def test_bench_serve_against_nibble_serve(build_dir, server, tiny_models, seed):
    before = server.metrics()["nibble:prompt_tokens_total"]
    for backend in ("openai-completions", "openai-chat", "nibble"):
        r = run_nibble(build_dir, "bench", "serve", "--port", str(server.port), "--backend", backend,
                       "--tokenizer", str(tiny_models["a"]), "--num-prompts", "12", "--random-input-len", "20",
                       "--random-output-len", "5", "--ignore-eos", "--seed", str(seed), "--request-rate", "40",
                       "--disable-tqdm")
        assert printed_value(r.stdout, "Successful requests:") == 12, r.stdout
        assert printed_value(r.stdout, "Failed requests:") == 0
        assert printed_value(r.stdout, "Total generated tokens:") == 60
        assert printed_value(r.stdout, "Total input tokens:") == 240
        if backend == "openai-completions":
            # The server counted exactly the prompt tokens the benchmark meant to send.
            assert server.metrics()["nibble:prompt_tokens_total"] - before == 240


def test_bench_serve_server_side_metrics_from_nibble_serve(build_dir, server, tiny_models, seed, tmp_path):
    """nibble serve stamps every streamed choice with FastDeploy's arrival_time, so the s_* metrics are
    the server's own: inside the client's times, the prompt as the server counted it (chat template)."""
    r = run_nibble(build_dir, "bench", "serve", "--port", str(server.port), "--backend", "openai-chat",
                   "--tokenizer", str(tiny_models["a"]), "--num-prompts", "10", "--random-input-len", "20",
                   "--random-output-len", "6", "--ignore-eos", "--seed", str(seed), "--max-concurrency", "4",
                   "--percentile-metrics", "ttft,s_ttft,s_itl,e2el,s_e2el,s_decode,input_len,s_input_len,output_len",
                   "--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json", "--disable-tqdm")
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["completed"] == 10, r.stdout
    assert 0 < result["mean_s_ttft_ms"] <= result["mean_s_e2el_ms"] <= result["mean_e2el_ms"]
    assert result["mean_s_itl_ms"] >= 0 and result["mean_s_decode"] > 0
    assert result["mean_input_len"] == 20 and result["mean_s_input_len"] > 20  # the template's tokens too
    assert result["mean_output_len"] == 6


def test_make_gsm8k_like_is_gsm8k_format_with_correct_arithmetic(build_dir, tmp_path, seed):
    path = tmp_path / "gsm.jsonl"
    run_nibble(build_dir, "eval", "make-gsm8k-like", "--out", str(path), "--n", "300", "--seed", str(seed))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 300 and len({x["question"] for x in lines}) > 200
    for item in lines:
        assert list(item) == ["question", "answer"]
        steps = re.findall(r"<<([^=>]+)=([0-9]+)>>", item["answer"])
        assert steps, item
        for expression, value in steps:
            assert eval(expression) == int(value), item  # noqa: S307 (digits and + - * / only)
        assert item["answer"].endswith("#### " + steps[-1][1])
    again = tmp_path / "again.jsonl"
    run_nibble(build_dir, "eval", "make-gsm8k-like", "--out", str(again), "--n", "300", "--seed", str(seed))
    assert again.read_text() == path.read_text()


def test_make_gsm8k_like_has_many_multi_step_kinds(build_dir, tmp_path, seed):
    """Issue 18: at least 20 kinds of problem (question skeletons once numbers and names are masked),
    most of them multi-step, with answers well past two digits."""
    path = tmp_path / "gsm.jsonl"
    run_nibble(build_dir, "eval", "make-gsm8k-like", "--out", str(path), "--n", "3000", "--seed", str(seed))
    items = [json.loads(line) for line in path.read_text().splitlines()]
    names = r"\b(Natalia|James|Aisha|Mateo|Priya|Liam|Sofia|Kenji|Amara|Noah|Elena|Omar|Mei|Lucas|Zara|Diego)\b"
    skeletons = {re.sub(names, "P", re.sub(r"[0-9]+", "#", item["question"])) for item in items}
    skeletons = {re.sub(r"\b(he|she|his|her|He|She)\b", "x", k) for k in skeletons}
    skeletons = {re.sub(r"\b(apples|marbles|stickers|pencils|cookies|books|shells|cards|cupcakes|stamps|beads|candles)\b",
                        "I", k) for k in skeletons}
    skeletons = {re.sub(r"#(, #)*( and #)?", "#", k) for k in skeletons}  # the average's list of scores
    assert len(skeletons) >= 20, sorted(skeletons)
    steps = [len(re.findall(r"<<", item["answer"])) for item in items]
    assert sum(n >= 2 for n in steps) > 0.6 * len(items)
    answers = [int(item["answer"].rsplit("#### ", 1)[1]) for item in items]
    assert max(answers) > 1000 and min(answers) >= 0


def test_eval_gsm8k_scores_exactly(build_dir, tmp_path, seed):
    path = tmp_path / "gsm.jsonl"
    run_nibble(build_dir, "eval", "make-gsm8k-like", "--out", str(path), "--n", "40", "--seed", str(seed))
    items = [json.loads(line) for line in path.read_text().splitlines()]
    # The mock answers by question text, and a synthetic set can repeat a question: script one reply
    # per distinct question (right, wrong or no number by first appearance) and count per item.
    answers, kinds = {}, {}
    for item in items:
        question = item["question"]
        if question in kinds:
            continue
        value = int(item["answer"].rsplit("#### ", 1)[1])
        kinds[question] = len(kinds) % 3
        if kinds[question] == 0:
            answers[question] = f" It is {value:,} in the end."  # right (with a thousands comma)
        elif kinds[question] == 1:
            answers[question] = f" {value + 1}"  # wrong
    correct = sum(kinds[item["question"]] == 0 for item in items)
    invalid = sum(kinds[item["question"]] == 2 for item in items)  # no number at all
    mock = MockServer(answers)
    try:
        r = run_nibble(build_dir, "eval", "gsm8k", "--data", str(path), "--num-questions", "40", "--num-shots", "3",
                       "--parallel", "7", "--base-url", f"http://127.0.0.1:{mock.port}",
                       "--predictions", str(tmp_path / "pred.jsonl"))
    finally:
        mock.stop()
    # --predictions: one line per question, in question order, with what the summary counted.
    predictions = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert [p["index"] for p in predictions] == list(range(40))
    for item, p in zip(items, predictions):
        value, kind = int(item["answer"].rsplit("#### ", 1)[1]), kinds[item["question"]]
        assert p["label"] == value
        assert p["prediction"] == [value, value + 1, None][kind]
        assert p["correct"] == (kind == 0)
        if kind < 2:
            assert p["text"] == answers[item["question"]]
    lines = r.stdout.splitlines()
    assert lines[0] == f"Accuracy: {correct / 40:.3f}"
    assert lines[1] == f"Invalid: {invalid / 40:.3f}"
    assert re.fullmatch(r"Latency: \d+\.\d{3} s", lines[2])
    latency = float(lines[2].split()[1])
    assert re.fullmatch(r"Output throughput: \d+\.\d{3} token/s", lines[3])
    # 7 completion tokens per answer over the latency (printed rounded to the millisecond).
    assert 40 * 7 / (latency + 0.0005) - 0.001 <= float(lines[3].split()[2]) <= 40 * 7 / max(latency - 0.0005, 1e-6) + 0.001


def test_gsm8k_compare_counts_and_tests_pairs(tmp_path, seed):
    """scripts/gsm8k_compare.py on two random prediction files: accuracies, the discordant counts and
    McNemar's exact p (scipy's two-sided binomial test on the discordant questions, p = 1/2)."""
    from scipy.stats import binomtest
    rng = random.Random(seed)
    n = 300
    a = [rng.random() < 0.8 for _ in range(n)]
    b = [x if rng.random() < 0.9 else not x for x in a]
    for name, flags in (("a", a), ("b", b)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(
            {"index": i, "label": 1, "prediction": 1 if ok else 2, "correct": ok, "text": ""}) + "\n"
            for i, ok in enumerate(flags)))
    r = subprocess.run([sys.executable, str(REPO / "scripts/gsm8k_compare.py"), f"A={tmp_path / 'a.jsonl'}",
                        f"B={tmp_path / 'b.jsonl'}"], capture_output=True, text=True, check=True)
    row = r.stdout.splitlines()[2].split()
    only_a = sum(x and not y for x, y in zip(a, b))
    only_b = sum(y and not x for x, y in zip(a, b))
    assert row[0] == "B" and float(row[2]) == round(sum(b) / n, 3)
    assert (int(row[5]), int(row[6])) == (only_a, only_b)
    assert abs(float(row[7]) - binomtest(only_a, only_a + only_b, 0.5).pvalue) < 1e-3


def test_eval_gsm8k_against_nibble_serve(build_dir, server, tmp_path):
    path = tmp_path / "gsm.jsonl"
    run_nibble(build_dir, "eval", "make-gsm8k-like", "--out", str(path), "--n", "12")
    r = run_nibble(build_dir, "eval", "gsm8k", "--data", str(path), "--num-questions", "6", "--num-shots", "2",
                   "--max-tokens", "8", "--port", str(server.port))
    assert re.fullmatch(r"Accuracy: [01]\.\d{3}\nInvalid: [01]\.\d{3}\nLatency: \d+\.\d{3} s\n"
                        r"Output throughput: \d+\.\d{3} token/s\n", r.stdout), r.stdout
    assert "failed" not in r.stderr


def test_bench_serve_sharegpt_and_jsonl_datasets(build_dir, tmp_path):
    tokenizer = str(pathlib.Path(__file__).parents[2] / "data" / "qwen3-tokenizer")
    conversations = [{"conversations": [{"from": "human", "value": f"Question number {i}: what is {i} plus {i}?"},
                                        {"from": "gpt", "value": f"The answer is {2 * i}, as {i} + {i} = {2 * i}."}]}
                     for i in range(10)]
    conversations.append({"conversations": [{"from": "human", "value": "hi"}]})  # no reply: skipped
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(json.dumps(conversations))
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt": f"prompt {i}" + (" " + FAIL_MARKER if i == 5 else ""),
                                         "output_len": 2 + i % 3}) + "\n" for i in range(6)))
    mock = MockServer(fail_every=0)
    try:
        share = run_nibble(build_dir, "bench", "serve", "--base-url", f"http://127.0.0.1:{mock.port}",
                           "--tokenizer", tokenizer, "--dataset-name", "sharegpt", "--dataset-path", str(sharegpt),
                           "--num-prompts", "4", "--output-len", "3", "--disable-tqdm")
        assert printed_value(share.stdout, "Successful requests:") == 4
        assert printed_value(share.stdout, "Total generated tokens:") == 12
        lines = run_nibble(build_dir, "bench", "serve", "--base-url", f"http://127.0.0.1:{mock.port}",
                           "--dataset-name", "jsonl", "--dataset-path", str(jsonl), "--num-prompts", "6",
                           "--tokenizer", tokenizer, "--disable-tqdm")
        # The last prompt fails (scripted); the others ask for 2, 3, 4, 2, 3 tokens.
        assert printed_value(lines.stdout, "Successful requests:") == 5
        assert printed_value(lines.stdout, "Failed requests:") == 1
        assert printed_value(lines.stdout, "Total generated tokens:") == 2 + 3 + 4 + 2 + 3
        too_many = subprocess.run([str(build_dir / "nibble"), "bench", "serve", "--base-url",
                                   f"http://127.0.0.1:{mock.port}", "--tokenizer", tokenizer, "--dataset-name",
                                   "sharegpt", "--dataset-path", str(sharegpt), "--num-prompts", "50"],
                                  capture_output=True, text=True, timeout=60)
        assert too_many.returncode == 1 and "usable conversations" in too_many.stderr
    finally:
        mock.stop()


def test_bench_serve_progress_counts_requests_and_metric_names_are_checked(build_dir, tmp_path, seed):
    """The progress line counts requests (done/total, req/s), not GB; a --percentile-metrics name
    the benchmark does not compute is an error that lists the supported ones, before any request."""
    mock = MockServer(fail_every=0)
    try:
        common = ["--base-url", f"http://127.0.0.1:{mock.port}", "--dataset-name", "random", "--num-prompts", "6",
                  "--random-input-len", "8", "--random-output-len", "2", "--seed", str(seed),
                  "--tokenizer", str(pathlib.Path(__file__).parents[2] / "data" / "qwen3-tokenizer")]
        r = run_nibble(build_dir, "bench", "serve", *common)
        progress = [line for line in r.stderr.splitlines() if line.startswith("bench serve [")]
        assert progress and "6/6 requests" in progress[-1] and "req/s" in progress[-1], r.stderr
        assert " GB" not in r.stderr
        sent = mock.count
        bad = subprocess.run([str(build_dir / "nibble"), "bench", "serve", *common, "--percentile-metrics", "ttft,res_ttft"],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 1 and "'res_ttft'" in bad.stderr and "ttft, s_ttft, tpot" in bad.stderr, bad.stderr
        assert mock.count == sent, "no request goes out before the options are checked"
    finally:
        mock.stop()


def test_bench_latency_reports_every_test(build_dir, tiny_models, tmp_path):
    """nibble bench latency on the CPU runner: a row per mode and test, positive throughputs, and
    token counts as asked (B sequences × timed steps for batched decode; B + P tokens a mixed step)."""
    out = tmp_path / "latency.json"
    r = run_nibble(build_dir, "bench", "latency", "--model", str(tiny_models["a"]), "--backend", "cpu",
                   "--modes", "none,per-token", "--pp", "16,40", "--tg", "4", "--batches", "1,3",
                   "--batch-prompt", "20", "--batch-gen", "2", "--mixed", "9,33", "--repeats", "1", "--json", str(out))
    rows = json.loads(out.read_text())
    got = {(row["mode"], row["test"]): row for row in rows}
    for mode in ("none", "per-token"):
        for test, tokens in (("pp16", 16), ("pp40", 40), ("tg4", 4), ("S_TG b1", 2), ("S_TG b3", 6),
                             ("mix b1+p9", 20), ("mix b3+p33", 72)):
            row = got[(mode, test)]
            assert row["tokens"] == tokens and row["tok_s"] > 0 and row["ms_per_step"] > 0, row
            assert row["backend"].startswith("cpu")
    assert "pp40" in r.stdout and "S_TG b3" in r.stdout


def test_bench_latency_reports_the_bytes_floor(build_dir, tiny_models, tmp_path):
    """Each decode row's bytes floor: one token's weight bytes are `nibble inspect`'s bytes per decoded
    token; three sequences read more than one and less than three times that (the lm_head once, the
    experts at even loads); the KV bytes are the keys each step attends over (a 1-token prompt then
    k + 2 keys at step k; a batch's prompt, its warm-up step, then the timed ones) at BF16; the floor's
    tok/s is the step's tokens over its bytes at --hbm-tb-s."""
    out = tmp_path / "latency.json"
    r = run_nibble(build_dir, "bench", "latency", "--model", str(tiny_models["a"]), "--backend", "cpu", "--pp", "",
                   "--tg", "4", "--batches", "1,3", "--batch-prompt", "20", "--batch-gen", "2", "--repeats", "1",
                   "--hbm-tb-s", "2.5", "--json", str(out))
    rows = {row["test"]: row for row in json.loads(out.read_text())}
    inspect = json.loads(run_nibble(build_dir, "inspect", str(tiny_models["a"]), "--json").stdout)
    config = json.loads((tiny_models["a"] / "config.json").read_text())
    per_key = config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * config.get(
        "head_dim", config["hidden_size"] // config["num_attention_heads"]) * 2
    one = inspect["bytes_per_decoded_token"]
    assert rows["tg4"]["floor_weight_bytes"] == one and rows["S_TG b1"]["floor_weight_bytes"] == one, rows
    assert one < rows["S_TG b3"]["floor_weight_bytes"] < 3 * one, rows
    for test, sequences, keys in (("tg4", 1, (4 + 3) / 2), ("S_TG b1", 1, 20 + (2 + 3) / 2), ("S_TG b3", 3, 20 + (2 + 3) / 2)):
        row = rows[test]
        assert row["floor_kv_bytes"] == pytest.approx(sequences * keys * per_key), row
        step = row["floor_weight_bytes"] + row["floor_kv_bytes"]
        assert row["floor_tok_s"] == pytest.approx(sequences * 2.5e12 / step) and row["hbm_tb_s"] == 2.5, row
        assert f"# floor {test}:" in r.stdout
    bad = subprocess.run([str(build_dir / "nibble"), "bench", "latency", "--model", str(tiny_models["a"]), "--backend",
                          "cpu", "--pp", "", "--tg", "2", "--batches", "", "--hbm-tb-s", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--hbm-tb-s" in bad.stderr, bad.stderr


def test_bench_latency_samples_as_a_request_asks(build_dir, tiny_models, tmp_path):
    """bench latency's decode steps with a request's sampling (--temperature / --top-k / --top-p):
    rows as with greedy; out-of-range values are refused with the field named."""
    out = tmp_path / "latency.json"
    run_nibble(build_dir, "bench", "latency", "--model", str(tiny_models["a"]), "--backend", "cpu", "--pp", "8",
               "--tg", "4", "--batches", "2", "--batch-prompt", "8", "--batch-gen", "2", "--repeats", "1",
               "--temperature", "0.7", "--top-k", "20", "--top-p", "0.8", "--json", str(out))
    rows = {row["test"]: row for row in json.loads(out.read_text())}
    assert rows["tg4"]["tok_s"] > 0 and rows["S_TG b2"]["tokens"] == 4, rows
    bad = subprocess.run([str(build_dir / "nibble"), "bench", "latency", "--model", str(tiny_models["a"]), "--backend",
                          "cpu", "--pp", "8", "--tg", "2", "--batches", "1", "--top-p", "1.5"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "top_p" in bad.stderr, bad.stderr


def test_latency_compare_puts_logs_side_by_side(build_dir, tiny_models, tmp_path):
    """scripts/latency_compare.py on two real `bench latency` logs (the CPU runner) and a crashed
    variant's: a row per (mode, test) with each log's number as the log printed it (tok/s; ms a step
    for mixed steps), the speed change against the first log computed from those numbers, and "—"
    where a log has no row."""
    logs = []
    for i in range(2):
        r = run_nibble(build_dir, "bench", "latency", "--model", str(tiny_models["a"]), "--backend", "cpu", "--pp", "16",
                       "--tg", "4", "--batches", "2", "--batch-prompt", "12", "--batch-gen", "2", "--mixed", "9",
                       "--repeats", "1")
        logs.append(tmp_path / f"latency_{i}.log")
        logs[-1].write_text(r.stdout)
    crashed = tmp_path / "latency_crashed.log"
    crashed.write_text("terminate called after throwing an instance of 'std::bad_alloc'\n")
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "latency_compare.py"), "--name", "first", str(logs[0]),
                          "--name", "A=1,B=2", str(logs[1]), "--name", "crashed", str(crashed)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "| mode | test | first | A=1,B=2 | crashed |", lines[0]
    want = {}
    for log in logs:
        for line in log.read_text().splitlines():
            f = line.split()
            if len(f) >= 5 and f[0] == "none" and f[1] in ("pp16", "tg4", "S_TG", "mix"):
                test = " ".join(f[1:3]) if f[1] in ("S_TG", "mix") else f[1]
                nums = f[-3:]
                want.setdefault(test, []).append((float(nums[1]), float(nums[2])))
    assert set(want) == {"pp16", "tg4", "S_TG b2", "mix b2+p9"}, want
    for test, ((tok0, ms0), (tok1, ms1)) in want.items():
        mix = test.startswith("mix")
        row = next(line for line in lines if f"| none | {test} (" in line)
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == f"{test} ({'ms' if mix else 'tok/s'})", cells
        assert float(cells[2].replace(",", "")) == pytest.approx(ms0 if mix else tok0, abs=0.01)
        value, change = re.fullmatch(r"([0-9,.]+) \(([+-][0-9.]+)%\)", cells[3]).groups()
        assert float(value.replace(",", "")) == pytest.approx(ms1 if mix else tok1, abs=0.01)
        speed = ms0 / ms1 if mix else tok1 / tok0
        assert float(change) == pytest.approx(100 * (speed - 1), abs=0.051), (test, cells)
        assert cells[4] == "—"


def test_bench_routing_counts_every_pick_of_a_placed_checkpoint(build_dir, tmp_path):
    """`nibble bench routing` on small-moe placed for Zipf 0.6: every layer's rows add up to the
    batch's picks, its statistics agree with those rows, and the placed skew shows (the top expert
    well above the 1/64 a uniform router gives it; the synth's own check holds it near the target)."""
    model = tmp_path / "m"
    subprocess.run([str(build_dir / "nibble"), "synth", "--preset", "small-moe", "--layers", "3", "--experts", "64",
                    "--router-skew", "0.6", "--out", str(model)], check=True, capture_output=True, timeout=300)
    out = tmp_path / "routing.json"
    r = run_nibble(build_dir, "bench", "routing", "--model", str(model), "--tokens", "256", "--sequences", "2",
                   "--json", str(out))
    assert r.returncode == 0, r.stderr
    layers = json.loads(out.read_text())
    config = json.loads((model / "config.json").read_text())
    top_k, experts = config["num_experts_per_tok"], config["num_experts"]
    assert [l["layer"] for l in layers] == list(range(config["num_hidden_layers"]))
    for l in layers:
        rows = l["rows"]
        assert len(rows) == experts and rows == sorted(rows, reverse=True)
        assert sum(rows) == 2 * 256 * top_k
        assert l["top_share"] == pytest.approx(rows[0] / sum(rows))
        assert l["top_share"] > 3 / experts, l
        shares = np.array(rows) / sum(rows)
        entropy = -sum(p * np.log(p) for p in shares if p > 0)
        assert l["concentration"] == pytest.approx(1 - entropy / np.log(experts), abs=1e-9)
    assert f"min-max over {len(layers)} layers" in r.stdout
    bad = subprocess.run([str(build_dir / "nibble"), "bench", "routing", "--model", str(model), "--tokens", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--tokens" in bad.stderr, bad.stderr
