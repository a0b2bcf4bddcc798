"""Resident memory of the server over many distinct JSON Schemas: it must level off, not grow with every schema.

    python benchmarks/bench_soak_memory.py                       # a quick run: 120 schemas
    python benchmarks/bench_soak_memory.py --schemas 1200 --cache-mb default,64 --plot docs/soak_memory.png
    python benchmarks/bench_soak_memory.py --schemas 1200 --server-root /tmp/old-checkout --save before.json
    python benchmarks/bench_soak_memory.py --schemas 1200 --compare before.json --plot docs/soak_memory.png
    python benchmarks/bench_soak_memory.py --calibrate 300        # the cache's estimate against resident memory

`python -m dllm_constrain.serve` (the bundled model) runs in a subprocess on 127.0.0.1 and a free port; one client
sends `--schemas` chat requests one after the other, each constrained by a JSON Schema no other request uses
(`response_format: json_schema`, strict; property names, patterns, `patternProperties`, enums and bounds all
depend on the schema's number), with a short canvas (`--max-tokens`). Every `--every` requests the server's
resident memory (VmRSS of /proc/<pid>/status) is sampled. The compile cache and the constraint layer's other
caches are bounded by bytes (docs/constraints.md, "Memory"): once they are full, each new schema evicts old ones,
so resident memory levels off. The report gives the growth per schema over the first and the last third of the
run (MB per schema) and the plateau's spread; `--plot` writes resident memory against schemas served (PNG).
`--cache-mb` runs one server per budget given (the server's --compile-cache-memory; "default": its default);
`--server-root` runs the server from another checkout of the project (a before/after comparison), `--save` writes
the samples as JSON and `--compare` draws saved runs beside this one's.

`--calibrate N` runs in this process instead: N distinct schemas compiled (no cache) with a canvas state each, all
kept alive, and compares the growth of resident memory with what the caches would be charged for them
(`CompiledConstraint.memory_bytes` and the reading-DFA cache's growth).

Bounded: every request has a client timeout, the run stops after `--schemas` requests or `--max-seconds`,
whichever comes first, and the server is stopped at exit.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from _server import ROOT, ServerProcess

WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta", "lambda", "zeta")


def distinct_schema(i: int) -> dict[str, Any]:
    """A JSON Schema that differs from every other `i`'s in its names, patterns, enums and bounds (so that it
    compiles to a constraint of its own), short enough to fit a small canvas."""
    w = WORDS[i % len(WORDS)]
    return {
        "type": "object",
        "properties": {
            f"{w}_{i}": {"type": "string", "pattern": f"^[a-z]{{1,{1 + i % 7}}}{i % 97}$"},
            f"n{i}": {"type": "integer", "minimum": i % 50, "maximum": 1000 + i},
            f"tag{i % 13}": {"enum": [f"v{i}", f"w{i + 1}", i]},
            "flag": {"type": "boolean"},
        },
        "patternProperties": {f"^x{i}_[a-z]+$": {"type": "integer", "maximum": i + 5}},
        "required": [f"n{i}"],
        "additionalProperties": False,
    }


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid` in MB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def start_server(extra_args: list[str], threads: int, root: Path = ROOT) -> ServerProcess:
    """The server under test, run from the checkout at `root`."""
    return ServerProcess(extra_args, threads, root=root, log_prefix="bench_soak_")


def ask(server: ServerProcess, schema: dict[str, Any], max_tokens: int, timeout: float) -> int:
    """One constrained chat request: the HTTP status (200, or the error's status)."""
    body = {"model": server.model_id, "max_tokens": max_tokens, "temperature": 0, "seed": 0,
            "messages": [{"role": "user", "content": "Fill in the record."}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "record", "schema": schema, "strict": True}}}
    req = urllib.request.Request(f"{server.base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            json.load(r)
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def soak(args: argparse.Namespace, cache_mb: str) -> tuple[list[tuple[int, float]], dict[int, int]]:
    """Serve `args.schemas` distinct schemas with the compile-cache budget `cache_mb` ("default": the server's);
    [(schemas served, resident MB)] and the count of each status."""
    extra = [] if cache_mb == "default" else ["--compile-cache-memory", f"{float(cache_mb):g}MB"]
    server = start_server(extra, args.threads, Path(args.server_root))
    samples: list[tuple[int, float]] = []
    statuses: dict[int, int] = {}
    t_end = time.monotonic() + args.max_seconds
    try:
        for j in range(args.warmup):  # the process's one-time allocations (model, tokenizer tables) out of the way
            ask(server, distinct_schema(10_000_000 + j), args.max_tokens, args.request_timeout)
        samples.append((0, rss_mb(server.proc.pid)))
        for i in range(args.schemas):
            if time.monotonic() > t_end:
                print(f"stopped after {i} schemas: --max-seconds {args.max_seconds:g} reached")
                break
            status = ask(server, distinct_schema(i), args.max_tokens, args.request_timeout)
            statuses[status] = statuses.get(status, 0) + 1
            if (i + 1) % args.every == 0:
                samples.append((i + 1, rss_mb(server.proc.pid)))
                print(f"{i + 1:6d} schemas  {samples[-1][1]:8.1f} MB", flush=True)
    finally:
        server.stop()
    return samples, statuses


def report(label: str, samples: list[tuple[int, float]], statuses: dict[int, int]) -> None:
    third = max(2, len(samples) // 3)
    first, last = samples[:third], samples[-third:]
    ys = [y for _, y in last]
    print(f"[{label}] statuses: {dict(sorted(statuses.items()))}")
    print(f"[{label}] resident memory: {samples[0][1]:.1f} MB after warm-up, {samples[-1][1]:.1f} MB after "
          f"{samples[-1][0]} schemas (max {max(y for _, y in samples):.1f} MB)")
    print(f"[{label}] growth: first third {slope(first):.3f} MB/schema, last third {slope(last):.3f} MB/schema; "
          f"last third spans {min(ys):.1f}-{max(ys):.1f} MB")


def calibrate(n: int, max_tokens: int) -> None:
    """Resident memory against the estimate the caches charge, over n compiles kept alive (see the docstring)."""
    import gc

    from dllm_constrain import LLM
    from dllm_constrain.constraints.compiler import ConstraintCompiler
    from dllm_constrain.constraints.json_schema import patterns

    compiler = ConstraintCompiler(LLM().tokenizer_info(), cache=False)
    for j in range(5):  # one-time tables (tokenizer trie, byte set) out of the way
        compiler.compile(schema=distinct_schema(10_000_000 + j)).new_canvas_state(max_tokens)
    patterns._READING_DFAS.set_max_bytes(2**40)  # every reading DFA kept, so that the figures compare
    gc.collect()
    rss0, reading0 = rss_mb(os.getpid()), patterns._READING_DFAS.nbytes
    kept = []
    for i in range(n):
        compiled = compiler.compile(schema=distinct_schema(i))
        compiled.new_canvas_state(max_tokens)
        kept.append(compiled)
    gc.collect()
    grown_kb = (rss_mb(os.getpid()) - rss0) * 1024 / n
    est_kb = (sum(c.memory_bytes() for c in kept) + patterns._READING_DFAS.nbytes - reading0) / 1024 / n
    print(f"{n} distinct schemas compiled and kept: resident memory +{grown_kb:.0f} KB per schema, estimate "
          f"{est_kb:.0f} KB per schema (ratio {est_kb / grown_kb:.2f})")


def slope(samples: list[tuple[int, float]]) -> float:
    """Least-squares growth in MB per schema."""
    n = len(samples)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in samples) / n
    my = sum(y for _, y in samples) / n
    den = sum((x - mx) ** 2 for x, _ in samples)
    return sum((x - mx) * (y - my) for x, y in samples) / den if den else 0.0


def plot(series: dict[str, list[tuple[int, float]]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    for label, samples in series.items():
        ax.plot([x for x, _ in samples], [y for _, y in samples], marker=".", ms=3, lw=1, label=label)
    ax.set_xlabel("distinct schemas served")
    ax.set_ylabel("server resident memory (MB)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--schemas", type=int, default=120, help="distinct schemas to serve (default: a quick run)")
    p.add_argument("--every", type=int, default=10, help="sample resident memory every this many requests")
    p.add_argument("--warmup", type=int, default=5, help="requests (own schemas) before the first sample")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    p.add_argument("--cache-mb", default="default",
                   help="comma-separated compile-cache budgets in MB, one server run each ('default': the server's)")
    p.add_argument("--server-root", default=str(ROOT), help="the checkout the server runs from (default: this one)")
    p.add_argument("--label", default=None, help="this checkout's name in the report and the plot")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--max-seconds", type=float, default=1800.0, help="stop each run after this long")
    p.add_argument("--save", default=None, help="write the samples (JSON) here")
    p.add_argument("--compare", action="append", default=[], help="a --save file to draw beside this run")
    p.add_argument("--plot", default=None, help="write resident memory against schemas served here (PNG)")
    p.add_argument("--calibrate", type=int, default=None, metavar="N",
                   help="compare the caches' estimate with resident memory over N compiles in this process")
    args = p.parse_args(argv)
    if args.calibrate is not None:
        calibrate(args.calibrate, args.max_tokens)
        return 0
    if args.schemas < 1 or args.every < 1:
        p.error("--schemas and --every must be >= 1")
    budgets = [b.strip() for b in args.cache_mb.split(",") if b.strip()]
    for b in budgets:
        if b != "default":
            try:
                float(b)
            except ValueError:
                p.error(f"--cache-mb takes numbers (MB) or 'default', got {b!r}")
    series: dict[str, list[tuple[int, float]]] = {}
    for path in args.compare:
        series.update({k: [tuple(x) for x in v] for k, v in json.loads(Path(path).read_text()).items()})
    for b in budgets:
        t0 = time.monotonic()
        label = f"{args.label or 'this checkout'}, compile cache {'default' if b == 'default' else b + ' MB'}"
        samples, statuses = soak(args, b)
        print(f"[{label}] {time.monotonic() - t0:.0f} s")
        report(label, samples, statuses)
        series[label] = samples
    if args.save:
        Path(args.save).write_text(json.dumps(series))
    if args.plot:
        plot(series, args.plot, f"python -m dllm_constrain.serve (bundled model)\none distinct JSON Schema per "
                                f"request, max_tokens {args.max_tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
