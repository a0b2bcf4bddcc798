"""Requests/s of Ray Serve replicas of the server against the plain server, on the same arrivals; Ray's overhead.

    python benchmarks/bench_ray_replicas.py                       # bundled model, 1 and 2 replicas (about 2 min)
    python benchmarks/bench_ray_replicas.py --replicas 1,2,4 --n 48 --concurrency 16

Arrivals: `--n` json_schema chat requests (a person record, `--max-tokens` canvas, seeds 0..n-1), sent by
`--concurrency` client threads at once (a closed loop: each thread sends its next request when its answer is
back), through the official `openai` client (max_retries=0). Every answer is checked against its schema.

Servers, one after the other, never at once, each warmed up with one request per client thread:
  plain:    `python -m dllm_constrain.serve` in a subprocess on 127.0.0.1 (OMP_NUM_THREADS=`--threads`);
  ray xN:   `python -m dllm_constrain.serve.ray --replicas N` in a subprocess (a local Ray instance with
            `--ray-num-cpus` CPUs; each replica reserves `--num-cpus-per-replica`, which Ray also gives it as
            OMP_NUM_THREADS).
Each server gets the same `--max-batch-size`. Per server: requests/s over the run (first send to last answer),
latency p50/p90, and the ratio to the plain server.

Ray's per-request overhead: `--probe` sequential GET /v1/models (no engine work: the proxy hop, the router and the
replica's ASGI call) and sequential 1-request generations of the same canvas, median latency through Ray with 1
replica minus the same through the plain server.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jsonschema
import openai
from _server import ROOT, free_port, wait_until_answers

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}}, "required": ["name", "age", "city"]}
ASK = "Create a record with name Ada Lovelace; age 36; city London."
MODEL = "dllm-constrain-bundled"


@dataclass(frozen=True)
class RunResult:
    name: str
    requests_per_s: float
    p50_s: float
    p90_s: float
    invalid: int
    models_ms: float  # median GET /v1/models latency
    one_request_ms: float  # median latency of one generation alone


def _ask(client: Any, seed: int, max_tokens: int) -> tuple[float, bool]:
    start = time.perf_counter()
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ASK}], seed=seed, max_tokens=max_tokens,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    elapsed = time.perf_counter() - start
    try:
        jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)
        return elapsed, True
    except (ValueError, jsonschema.ValidationError):
        return elapsed, False


def _measure(name: str, url: str, args: argparse.Namespace) -> RunResult:
    client = openai.OpenAI(base_url=url, api_key="x", timeout=600, max_retries=0)
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(lambda i: _ask(client, 10_000 + i, args.max_tokens), range(args.concurrency)))  # warm-up
        start = time.perf_counter()
        outcomes = list(pool.map(lambda i: _ask(client, i, args.max_tokens), range(args.n)))
        span = time.perf_counter() - start
    latencies = sorted(t for t, _ in outcomes)
    models = []
    for _ in range(args.probe):
        t0 = time.perf_counter()
        client.models.list()
        models.append(time.perf_counter() - t0)
    single = [_ask(client, 20_000 + i, args.max_tokens)[0] for i in range(args.probe)]
    return RunResult(name, args.n / span, statistics.median(latencies),
                     latencies[min(len(latencies) - 1, int(0.9 * len(latencies)))],
                     sum(not ok for _, ok in outcomes), 1000 * statistics.median(models),
                     1000 * statistics.median(single))


def _serve(command: list[str], port: int, env: dict[str, str], name: str, args: argparse.Namespace) -> RunResult:
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_answers(f"{url}/models", proc, timeout=300)
        return _measure(name, url, args)
    finally:
        proc.terminate()  # SIGTERM: the Ray command deletes its replicas and stops its Ray instance
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", default="1,2", help="replica counts to measure, comma-separated")
    p.add_argument("--n", type=int, default=32, help="requests per server")
    p.add_argument("--concurrency", type=int, default=8, help="client threads sending at once")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the plain server")
    p.add_argument("--num-cpus-per-replica", type=float, default=1.0)
    p.add_argument("--ray-num-cpus", type=float, default=2.0)
    p.add_argument("--probe", type=int, default=9, help="sequential requests for the overhead medians")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure every server this many times, interleaved (plain, ray x1, ray x2, plain, ...): "
                        "on a shared machine the load drifts between runs")
    args = p.parse_args()

    server_opts = ["--max-batch-size", str(args.max_batch_size), "--log-level", "warning"]
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "RAY_USAGE_STATS_ENABLED": "0"}
    rounds: list[list[RunResult]] = []
    for _ in range(args.rounds):
        results: list[RunResult] = []
        port = free_port()
        results.append(_serve([sys.executable, "-m", "dllm_constrain.serve", "--port", str(port), *server_opts],
                              port, env, "plain server", args))
        for count in (int(c) for c in args.replicas.split(",")):
            port = free_port()
            command = [sys.executable, "-m", "dllm_constrain.serve.ray", "--replicas", str(count), "--port",
                       str(port), "--num-cpus-per-replica", str(args.num_cpus_per_replica), "--ray-num-cpus",
                       str(args.ray_num_cpus), *server_opts]
            results.append(_serve(command, port, env, f"ray x{count}", args))
        rounds.append(results)
    print(f"{args.n} json_schema requests, {args.concurrency} in flight, max_tokens {args.max_tokens}, "
          f"batch {args.max_batch_size}; {os.cpu_count()} CPUs")
    for i, results in enumerate(rounds):
        print(f"round {i + 1}")
        _report(results)


def _report(results: list[RunResult]) -> None:
    base = results[0]
    print(f"{'server':<14}{'req/s':>8}{'x plain':>9}{'p50 s':>8}{'p90 s':>8}{'invalid':>9}"
          f"{'GET /models ms':>16}{'1 request ms':>14}")
    for r in results:
        print(f"{r.name:<14}{r.requests_per_s:>8.2f}{r.requests_per_s / base.requests_per_s:>9.2f}"
              f"{r.p50_s:>8.2f}{r.p90_s:>8.2f}{r.invalid:>9}{r.models_ms:>16.1f}{r.one_request_ms:>14.1f}")
    ray1 = next((r for r in results if r.name == "ray x1"), None)
    if ray1 is not None:
        print(f"Ray's per-request overhead (ray x1 - plain, medians): GET /v1/models "
              f"{ray1.models_ms - base.models_ms:+.1f} ms, one generation {ray1.one_request_ms - base.one_request_ms:+.1f} ms")


if __name__ == "__main__":
    main()
