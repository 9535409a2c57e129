"""nibble servers behind SGLang's router (sglang-router, PyPI; issue 66): the router finds them healthy,
routes prompts that share a prefix to one worker (its cache_aware policy), and loses nothing when a
worker is stopped mid-run (nibble drains with --shutdown-timeout; the router retries elsewhere)."""
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests

from nibble_server import NibbleServer

pytest.importorskip("sglang_router")
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Router:
    def __init__(self, workers: list, log_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "w")
        self.log_path = log_path
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(self.port),
             "--policy", "cache_aware", "--worker-urls", *[w.url for w in workers],
             "--prometheus-port", str(free_port()),
             "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
             # A stopping worker answers 503 until the router's health check drops it (up to 1 s here): the
             # retries' backoff (0.2 s, × 1.5, five times: 2.6 s) outlasts that, so one lands elsewhere.
             "--retry-initial-backoff-ms", "200"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            assert self.process.poll() is None, log_path.read_text()[-3000:]
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the router did not come up:\n" + log_path.read_text()[-3000:])

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()


def served(worker) -> float:
    return worker.metrics().get("nibble:e2e_request_latency_seconds_count", 0.0)


def test_router_routes_by_prefix_and_loses_nothing_when_a_worker_stops(build_dir, tiny_models, tmp_path, seed):
    rng = random.Random(seed)
    workers = [NibbleServer(build_dir, tiny_models["a"], tmp_path / f"w{i}.log", "--served-model-name", "tiny",
                            "--shutdown-timeout", "30") for i in range(2)]
    router = None
    try:
        router = Router(workers, tmp_path / "router.log")
        # Prompts that share a long prefix: the router's radix tree sends them to one worker.
        prefix = " ".join(rng.choice(WORDS) for _ in range(200))
        before = [served(w) for w in workers]
        for i in range(6):
            r = requests.post(router.url + "/generate", json={"text": prefix + f" {rng.choice(WORDS)} {i}",
                                                              "sampling_params": {"max_new_tokens": 4}}, timeout=60)
            assert r.status_code == 200, r.text
        moved = sorted(served(w) - b for w, b in zip(workers, before))
        assert moved == [0, 6], moved
        # Traffic through the router while worker 1 stops (SIGTERM): every request completes in full.
        results, stop = [], threading.Event()

        def traffic():
            while not stop.is_set():
                r = requests.post(router.url + "/v1/completions",
                                  json={"model": "tiny", "prompt": " ".join(rng.choice(WORDS) for _ in range(20)),
                                        "max_tokens": 24, "ignore_eos": True}, timeout=120)
                results.append(r)
        threads = [threading.Thread(target=traffic) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        assert workers[1].stop() == 0  # drains: its running requests finish
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join()
        assert len(results) > 8
        bad = [r.text for r in results if r.status_code != 200 or r.json()["usage"]["completion_tokens"] != 24
               or r.json()["choices"][0]["finish_reason"] != "length"]
        assert not bad, bad[:3]
        assert "for the running ones to finish" in workers[1].log()
    finally:
        if router:
            router.stop()
        for w in workers:
            if w.process.poll() is None:
                w.stop()
