"""The OpenAI-compatible server under load (Poisson arrivals) against a static-batch server on the same arrivals.

    python benchmarks/bench_serving.py --rates 0.5,1,2 --n 24 --seed 0      # bundled model
    python benchmarks/bench_serving.py --quick                               # a small run (about a minute)

Requests: held-out-style requests of the project's training generator (`ExampleGenerator(10007)`, the held-out
seed of dllm_constrain/train/heldout.py); `--schemas` of their JSON Schemas, picked to span 1-8 top-level
properties (each compiled here first; one whose shortest answer does not fit the canvas is skipped). Each arrival
draws one of those requests and is constrained (`response_format: json_schema`, strict) with probability
`--constrained-share`, else the same request text unconstrained; a `--stream-share` of the arrivals stream.

Continuous (the server): `python -m dllm_constrain.serve` in a subprocess on 127.0.0.1 (a free port,
`--max-batch-size B`), warmed up with one request per schema, then one asyncio task per arrival sends its request
through the official `openai` async client (max_retries=0, bounded timeout) at its arrival time. Time to first
token (TTFT) of a streamed request is the time to its first non-empty SSE delta (the first committed left prefix).

Static (in-process, no HTTP, the same arrivals, after the server pass): arrivals wait in a FIFO; whenever the
engine is idle, all waiting requests (at most B) run as one batch to completion through `llm.engine.generate`,
built the way the API builds them (`llm.processor.build(prompt, **options)`, `make_requests()` on this thread, the
thread that runs the engine). Latency counts from each request's arrival; the TTFT column of a static batch is the
time its first committed left prefix appears (what a static server that streamed would send first).

Per rate and server: completed requests, throughput (requests/s and completion tokens/s over the span from the
first arrival to the last answer), latency p50/p99 (p99 of a few dozen requests is about the maximum), TTFT p50
over the streamed requests, and schema-validity of the constrained answers (jsonschema Draft 2020-12 with its
format checker; invalid must be 0). Then constrained-only and unconstrained-only passes through the server at one
rate (the same arrivals and request texts) give the constrained / unconstrained throughput ratio.

Both servers run with `--threads` torch threads (OMP_NUM_THREADS for the subprocess); they run one after the
other, never at the same time.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
from _server import ServerProcess

HELDOUT_SEED = 10007


# ---------------------------------------------------------------------------------------------- workload
@dataclass(frozen=True)
class Arrival:
    t: float  # seconds after the start of the pass
    example: int  # index into the request pool
    constrained: bool
    stream: bool


@dataclass
class Outcome:
    arrival: Arrival
    ok: bool
    latency: float | None = None  # arrival -> answer complete
    ttft: float | None = None  # arrival -> first committed text (streamed requests)
    tokens: int = 0
    text: str = ""
    valid: bool | None = None  # constrained answers only
    error: str | None = None
    finish: float | None = None  # seconds after the pass's start


def schema_size(schema: dict[str, Any]) -> int:
    return len(schema.get("properties", {}))


def pick_requests(llm: Any, k: int, max_tokens: int) -> list[dict[str, Any]]:
    """k held-out examples whose schemas span 1-8 top-level properties, each compiled (in llm's cache) and
    fitting the canvas with room for values (shortest answer at most 60% of it)."""
    from dllm_constrain.train.data import ExampleGenerator

    pool = ExampleGenerator(HELDOUT_SEED, plain_text_share=0.0).examples(400)
    by_size: dict[int, deque] = {}
    for e in pool:
        by_size.setdefault(schema_size(e["schema"]), deque()).append(e)
    sizes = sorted(by_size)
    chosen: list[dict[str, Any]] = []
    while len(chosen) < k and any(by_size[s] for s in sizes):
        for s in sizes:
            if len(chosen) >= k or not by_size[s]:
                continue
            e = by_size[s].popleft()
            try:
                compiled = llm.compile(schema=e["schema"], strict=True)
                if int(compiled.min_tokens()) > 0.6 * max_tokens:
                    continue
            except Exception:  # noqa: BLE001 - a schema the compiler refuses is simply not part of the set
                continue
            chosen.append(e)
    return chosen


def poisson_arrivals(rate: float, n: int, n_examples: int, seed: int, constrained_share: float,
                     stream_share: float) -> list[Arrival]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(Arrival(t, rng.randrange(n_examples), rng.random() < constrained_share,
                           rng.random() < stream_share))
    return out


def validator_for(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def check(outcome: Outcome, examples: list[dict[str, Any]], validators: list[Any]) -> None:
    if outcome.ok and outcome.arrival.constrained:
        try:
            outcome.valid = validators[outcome.arrival.example].is_valid(json.loads(outcome.text))
        except ValueError:
            outcome.valid = False


# ---------------------------------------------------------------------------------------------- server
def start_server(max_batch_size: int, max_queue: int, threads: int, startup_timeout: float) -> ServerProcess:
    """The server under test, with a bounded start-up wait."""
    return ServerProcess(["--max-batch-size", str(max_batch_size), "--max-queue", str(max_queue)], threads,
                         startup_timeout=startup_timeout, log_prefix="bench_serving_")


async def _one(client: Any, model_id: str, a: Arrival, e: dict[str, Any], t0: float, max_tokens: int) -> Outcome:
    kwargs: dict[str, Any] = {"model": model_id, "messages": [{"role": "user", "content": e["request"]}],
                              "max_tokens": max_tokens, "temperature": 0}
    if a.constrained:
        kwargs["response_format"] = {"type": "json_schema",
                                     "json_schema": {"name": "record", "schema": e["schema"], "strict": True}}
    loop = asyncio.get_running_loop()
    out = Outcome(a, ok=False)
    try:
        if a.stream:
            parts, tokens = [], 0
            stream = await client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                          **kwargs)
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    if out.ttft is None:
                        out.ttft = loop.time() - t0 - a.t
                    parts.append(chunk.choices[0].delta.content)
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            out.text, out.tokens = "".join(parts), tokens
        else:
            resp = await client.chat.completions.create(**kwargs)
            out.text, out.tokens = resp.choices[0].message.content or "", resp.usage.completion_tokens
        out.ok = True
    except Exception as exc:  # noqa: BLE001 - counted as a failed request, with its reason
        out.error = f"{type(exc).__name__}: {exc}"[:200]
    out.finish = loop.time() - t0
    if out.ok:
        out.latency = out.finish - a.t
    return out


async def _server_pass(base: str, model_id: str, arrivals: list[Arrival], examples: list[dict[str, Any]],
                       max_tokens: int, timeout: float) -> list[Outcome]:
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=timeout) as client:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        tasks = []
        for a in arrivals:
            delay = t0 + a.t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(client, model_id, a, examples[a.example], t0, max_tokens)))
        return list(await asyncio.gather(*tasks))


def server_pass(server: ServerProcess, arrivals: list[Arrival], examples: list[dict[str, Any]], max_tokens: int,
                timeout: float) -> list[Outcome]:
    return asyncio.run(_server_pass(server.base, server.model_id, arrivals, examples, max_tokens, timeout))


# ---------------------------------------------------------------------------------------------- static baseline
def static_pass(llm: Any, arrivals: list[Arrival], examples: list[dict[str, Any]], max_tokens: int,
                batch_size: int) -> list[Outcome]:
    """A static-batch server on the same arrivals, in real time on this thread (see the module docstring)."""
    from dllm_constrain.api import generate_options
    eos = llm.model.special.eos_id
    pending = deque(sorted(arrivals, key=lambda a: a.t))
    waiting: deque[Arrival] = deque()
    outcomes: list[Outcome] = []
    t0 = time.perf_counter()
    while pending or waiting:
        now = time.perf_counter() - t0
        while pending and pending[0].t <= now:
            waiting.append(pending.popleft())
        if not waiting:
            time.sleep(max(0.0, pending[0].t - now))
            continue
        batch = [waiting.popleft() for _ in range(min(batch_size, len(waiting)))]
        requests, config = [], None
        for a in batch:
            e = examples[a.example]
            opts = {"max_new_tokens": max_tokens, "temperature": 0.0}
            if a.constrained:
                opts.update(schema=e["schema"], strict=True)
            call = llm.processor.build(e["request"], **opts)
            requests += call.make_requests()
            config = call.config
        first: dict[int, float] = {}

        def progress(event: Any) -> None:
            for snap in event.snapshots:
                if snap.index not in first and snap.committed and snap.committed[0] and snap.canvas[0] != eos:
                    first[snap.index] = time.perf_counter() - t0

        try:
            results = llm.engine.generate(requests, progress=progress, config=config, raise_errors=False)
        except Exception as exc:  # noqa: BLE001 - the whole batch failed
            end = time.perf_counter() - t0
            outcomes += [Outcome(a, ok=False, error=f"{type(exc).__name__}: {exc}"[:200], finish=end) for a in batch]
            continue
        end = time.perf_counter() - t0
        for i, (a, r) in enumerate(zip(batch, results)):
            if r.error is not None:
                outcomes.append(Outcome(a, ok=False, error=f"{type(r.error).__name__}: {r.error}"[:200], finish=end))
                continue
            ttft = first[i] - a.t if a.stream and i in first else None
            outcomes.append(Outcome(a, ok=True, latency=end - a.t, ttft=ttft, tokens=len(r.token_ids),
                                    text=r.text, finish=end))
    return outcomes


# ---------------------------------------------------------------------------------------------- report
def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    done = [o for o in outcomes if o.ok]
    start = min((o.arrival.t for o in outcomes), default=0.0)
    span = max((o.finish for o in done), default=start) - start  # from the first arrival to the last answer
    lat = [o.latency for o in done]
    ttft = [o.ttft for o in done if o.arrival.stream and o.ttft is not None]
    constrained = [o for o in done if o.arrival.constrained]
    pct = (lambda xs, q: float(np.percentile(xs, q)) if xs else float("nan"))
    return {
        "requests": len(outcomes), "completed": len(done), "failed": len(outcomes) - len(done),
        "errors": sorted({o.error for o in outcomes if o.error})[:3],
        "span_s": span, "req_per_s": len(done) / span if span else 0.0,
        "tok_per_s": sum(o.tokens for o in done) / span if span else 0.0,
        "p50_s": pct(lat, 50), "p99_s": pct(lat, 99), "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
        "streamed": len(ttft), "constrained": len(constrained),
        "invalid": sum(1 for o in constrained if not o.valid),
    }


def table(rows: list[tuple[str, str, dict[str, Any]]]) -> str:
    head = ("| offered rate | server | completed | req/s | completion tok/s | p50 latency s | p99 latency s | "
            "TTFT p50 s (streamed) | constrained invalid |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for rate, name, s in rows:
        lines.append(f"| {rate} | {name} | {s['completed']}/{s['requests']} | {s['req_per_s']:.2f} | "
                     f"{s['tok_per_s']:.1f} | {s['p50_s']:.2f} | {s['p99_s']:.2f} | "
                     f"{s['ttft_p50_s']:.2f} (n={s['streamed']}) | {s['invalid']}/{s['constrained']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="0.5,1,2", help="offered loads, requests/s (comma-separated)")
    ap.add_argument("--n", type=int, default=24, help="requests per rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--schemas", type=int, default=12, help="distinct held-out schemas/requests (8-16)")
    ap.add_argument("--max-tokens", type=int, default=96, help="canvas (max_tokens) of every request")
    ap.add_argument("--max-batch-size", type=int, default=8, help="both servers' batch size")
    ap.add_argument("--max-queue", type=int, default=256)
    ap.add_argument("--constrained-share", type=float, default=0.67)
    ap.add_argument("--stream-share", type=float, default=0.5)
    ap.add_argument("--ratio-rate", type=float, default=None,
                    help="rate of the constrained-only / unconstrained-only passes (default: the highest rate)")
    ap.add_argument("--ratio-n", type=int, default=None, help="requests per ratio pass (default: --n)")
    ap.add_argument("--no-ratio", action="store_true", help="skip the constrained/unconstrained passes")
    ap.add_argument("--no-static", action="store_true", help="skip the static-batch baseline")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each server")
    ap.add_argument("--timeout", type=float, default=240.0, help="client timeout per request, s")
    ap.add_argument("--startup-timeout", type=float, default=180.0)
    ap.add_argument("--json-out", default=None, help="write all summaries here")
    ap.add_argument("--quick", action="store_true", help="--rates 1 --n 8 --schemas 8 --ratio-n 6")
    args = ap.parse_args()
    if args.quick:
        args.rates, args.n, args.schemas, args.ratio_n = "1", 8, 8, 6
    rates = [float(r) for r in args.rates.split(",")]
    ratio_rate = args.ratio_rate if args.ratio_rate is not None else max(rates)
    ratio_n = args.ratio_n or args.n

    import torch

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    from dllm_constrain.api import LLM

    t_start = time.perf_counter()
    llm = LLM()
    examples = pick_requests(llm, args.schemas, args.max_tokens)
    validators = [validator_for(e["schema"]) for e in examples]
    print(f"{len(examples)} schemas, top-level properties: {sorted(schema_size(e['schema']) for e in examples)}",
          flush=True)

    server = start_server(args.max_batch_size, args.max_queue, args.threads, args.startup_timeout)
    rows: list[tuple[str, str, dict[str, Any]]] = []
    ratio: dict[str, dict[str, Any]] = {}
    try:
        print(f"server up on port {server.port} after {time.perf_counter() - t_start:.0f} s; warming up", flush=True)
        warm = [Arrival(0.0, i, True, False) for i in range(len(examples))] + [Arrival(0.0, 0, False, True)]
        w = server_pass(server, warm, examples, args.max_tokens, args.timeout)
        if not args.no_static:
            static_pass(llm, warm, examples, args.max_tokens, args.max_batch_size)
        print(f"warm-up: {sum(o.ok for o in w)}/{len(w)} ok; {time.perf_counter() - t_start:.0f} s", flush=True)
        for k, rate in enumerate(rates):
            arrivals = poisson_arrivals(rate, args.n, len(examples), args.seed + k, args.constrained_share,
                                        args.stream_share)
            passes = [("continuous (HTTP server)", lambda: server_pass(server, arrivals, examples, args.max_tokens,
                                                                       args.timeout))]
            if not args.no_static:
                passes.append(("static batches (in-process)",
                               lambda: static_pass(llm, arrivals, examples, args.max_tokens, args.max_batch_size)))
            for name, run in passes:
                outs = run()
                for o in outs:
                    check(o, examples, validators)
                s = summarize(outs)
                rows.append((f"{rate:g}/s", name, s))
                print(f"rate {rate:g}/s {name}: {json.dumps(s)}  [{time.perf_counter() - t_start:.0f} s]", flush=True)
        if not args.no_ratio:
            base = poisson_arrivals(ratio_rate, ratio_n, len(examples), args.seed + 1000, 1.0, args.stream_share)
            for label, constrained in (("constrained only", True), ("unconstrained only", False)):
                arrivals = [Arrival(a.t, a.example, constrained, a.stream) for a in base]
                outs = server_pass(server, arrivals, examples, args.max_tokens, args.timeout)
                for o in outs:
                    check(o, examples, validators)
                ratio[label] = summarize(outs)
                rows.append((f"{ratio_rate:g}/s", f"continuous, {label}", ratio[label]))
                print(f"rate {ratio_rate:g}/s {label}: {json.dumps(ratio[label])}  "
                      f"[{time.perf_counter() - t_start:.0f} s]", flush=True)
    finally:
        server.stop()

    print()
    print(f"{len(examples)} held-out schemas, canvas {args.max_tokens}, batch size {args.max_batch_size}, "
          f"{args.n} requests per rate, seed {args.seed}, {args.threads} torch thread(s) per server")
    print(table(rows))
    print()
    by_rate: dict[str, dict[str, dict[str, Any]]] = {}
    for rate, name, s in rows:
        by_rate.setdefault(rate, {})[name] = s
    for rate, d in by_rate.items():
        c, st = d.get("continuous (HTTP server)"), d.get("static batches (in-process)")
        if c and st and st["req_per_s"] and c["p99_s"]:
            print(f"{rate}: continuous / static throughput {c['req_per_s'] / st['req_per_s']:.2f}x, "
                  f"p99 latency continuous / static {c['p99_s'] / st['p99_s']:.2f}")
    if len(ratio) == 2 and ratio["unconstrained only"]["req_per_s"]:
        cu, un = ratio["constrained only"], ratio["unconstrained only"]
        print(f"{ratio_rate:g}/s: constrained / unconstrained throughput {cu['req_per_s'] / un['req_per_s']:.2f}x "
              f"requests/s, {cu['tok_per_s'] / max(un['tok_per_s'], 1e-9):.2f}x tokens/s; p50 latency "
              f"{cu['p50_s']:.2f} vs {un['p50_s']:.2f} s")
    invalid = sum(s["invalid"] for _, _, s in rows)
    print(f"invalid constrained answers: {invalid}; total {time.perf_counter() - t_start:.0f} s")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "rows": rows, "ratio": ratio}, indent=1))


if __name__ == "__main__":
    main()
