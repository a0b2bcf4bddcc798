"""The path one HTTP request takes before the engine: the project's source files it crosses and the calls between
them, from the route handler to `LLMEngine.add_request`.

    python benchmarks/trace_request_path.py [--requests 2]

Serves the bundled model in-process (uvicorn on 127.0.0.1, a free port), sends `--requests` chat completions with
a regex constraint one after the other (the first warms the caches), and follows every thread's Python calls
(`sys.setprofile` / `threading.setprofile`) while the last one runs: recording starts at the first call into
serve/app.py and stops at the first call of `LLMEngine.add_request`. Printed: the distinct project files called
in that window (in first-call order), and the call transitions between two different project files (a call whose
caller's file differs from the callee's). Files outside the project (the standard library, fastapi, torch) are
left out of both counts; calls made by them into the project count with the project frame nearest above them as
the caller. The front-door files (marked *) are those outside engine/, kernels/ and constraints/.
"""
from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import dllm_constrain

PROJECT = Path(dllm_constrain.__file__).resolve().parent  # dllm_constrain/ (engine/ maps into it on install)
ROOTS = (PROJECT, PROJECT.parent / "engine", PROJECT.parent / "kernels")


def project_file(path: str) -> str | None:
    """The file's path relative to the project (engine/... for dllm_constrain.engine), or None outside it."""
    resolved = Path(path).resolve()
    for root in ROOTS:
        if resolved.is_relative_to(root):
            name = str(resolved.relative_to(root.parent))
            for sub in ("engine/", "kernels/"):  # an installed copy keeps them inside the package
                if name.startswith("dllm_constrain/" + sub):
                    return name[len("dllm_constrain/"):]
            return name
    return None


def front_door(name: str) -> bool:
    """Whether a project file is the request's way in, not the engine or the constraint layer it calls."""
    return not name.startswith(("engine/", "kernels/", "dllm_constrain/constraints/"))


@dataclass
class Trace:
    """What the profile hook saw while recording."""

    recording: bool = False
    done: bool = False
    files: list[str] = field(default_factory=list)  # distinct project files, first-call order
    transitions: int = 0
    edges: dict[tuple[str, str], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or self.done:
            return
        callee = project_file(frame.f_code.co_filename)
        if callee is None:
            return
        with self.lock:
            if not self.recording:
                if callee != "dllm_constrain/serve/app.py" or not ARMED.is_set():
                    return
                self.recording = True
            if callee not in self.files:
                self.files.append(callee)
            caller = _nearest_project_caller(frame.f_back)
            if caller is not None and caller != callee:
                self.transitions += 1
                self.edges[(caller, callee)] = self.edges.get((caller, callee), 0) + 1
            if frame.f_code.co_name == "add_request" and callee.endswith("llm_engine.py"):
                self.done = True


ARMED = threading.Event()  # set just before the measured request is sent


def _nearest_project_caller(frame: FrameType | None) -> str | None:
    while frame is not None:
        found = project_file(frame.f_code.co_filename)
        if found is not None:
            return found
        frame = frame.f_back
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, body: dict[str, Any]) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def serve(trace: Trace) -> tuple[Any, int, Callable[[], None]]:
    """(the server, its port, a stop function): the app over the bundled model, in a thread that is profiled."""
    import uvicorn

    from dllm_constrain import LLM
    from dllm_constrain.serve.app import build_app
    from dllm_constrain.serve.backend import EngineBackend
    from dllm_constrain.serve.chat import ChatFormatter

    llm = LLM()
    app = build_app(EngineBackend(llm), chat=ChatFormatter.for_llm(llm))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)

    def stop() -> None:
        server.should_exit = True
        thread.join(30)
    return server, port, stop


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2, help="requests sent; the last one is traced")
    args = p.parse_args(argv)
    trace = Trace()
    threading.setprofile(trace.hook)  # every thread started from now on: server, engine loop, builder
    sys.setprofile(trace.hook)
    _, port, stop = serve(trace)
    body = {"messages": [{"role": "user", "content": "What is 3 plus 4?"}], "max_tokens": 8,
            "structured_outputs": {"regex": "[0-9]+"}}
    try:
        for i in range(args.requests):
            if i == args.requests - 1:
                ARMED.set()
            status, text = _post(port, body)
            assert status == 200, text
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        stop()
    assert trace.done, "the request never reached LLMEngine.add_request"
    print(f"# {dllm_constrain.__file__}")
    door = [name for name in trace.files if front_door(name)]
    door_hops = sum(n for (a, b), n in trace.edges.items() if front_door(a) and front_door(b))
    print(f"project files before the engine: {len(trace.files)}; call transitions between them: {trace.transitions}")
    print(f"front-door files (not engine/, kernels/, constraints/): {len(door)}; transitions between them: "
          f"{door_hops}")
    for name in trace.files:
        print(f"  {'*' if front_door(name) else ' '} {name}")
    for (a, b), n in sorted(trace.edges.items(), key=lambda kv: -kv[1]):
        print(f"  {n:4d}  {a} -> {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
