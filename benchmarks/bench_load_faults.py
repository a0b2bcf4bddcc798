"""The OpenAI-compatible server under load and under faults: a bounded run that stops by itself, loopback only.

    python benchmarks/bench_load_faults.py                 # small (about 2-3 minutes on 2 cores)
    python benchmarks/bench_load_faults.py --clients 32 --requests 128 --max-tokens 48

Starts `python -m dllm_constrain.serve` (bundled model) in a subprocess on a free 127.0.0.1 port, then:

1. load: `--clients` threads send `--requests` constrained requests (JSON Schema, regex, choice, shipped grammar;
   a third of them streamed); every 200 answer is checked against its constraint (an invalid answer must be 0);
2. bad inputs: malformed bodies (deep nesting, huge integers, bad UTF-8, text/plain, oversize), unsupported fields,
   pathological schemas / regexes / grammars, path attacks on the grammar fields (absolute, `../`, `/proc/...`,
   a `.lark` file outside, a binary file, `%import` of a file in the server's working directory); each must be a
   4xx with an OpenAI error body that leaks nothing of the planted files;
3. disconnects: clients that send a request and hang up (streamed and not);
4. more load waves after the faults (`--waves`) (the resident-memory slope is measured between their ends);
5. SIGTERM under load: clients keep sending, the server gets SIGTERM; the time to exit is measured (it must stay
   within `--shutdown-timeout` plus the interpreter's exit) and no request may get a 500.

Prints one table: load held (answered / sent, latency p50 / p99), faults survived, bad inputs tried, invalid
answers, 500s, shutdown time, resident-memory slope (MB per 100 requests between the ends of the last two waves,
both after the faults). Exit status 1 when an invariant fails (an invalid answer, a 500, a leak, a crash, a slow shutdown).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _server import free_port

SECRET = "planted-secret-7c1d"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                          "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"]}
CHOICES = ["red", "green", "blue"]
PROMPT = "Create a record with name Ada Lovelace; age 36."


@dataclass
class Tally:
    sent: int = 0
    answered: int = 0
    refused: dict[int, int] = field(default_factory=dict)  # status -> count (4xx/503 under load)
    invalid: list[str] = field(default_factory=list)
    errors_500: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def status(self, status: int, what: str) -> None:
        with self.lock:
            if status >= 500 and status != 503:
                self.errors_500.append(f"{status} {what}")
            elif status != 200:
                self.refused[status] = self.refused.get(status, 0) + 1


# ---------------------------------------------------------------------------------------------- HTTP
def request(port: int, path: str, body: bytes, *, content_type: str = "application/json", timeout: float = 120.0
            ) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": content_type} if content_type else {}
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def sse_text(raw: bytes) -> str | None:
    """The concatenated text of a completion stream, or None when it ended without [DONE]."""
    text, done = "", False
    for line in raw.decode("utf-8", "replace").splitlines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        for choice in chunk.get("choices", []):
            text += choice.get("text") or ""
    return text if done else None


# ---------------------------------------------------------------------------------------------- load
def load_requests(n: int, max_tokens: int) -> list[tuple[dict[str, Any], Any]]:
    """(body, checker) pairs cycling through the constraint kinds; every third one streamed."""
    kinds = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}},
         lambda t: _valid_json(t, PERSON)),
        ({"guided_regex": "[0-9]{1,3}( [0-9]{1,3})*"}, lambda t: re.fullmatch("[0-9]{1,3}( [0-9]{1,3})*", t)),
        ({"guided_choice": CHOICES}, lambda t: t in CHOICES),
        ({"structured_outputs": {"json_object": True}}, lambda t: isinstance(_json_or_none(t), dict)),
    ]
    out = []
    for i in range(n):
        extra, check = kinds[i % len(kinds)]
        body = {"prompt": PROMPT, "max_tokens": max_tokens, "seed": i, **extra}
        if i % 3 == 2:
            body["stream"] = True
        out.append((body, check))
    return out


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _valid_json(text: str, schema: dict) -> bool:
    import jsonschema

    value = _json_or_none(text)
    return value is not None and jsonschema.Draft202012Validator(schema).is_valid(value)


def run_load(port: int, reqs: list[tuple[dict, Any]], clients: int, tally: Tally, timeout: float) -> None:
    def one(item: tuple[dict, Any]) -> None:
        body, check = item
        began = time.monotonic()
        try:
            status, _, raw = request(port, "/v1/completions", json.dumps(body).encode(), timeout=timeout)
        except OSError as exc:
            with tally.lock:
                tally.sent += 1
                tally.refused[0] = tally.refused.get(0, 0) + 1  # 0: no HTTP answer (client timeout, refused)
            return
        with tally.lock:
            tally.sent += 1
        tally.status(status, "load")
        if status != 200:
            return
        text = sse_text(raw) if body.get("stream") else json.loads(raw)["choices"][0]["text"]
        finish = None if body.get("stream") else json.loads(raw)["choices"][0]["finish_reason"]
        with tally.lock:
            tally.answered += 1
            tally.latencies.append(time.monotonic() - began)
            # a canvas that filled up ("length") may hold an unfinished answer: only finished ones must be valid
            if text is not None and finish != "length" and not check(text) and _finished_stream(body, raw):
                tally.invalid.append(f"{body} -> {text!r}")

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, reqs))


def _finished_stream(body: dict, raw: bytes) -> bool:
    if not body.get("stream"):
        return True
    return b'"finish_reason": "length"' not in raw and b'"finish_reason":"length"' not in raw


# ---------------------------------------------------------------------------------------------- bad inputs
def bad_inputs(planted: dict[str, str]) -> list[tuple[str, bytes, str]]:
    """(name, raw body, content type) of requests that must all be refused with a 4xx."""
    def body(**fields: Any) -> bytes:
        return json.dumps({"prompt": "x", "max_tokens": 16, **fields}).encode()

    deep_schema: Any = {"type": "string"}
    for _ in range(60):  # 120 JSON levels: past the server's body depth limit
        deep_schema = {"type": "array", "items": deep_schema, "minItems": 1}
    cases = [
        ("deep nesting", b"[" * 100_000 + b"]" * 100_000, "application/json"),
        ("huge integer", b'{"prompt": "x", "seed": ' + b"7" * 5000 + b"}", "application/json"),
        ("bad utf-8", b'{"prompt": "\xff"}', "application/json"),
        ("truncated", b'{"prompt": ', "application/json"),
        ("text/plain", body(), "text/plain"),
        ("form", b"prompt=x", "application/x-www-form-urlencoded"),
        ("oversize body", json.dumps({"prompt": "x" * (9 << 20)}).encode(), "application/json"),
        ("7.5 MB prompt", json.dumps({"prompt": "word " * 1_500_000}).encode(), "application/json"),
        ("top_logprobs", json.dumps({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}).encode(),
         "application/json"),
        ("logprobs", body(logprobs=3), "application/json"),
        ("n=5", body(n=5), "application/json"),
        ("top_k 5", body(top_k=5), "application/json"),
        ("seed 2^80", body(seed=2 ** 80), "application/json"),
        ("temperature inf", b'{"prompt": "x", "temperature": Infinity}', "application/json"),
        ("temperature nan", b'{"prompt": "x", "temperature": NaN}', "application/json"),
        ("max_tokens 10^12", body(max_tokens=10 ** 12), "application/json"),
        ("max_tokens 0", body(max_tokens=0), "application/json"),
        ("two constraints", body(guided_regex="a", guided_choice=["b"]), "application/json"),
        ("schema not an object", body(guided_json=[1, 2]), "application/json"),
        ("schema bad JSON text", body(guided_json="{not json"), "application/json"),
        ("schema minimum > maximum", body(guided_json={"type": "integer", "minimum": 5, "maximum": 1}),
         "application/json"),
        ("schema unresolvable $ref", body(guided_json={"$ref": "#/$defs/nope"}), "application/json"),
        ("schema remote $ref", body(guided_json={"$ref": "http://127.0.0.1:1/x.json"}), "application/json"),
        ("schema 60 arrays deep", body(guided_json=deep_schema, max_tokens=8), "application/json"),
        ("schema huge minLength", body(guided_json={"type": "string", "minLength": 10 ** 9}), "application/json"),
        ("regex does not parse", body(guided_regex="(a"), "application/json"),
        ("regex backreference", body(guided_regex=r"(a)\1"), "application/json"),
        ("regex a{1000000}", body(guided_regex="a{1000000}"), "application/json"),
        ("grammar does not parse", body(guided_grammar="start: ("), "application/json"),
        ("grammar not LALR", body(guided_grammar='start: a | b\na: "x"\nb: "x"\n'), "application/json"),
        ("grammar missing %import", body(guided_grammar="start: X\n%import nowhere.X\n"), "application/json"),
        ("grammar %import from cwd", body(guided_grammar="start: SECRET\n%import planted.SECRET\n"),
         "application/json"),
        ("unknown grammar name", body(guided_grammar="nosuchgrammar"), "application/json"),
        ("choice empty", body(guided_choice=[]), "application/json"),
        ("stop 5 strings", body(stop=["a", "b", "c", "d", "e"]), "application/json"),
        ("messages empty", json.dumps({"messages": []}).encode(), "application/json"),
        ("image content", json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode(),
         "application/json"),
    ]
    for label, path in planted.items():
        for fld in ("guided_grammar", "structured_outputs"):
            value = {"grammar": path} if fld == "structured_outputs" else path
            cases.append((f"path {label} via {fld}", body(**{fld: value}), "application/json"))
    return cases


def run_bad_inputs(port: int, cases: list[tuple[str, bytes, str]], tally: Tally) -> tuple[int, dict[str, float]]:
    """Each case once; returns how many were refused as they should be (a 4xx with an OpenAI error body) and the
    seconds each took to answer."""
    ok, took = 0, {}
    for name, raw, ctype in cases:
        path = "/v1/chat/completions" if b'"messages"' in raw[:64] else "/v1/completions"
        began = time.monotonic()
        try:
            status, _, answer = request(port, path, raw, content_type=ctype, timeout=120)
        except OSError as exc:  # the server closed the connection while the client still sent (413)
            status, answer = 413 if "oversize" in name else 0, b""
            if status == 0:
                tally.errors_500.append(f"{name}: no answer ({type(exc).__name__})")
                continue
        took[name] = time.monotonic() - began
        if status >= 500:
            tally.errors_500.append(f"{status} {name}: {answer[:200]!r}")
        if SECRET.encode() in answer:
            tally.leaks.append(name)
        if 400 <= status < 500 and (not answer or "error" in json.loads(answer)):
            ok += 1
        else:
            tally.invalid.append(f"bad input {name!r} answered {status}: {answer[:200]!r}")
    return ok, took


def run_disconnects(port: int, n: int) -> int:
    """Clients that send a request and hang up at once; returns how many were sent."""
    for i in range(n):
        body = json.dumps({"prompt": PROMPT, "max_tokens": 48, "stream": i % 2 == 0,
                           "guided_json": PERSON}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            time.sleep(0.05)
    return n


# ---------------------------------------------------------------------------------------------- server
def start_server(port: int, args: argparse.Namespace, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, "-m", "dllm_constrain.serve", "--port", str(port), "--max-batch-size",
           str(args.max_batch_size), "--shutdown-timeout", str(args.shutdown_timeout), "--max-queue-time",
           str(args.max_queue_time), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited at start: {proc.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the server did not come up within 180 s")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.2)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def sigterm_under_load(port: int, proc: subprocess.Popen, args: argparse.Namespace, tally: Tally) -> float:
    """Clients keep sending while the server gets SIGTERM; returns seconds from the signal to the exit."""
    reqs = load_requests(args.clients * 4, args.max_tokens * 4)
    stop_at = time.monotonic() + 60
    with ThreadPoolExecutor(args.clients) as pool:
        futures = [pool.submit(run_load, port, [r], 1, tally, 60.0) for r in reqs]
        time.sleep(args.sigterm_after)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=max(5.0, stop_at - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return float("inf")
        took = time.monotonic() - began
        for f in futures:
            f.result()
    return took


# ---------------------------------------------------------------------------------------------- main
def plant_files(root: Path) -> dict[str, str]:
    """Files a hostile client should never reach, and the grammar attacks naming them."""
    outside = root / "outside"
    outside.mkdir()
    (outside / "secret.lark").write_text(f'start: "{SECRET}"\n')
    (outside / "blob.bin").write_bytes(bytes(range(256)) * 64)
    (outside / "huge.lark").write_bytes(b"start: " + b'"a" | ' * 400_000 + b'"a"\n')
    (root / "planted.lark").write_text(f'SECRET: "{SECRET}"\n')  # the server's working directory
    return {"absolute .lark": str(outside / "secret.lark"), "relative ../": "../" + str(outside.name) + "/secret.lark",
            "/proc": "/proc/self/environ", "/etc/passwd": "/etc/passwd", "binary": str(outside / "blob.bin"),
            "huge": str(outside / "huge.lark"), "cwd .lark": "planted.lark", "home": "~/.bashrc"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--requests", type=int, default=48, help="requests per load wave")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--max-batch-size", type=int, default=4)
    p.add_argument("--max-queue-time", type=float, default=30.0)
    p.add_argument("--shutdown-timeout", type=float, default=8.0)
    p.add_argument("--sigterm-after", type=float, default=2.0, help="seconds of load before SIGTERM")
    p.add_argument("--disconnects", type=int, default=6)
    p.add_argument("--waves", type=int, default=5, help="load waves: one before the faults, the rest after (>= 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    args = p.parse_args()

    began = time.monotonic()
    tally = Tally()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "cwd"
        root.mkdir()
        planted = plant_files(Path(tmp))
        port = free_port()
        proc = start_server(port, args, root)
        rss: list[float] = [rss_mb(proc.pid)]
        run_load(port, load_requests(args.requests, args.max_tokens), args.clients, tally, 300.0)
        rss.append(rss_mb(proc.pid))
        cases = bad_inputs(planted)
        refused_ok, refusal_s = run_bad_inputs(port, cases, tally)
        run_disconnects(port, args.disconnects)
        for _ in range(max(2, args.waves - 1)):
            run_load(port, load_requests(args.requests, args.max_tokens), args.clients, tally, 300.0)
            rss.append(rss_mb(proc.pid))
        alive = proc.poll() is None
        at_shutdown = Tally()
        shutdown_s = sigterm_under_load(port, proc, args, at_shutdown)
        tally.invalid += at_shutdown.invalid
        tally.errors_500 += at_shutdown.errors_500
        stderr = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
    lat = sorted(tally.latencies)
    pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan"))
    slope = (rss[-1] - rss[-2]) / max(1, args.requests) * 100
    bound = args.shutdown_timeout + 5.0
    rows = [
        ("load held", f"{tally.answered}/{tally.sent} answered (refused: {dict(sorted(tally.refused.items()))}), "
                      f"latency p50 {pct(0.5):.2f} s, p99 {pct(0.99):.2f} s, {args.clients} clients"),
        ("faults survived", f"{'yes' if alive else 'NO'}: {len(cases)} bad inputs, {args.disconnects} "
                            f"disconnects, then {args.waves - 1} more load waves"),
        ("bad inputs tried", f"{len(cases)} ({refused_ok} refused with a 4xx error body); refused in: 7.5 MB "
                             f"prompt {refusal_s['7.5 MB prompt']:.3f} s, 9 MB body {refusal_s['oversize body']:.3f} s, "
                             f"slowest {max(refusal_s.values()):.2f} s ({max(refusal_s, key=refusal_s.get)})"),
        ("invalid answers", str(len(tally.invalid))),
        ("500s", str(len(tally.errors_500))),
        ("planted content leaked", str(len(tally.leaks))),
        ("shutdown time", f"{shutdown_s:.2f} s from SIGTERM under load to exit (--shutdown-timeout "
                          f"{args.shutdown_timeout:g}); requests then: {at_shutdown.answered} answered, "
                          f"{dict(sorted(at_shutdown.refused.items()))} refused (0: connection refused)"),
        ("resident memory", f"{rss[0]:.0f} MB at start, then after each wave: "
                            + " / ".join(f"{r:.0f}" for r in rss[1:])
                            + f" MB: slope {slope:+.1f} MB per 100 requests (last two waves)"),
        ("wall time", f"{time.monotonic() - began:.0f} s"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"| {'measure'.ljust(width)} | value |\n|{'-' * (width + 2)}|-------|")
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value} |")
    for line in (tally.invalid + tally.errors_500)[:20]:
        print("  !", line[:300])
    if tally.errors_500 and "Traceback" in stderr:
        print(stderr[-3000:])
    failed = tally.invalid or tally.errors_500 or tally.leaks or not alive or shutdown_s > bound
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
