#!/usr/bin/env python3
"""How many of the project's files one request passes through, and how often it crosses between them.

    OMP_NUM_THREADS=1 python benchmarks/trace_request.py            # both paths, the bundled model
    OMP_NUM_THREADS=1 python benchmarks/trace_request.py --path llm --hops 40 --json

Two paths, each traced for ONE constrained request under a profile hook on every thread (sys.setprofile, and
threading.setprofile installed before the model's threads start), after one unmeasured warm-up request with
another schema (the engine's threads, lazy imports and first-call caches are then in place; the traced schema
compiles as a new one would):

  llm    `LLM.generate` with `schema=`, from the call to the first call into engine/models/ (the model's
         forward) and on until generate returns;
  http   POST /v1/chat/completions with `response_format` json_schema through the server's app
         (`build_server_app`, as `python -m dllm_constrain.serve` builds it) in process (Starlette's TestClient),
         until the engine's `LLMEngine.add_request` is called.

A hop is a call into a project source file (the package's folders, not tests/ or benchmarks/) whose nearest
project caller on the same thread is another file, or none (a thread's first project frame). Printed per span:
the files in the order first entered (with the thread), the hop count, the threads involved, and the hops in
order (a run of one pair repeated printed once with its count). Thread timing moves the counts by a few between
runs; the files and threads do not.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE_FOLDERS = ("dllm_constrain", "engine", "kernels", "grammars", "evals")
MODEL_FOLDER = "engine/models/"  # a call into it is the model's forward
PROMPT = "Create a record with name Ada Lovelace; age 36; city London."
WARMUP_SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
TRACED_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                  "city": {"type": "string"}}, "required": ["name", "age", "city"]}
_ADDRESS = re.compile(r"-[0-9a-f]{8,}$")
HTTP_SCHEMA = {**TRACED_SCHEMA, "properties": {**TRACED_SCHEMA["properties"], "zip": {"type": "string"}}}


def _thread_name() -> str:
    """The thread's name without an object address (anyio's portal thread is `asyncio-portal-<id>`)."""
    return _ADDRESS.sub("", threading.current_thread().name)


@dataclass(frozen=True)
class Hop:
    thread: str
    caller: str | None  # the calling project file; None: the thread's first project frame
    callee: str
    function: str


class HopRecorder:
    """The profile hook: records each hop while armed; `stop_at` (file, function) ends the recording at its call."""

    def __init__(self, root: Path = ROOT, stop_at: tuple[str, str] | None = None,
                 folders: tuple[str, ...] = SOURCE_FOLDERS) -> None:
        self.prefixes = tuple(str(root / folder) + os.sep for folder in folders)
        self.cut = len(str(root)) + 1
        self.stop_at = stop_at
        self.armed = False
        self.hops: list[Hop] = []
        self._files: dict[str, str | None] = {}

    def project_file(self, filename: str) -> str | None:
        rel = self._files.get(filename, "?")
        if rel == "?":
            rel = filename[self.cut:].replace(os.sep, "/") if filename.startswith(self.prefixes) else None
            self._files[filename] = rel
        return rel

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" or not self.armed:
            return
        callee = self.project_file(frame.f_code.co_filename)
        if callee is None:
            return
        caller, back = None, frame.f_back
        while back is not None and caller is None:
            caller = self.project_file(back.f_code.co_filename)
            back = back.f_back
        if caller != callee:
            self.hops.append(Hop(_thread_name(), caller, callee, frame.f_code.co_name))
        if self.stop_at is not None and (callee, frame.f_code.co_name) == self.stop_at:
            self.hops.append(Hop(_thread_name(), callee, callee, frame.f_code.co_name))
            self.armed = False

    def install(self) -> None:
        threading.setprofile(self)
        sys.setprofile(self)

    def uninstall(self) -> None:
        self.armed = False
        sys.setprofile(None)
        threading.setprofile(None)


@dataclass
class Span:
    name: str
    files: list[tuple[str, str]]  # (file, thread first seen on), in the order first entered
    hops: int
    threads: list[str]
    sequence: list[tuple[str, str, str, int]]  # (thread, caller, callee, times in a row)


def span(name: str, hops: list[Hop]) -> Span:
    files: dict[str, str] = {}
    threads: list[str] = []
    sequence: list[tuple[str, str, str, int]] = []
    count = 0
    for hop in hops:
        if hop.caller == hop.callee:  # the stop marker
            continue
        count += 1
        files.setdefault(hop.callee, hop.thread)
        if hop.thread not in threads:
            threads.append(hop.thread)
        key = (hop.thread, hop.caller or "(thread start)", hop.callee)
        if sequence and sequence[-1][:3] == key:
            sequence[-1] = (*key, sequence[-1][3] + 1)
        else:
            sequence.append((*key, 1))
    return Span(name, list(files.items()), count, threads, sequence)


def _first_forward(hops: list[Hop]) -> int:
    return next((i for i, h in enumerate(hops) if h.callee.startswith(MODEL_FOLDER)), len(hops))


def trace_llm(model: str | None) -> list[Span]:
    """One constrained LLM.generate: the span to the model's first forward, and the span to the result."""
    recorder = HopRecorder()
    recorder.install()  # before the LLM starts its threads, so that they inherit the hook
    try:
        import dllm_constrain as dc

        llm = dc.LLM(model)
        llm.generate([PROMPT], schema=WARMUP_SCHEMA)
        recorder.armed = True
        [result] = llm.generate([PROMPT], schema=TRACED_SCHEMA)
        recorder.armed = False
    finally:
        recorder.uninstall()
    print(f"[llm] answer: {result.text}", file=sys.stderr)
    hops = recorder.hops
    return [span("LLM.generate -> first model forward", hops[:_first_forward(hops) + 1]),
            span("LLM.generate -> result", hops)]


