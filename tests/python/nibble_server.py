"""Starts `nibble serve` on a free port for tests and stops it (SIGTERM) afterwards."""
import os
import pathlib
import re
import signal
import subprocess
import time

import requests


class NibbleServer:
    def __init__(self, build_dir: pathlib.Path, model: pathlib.Path | None, log_path: pathlib.Path, *args: str,
                 env: dict | None = None):
        command = [str(build_dir / "nibble"), "serve", "--host", "127.0.0.1", "--port", "0"]
        if model is not None:
            command += ["--model", str(model)]
        self.log_path = log_path
        self._log = open(log_path, "w")
        full_env = dict(os.environ, **(env or {}))
        self.process = subprocess.Popen(command + list(args), stdout=self._log, stderr=subprocess.STDOUT, env=full_env)
        self.port = self._wait_for_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()

    def _wait_for_port(self) -> int:
        deadline = time.time() + 120
        while time.time() < deadline:
            match = re.search(r"listening on 127\.0\.0\.1:(\d+)", self.log())
            if match:
                return int(match.group(1))
            if self.process.poll() is not None:
                raise RuntimeError(f"nibble serve exited ({self.process.returncode}):\n{self.log()}")
            time.sleep(0.05)
        raise RuntimeError("nibble serve did not start listening:\n" + self.log())

    def _wait_ready(self) -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nibble serve exited ({self.process.returncode}):\n{self.log()}")
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.05)
        raise RuntimeError("nibble serve did not become healthy:\n" + self.log())

    def log(self) -> str:
        return self.log_path.read_text()

    def metrics(self) -> dict:
        """/metrics as {name: value}, labels other than model_name kept in the key: name{le=...},
        name{engine="0"} (histograms give their _count and _sum); a plain name is the total."""
        out = {}
        for line in requests.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            if "{" in name_labels:
                labels = [p for p in name_labels.split("{", 1)[1].rstrip("}").split(",") if not p.startswith("model_name")]
                if labels:
                    name = name + "{" + ",".join(labels) + "}"
            out[name] = float(value)
        return out

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise RuntimeError("nibble serve did not stop within %ss after SIGTERM:\n%s" % (timeout, self.log()))
        self._log.close()
        return self.process.returncode
