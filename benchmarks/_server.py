"""`python -m dllm_constrain.serve` in a subprocess on 127.0.0.1, for the benchmarks that measure it over HTTP.

The start-up wait is bounded and polls /health; the server's output goes to a temporary log whose tail is shown
when it fails to start, and which `stop()` removes.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_answers(url: str, proc: subprocess.Popen, timeout: float) -> None:
    """Polls GET `url` every half second until it answers 200. Raises RuntimeError when `proc` (the server) exits
    first and TimeoutError when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout:g} s")
        time.sleep(0.5)


class ServerProcess:
    """`python -m dllm_constrain.serve --host 127.0.0.1 --port <free> --log-level warning <server_args>`, run
    from `root` (a checkout of the project, imported first through PYTHONPATH when `root` is not this one) with
    `threads` torch threads."""

    def __init__(self, server_args: list[str], threads: int, *, root: Path = ROOT, startup_timeout: float = 300.0,
                 log_prefix: str = "bench_server_") -> None:
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", prefix=log_prefix, suffix=".log", delete=False)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        if root != ROOT:
            env["PYTHONPATH"] = str(root)  # `-m` imports the package from `root` (cwd) first
        cmd = [sys.executable, "-m", "dllm_constrain.serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--log-level", "warning", *server_args]
        self.proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_until_answers(f"{self.base}/health", self.proc, startup_timeout)
        except (RuntimeError, TimeoutError) as e:
            tail = self.tail()
            self.stop()
            raise RuntimeError(f"{e}:\n{tail}") from None
        with urllib.request.urlopen(f"{self.base}/v1/models", timeout=5) as r:
            self.model_id = json.load(r)["data"][0]["id"]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, n: int = 3000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-n:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if not self.log.closed:
            self.log.close()
            os.unlink(self.log.name)
