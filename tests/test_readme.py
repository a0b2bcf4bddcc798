"""README.md as a specification: every code block in it runs as pasted and prints what the README says it prints.

- ```python blocks run in order, in one namespace, in a subprocess started from the repository root with the
  bundled model; a block that talks to `http://127.0.0.1:8000` gets a server of the bundled model started for it
  on a free 127.0.0.1 port (the port substituted), stopped at the end.
- A ```text block that follows a ```python block with nothing but blank lines between them is that block's
  expected standard output, compared exactly. Other ```text blocks are illustrative and not run.
- ```bash blocks are exempt only when they are the install command or the test commands, and then they must be
  the commands `.ci/run` runs, byte for byte.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BUNDLED_MODEL_DOC = ROOT / "docs" / "bundled_model.md"  # the probe behind the README's claims about the model
CI = ROOT / ".ci" / "run"
README_PORT = "8000"  # the port the README's client code names
SERVER_URL = f"http://127.0.0.1:{README_PORT}"
INSTALL_COMMAND_START = "python -m venv .venv && "  # the install-and-run command (exempt: CI runs it)
TEST_COMMANDS = ("python -m pytest", "python -m pytest -m slow")  # the test commands (exempt: CI runs them)
RUN_TIMEOUT_S = 600.0  # bound on running every block
SERVER_START_S = 120.0  # bound on the server's start

_FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    lang: str
    line: int  # the line of the opening fence, 1-based
    code: str
    expected_stdout: str | None = None  # for python blocks: the ```text block right after it


def readme_blocks(text: str) -> list[Block]:
    raw = []
    for m in _FENCE.finditer(text):
        raw.append((m.group(1), text.count("\n", 0, m.start()) + 1, m.group(2), m.start(), m.end()))
    blocks = []
    for i, (lang, line, code, start, end) in enumerate(raw):
        expected = None
        if lang == "python" and i + 1 < len(raw):
            nlang, _, ncode, nstart, _ = raw[i + 1]
            if nlang == "text" and text[end:nstart].strip() == "":
                expected = ncode
        blocks.append(Block(lang, line, code, expected))
    return blocks


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))
PROBE = [b for b in readme_blocks(BUNDLED_MODEL_DOC.read_text(encoding="utf-8")) if b.lang == "python"]
PYTHON = [b for b in BLOCKS if b.lang == "python"]


def test_every_block_is_python_bash_or_text():
    assert BLOCKS, "README.md has no code blocks"
    assert {b.lang for b in BLOCKS} <= {"python", "bash", "text"}, [(b.line, b.lang) for b in BLOCKS]


def test_bash_blocks_are_the_install_and_test_commands_ci_runs():
    ci_lines = CI.read_text(encoding="utf-8").splitlines()
    bash = [b for b in BLOCKS if b.lang == "bash"]
    commands = [line for b in bash for line in b.code.splitlines() if line.strip()]
    install = [c for c in commands if c.startswith(INSTALL_COMMAND_START)]
    assert len(install) == 1, "README must show the install-and-run command once"
    assert set(commands) == {install[0], *TEST_COMMANDS}, f"bash blocks that are neither install nor tests: {commands}"
    for command in commands:
        assert command in ci_lines, f".ci/run does not run the README's command byte for byte: {command}"


def test_every_relative_link_names_a_file_of_the_tree():
    targets = re.findall(r"\]\(([^)#\s]+)\)", README.read_text(encoding="utf-8"))
    local = [t for t in targets if "://" not in t]
    assert local and all((ROOT / t).exists() for t in local), [t for t in local if not (ROOT / t).exists()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _wait_until_serving(proc: subprocess.Popen, base: str) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(f"{base}/v1/models", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the server did not answer within {SERVER_START_S} s")


_RUNNER = r"""
import contextlib, io, json, sys, traceback
blocks = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
results = []
for code in blocks:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "<README block>", "exec"), namespace)
    except BaseException:
        results.append({"stdout": out.getvalue(), "error": traceback.format_exc()})
        break
    results.append({"stdout": out.getvalue(), "error": None})
sys.__stdout__.write("\n@@RESULTS@@" + json.dumps(results))
"""


def _run_blocks(codes: list[str]) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(codes), capture_output=True, text=True,
                          cwd=ROOT, env=_env(), timeout=RUN_TIMEOUT_S)
    assert "@@RESULTS@@" in proc.stdout, f"the block runner failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.rsplit("@@RESULTS@@", 1)[1])


@pytest.fixture(scope="module")
def block_results() -> list[dict]:
    codes = [b.code for b in PYTHON]
    if not any(SERVER_URL in c for c in codes):
        return _run_blocks(codes)
    port = str(_free_port())
    server = subprocess.Popen([sys.executable, "-m", "dllm_constrain.serve", "--host", "127.0.0.1", "--port", port,
                               "--log-level", "warning"], cwd=ROOT, env=_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_until_serving(server, base)
        return _run_blocks([c.replace(SERVER_URL, base) for c in codes])
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


def test_readme_has_python_blocks():
    assert len(PYTHON) >= 3


@pytest.mark.parametrize("index", range(len(PYTHON)), ids=[f"line{b.line}" for b in PYTHON])
def test_python_block_runs_and_prints_what_the_readme_shows(block_results, index):
    block = PYTHON[index]
    assert index < len(block_results), f"an earlier block failed: {block_results[-1]['error']}"
    result = block_results[index]
    assert result["error"] is None, f"README.md line {block.line}:\n{result['error']}"
    if block.expected_stdout is not None:
        assert result["stdout"] == block.expected_stdout, f"README.md line {block.line} printed:\n{result['stdout']}"


def test_the_bundled_model_probe_prints_the_figures_the_readme_states():
    """The README's first screen quotes the probe of docs/bundled_model.md; the probe must still print them."""
    [probe] = PROBE
    [result] = _run_blocks([probe.code])
    assert result["error"] is None, result["error"]
    assert result["stdout"] == probe.expected_stdout
    values_line = probe.expected_stdout.splitlines()[0]  # "12 of 30 values, 1 of 10 records complete"
    values, records = re.match(r"(\d+ of \d+) values, (\d+ of \d+) records", values_line).groups()
    readme = " ".join(README.read_text(encoding="utf-8").split())
    assert f"{values} stated values, {records} records complete" in readme