def trace_http(model: str | None) -> list[Span]:
    """One constrained chat completion through the server's app, until LLMEngine.add_request is called."""
    from starlette.testclient import TestClient

    from dllm_constrain.serve.__main__ import build_server_app, parse_args

    recorder = HopRecorder(stop_at=("engine/llm_engine.py", "add_request"))
    recorder.install()
    try:
        server = build_server_app(parse_args([] if model is None else ["--model", model]))
        with TestClient(server.app, base_url="http://127.0.0.1") as client:
            _chat(client, WARMUP_SCHEMA)
            recorder.armed = True
            reply = _chat(client, HTTP_SCHEMA)
            recorder.armed = False
    finally:
        recorder.uninstall()
    print(f"[http] answer: {reply}", file=sys.stderr)
    return [span("POST /v1/chat/completions -> LLMEngine.add_request", recorder.hops)]


def _chat(client: Any, schema: dict[str, Any]) -> str:
    response = client.post("/v1/chat/completions", json={
        "model": "dllm-constrain-bundled", "messages": [{"role": "user", "content": PROMPT}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "record", "schema": schema}}})
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"]


def render(spans: list[Span], hop_lines: int) -> str:
    out = []
    for s in spans:
        out.append(f"== {s.name}: {len(s.files)} files, {s.hops} hops, {len(s.threads)} threads "
                   f"({', '.join(s.threads)})")
        out += [f"  {i:3d}  {f}  [{t}]" for i, (f, t) in enumerate(s.files, 1)]
        shown = s.sequence if hop_lines < 0 else s.sequence[:hop_lines]
        out.append(f"  hops in order ({len(s.sequence)} runs" + ("" if len(shown) == len(s.sequence)
                                                                  else f", first {len(shown)}") + "):")
        out += [f"    [{t}] {a} -> {b}" + (f"  x{n}" if n > 1 else "") for t, a, b, n in shown]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", choices=("llm", "http", "both"), default="both")
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the bundled model)")
    ap.add_argument("--hops", type=int, default=60, help="hop runs printed per span (-1: all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    spans: list[Span] = []
    if args.path in ("llm", "both"):
        spans += trace_llm(args.model)
    if args.path in ("http", "both"):
        spans += trace_http(args.model)
    print(json.dumps([asdict(s) for s in spans], indent=1) if args.json else render(spans, args.hops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
