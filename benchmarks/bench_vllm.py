"""Constrained vs unconstrained throughput inside vLLM (our plugin), beside vLLM's own xgrammar backend and
dllm-constrain's own server, on the same JSON schemas.

What it runs, each server on 127.0.0.1 on a free port, stopped at the end:

- `vllm-plugin`: `vllm serve` (vLLM's OpenAI server) of the tiny random Llama of tests/test_vllm_plugin.py
  (2 layers, hidden 128, 260-id byte-level tokenizer), started with our logits processor: unconstrained
  requests vs `response_format` json_schema requests, which the plugin hands to the constraint layer;
- `vllm-xgrammar`: the same model and flags without our processor: the same json_schema requests go to
  vLLM's default structured-output backend (xgrammar), for context;
- `dllm-constrain`: `python -m dllm_constrain.serve` with the bundled dLLM (a different model: its figures
  say what our own server does with the same schemas, not how it compares per token with the Llama).

Load: an openai AsyncOpenAI client keeps 8, then 32 requests in flight (closed loop: a finished request
is replaced at once) for `--seconds`, or `--max-requests` per level, whichever comes first; schemas are
cycled. Every constrained answer is validated (json.loads + jsonschema with format checks); the
unconstrained answers' valid-JSON rate is reported for information. Each (server, concurrency, mode) cell is
measured `--runs` times, constrained and unconstrained alternating, and the medians are reported.

Why the ratio is on tokens/s: unconstrained answers of a random model run to max_tokens, constrained ones stop
when the JSON is complete, so requests/s and latency compare answers of different lengths; with the same
number of requests in flight, output tokens/s is the cost of a decoding step with and without the masks. The
requests/s ratio is printed too: for our server's dLLM, which denoises a whole canvas per request whatever the
answer's length, that is the meaningful one. Answers of different lengths still tilt tokens/s: shorter constrained
answers mean more requests (prompt prefill, HTTP, detokenisation) per token. `--match-lengths` removes that:
each run serves the constrained requests first, then unconstrained requests asking for exactly those answer
lengths (max_tokens and ignore_eos, cycled), so both modes serve the same requests per token and the ratio is the
cost of the masks alone.

Schemas: examples/person.json and examples/order.json, plus up to `--jsb` schemas of
../shared/data/jsonschemabench (the first of each subset that compiles and whose shortest answer fits half of
max_tokens on the byte-level tokenizer); without that folder the run goes on with the two examples.

Run it in the vLLM venv (docs/vllm.md, "Install"), on one core:
    OMP_NUM_THREADS=1 taskset -c 1 .venv-vllm/bin/python benchmarks/bench_vllm.py --json /tmp/bench_vllm.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSB = ROOT.parent / "shared" / "data" / "jsonschemabench"
PLUGIN = "dllm_constrain.vllm_plugin:DllmConstrainLogitsProcessor"
JSB_SUBSETS = ["Github_easy", "Glaiveai2K", "Kubernetes", "Snowplow", "JsonSchemaStore", "Github_medium",
               "WashingtonPost", "Github_hard"]


# shapes of the random Llama (heads of dim 64)
MODEL_SIZES = {"tiny": dict(layers=2, hidden=128, heads=2, intermediate=256),
               "small": dict(layers=8, hidden=512, heads=8, intermediate=1408)}


class BenchError(RuntimeError):
    """A server that does not come up, or a request that fails."""


@dataclass(frozen=True)
class Schema:
    name: str
    schema: dict


@dataclass
class Sample:
    latency_s: float
    completion_tokens: int
    text: str
    schema: int
    finish_reason: str


@dataclass
class Cell:
    """One measured run of one (server, concurrency, mode)."""

    server: str
    concurrency: int
    mode: str
    run: int
    requests: int
    elapsed_s: float
    completion_tokens: int
    p50_s: float
    p99_s: float
    ms_per_token_p50: float
    valid: int
    checked: int
    cut_at_max_tokens: int  # finish_reason "length"

    @property
    def rps(self) -> float:
        return self.requests / self.elapsed_s

    @property
    def tps(self) -> float:
        return self.completion_tokens / self.elapsed_s


@dataclass
class Result:
    cells: list[Cell] = field(default_factory=list)
    schemas: list[str] = field(default_factory=list)
    invalid_examples: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------- schemas
def _tiny_info():
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import build_tiny_tokenizer

    from dllm_constrain.constraints import TokenizerInfo

    return TokenizerInfo.from_tokenizer(build_tiny_tokenizer(), eos_id=1, vocab_size=260)


def load_schemas(jsb_dir: Path, n_jsb: int, max_tokens: int) -> list[Schema]:
    """The two examples, then up to n_jsb JSONSchemaBench schemas (one per subset, in JSB_SUBSETS order) that
    our layer compiles and whose shortest byte-level answer needs at most max_tokens // 2 tokens."""
    from dllm_constrain.constraints import ConstraintCompiler
    from dllm_constrain.errors import ConstraintError

    out = [Schema(p.stem, json.loads(p.read_text())) for p in (ROOT / "examples/person.json",
                                                               ROOT / "examples/order.json")]
    if n_jsb <= 0:
        return out
    if not jsb_dir.is_dir():
        print(f"# {jsb_dir} is absent: JSONSchemaBench schemas skipped, the two examples only")
        return out
    compiler = ConstraintCompiler(_tiny_info())
    for subset in JSB_SUBSETS:
        if len(out) >= 2 + n_jsb:
            break
        path = jsb_dir / f"{subset}.jsonl"
        if not path.exists():
            continue
        with path.open() as f:
            for i, line in enumerate(f):
                if i >= 50:  # bounded: the first 50 of a subset
                    break
                row = json.loads(line)
                try:
                    cc = compiler.compile(schema=row["schema"])
                    if cc.min_tokens() > max_tokens // 2:
                        continue
                except ConstraintError:
                    continue
                out.append(Schema(row["id"], row["schema"]))
                break
    return out


def validator(schema: dict):
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def is_valid(text: str, v) -> bool:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return False
    return v is None or v.is_valid(value)


# ------------------------------------------------------------------------------------------- servers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess in its own process group: started, waited for (/health), and terminated."""

    def __init__(self, name: str, cmd: list[str], port: int, log_path: Path, env: dict, startup_s: float):
        self.name, self.cmd, self.port, self.log_path, self.env, self.startup_s = name, cmd, port, log_path, env, startup_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True, cwd=str(self.log_path.parent))
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.startup_s and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        print(f"# {self.name}: up in {time.monotonic() - t0:.0f}s")
                        return self
            except OSError:
                pass
            time.sleep(1)
        tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
        self.__exit__(None, None, None)
        raise BenchError(f"{self.name} did not come up in {self.startup_s:.0f}s:\n{tail}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def vllm_server(name: str, model: Path, port: int, work: Path, with_plugin: bool, max_num_seqs: int) -> Server:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_vllm_plugin import _plugin_site

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    site = _plugin_site(work) if with_plugin else None
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site)] + [p for p in [env.get("PYTHONPATH")] if p])
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "512", "--gpu-memory-utilization", "0.05", "--enforce-eager",
           "--max-num-seqs", str(max_num_seqs), "--disable-uvicorn-access-log"]
    if with_plugin:
        cmd += ["--logits-processors", PLUGIN]
    return Server(name, cmd, port, work / f"{name}.log", env, startup_s=480)


def own_server(port: int, work: Path, python: str, max_batch: int) -> Server:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [python, "-m", "dllm_constrain.serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
           "--max-batch-size", str(max_batch), "--max-queue", str(4 * max_batch), "--log-level", "warning",
           "--served-model-name", "bundled"]
    return Server("dllm-constrain", cmd, port, work / "dllm-constrain.log", env, startup_s=300)


# ------------------------------------------------------------------------------------------- load
async def run_level(client, model: str, schemas: list[Schema], constrained: bool, concurrency: int, seconds: float,
                    max_requests: int, max_tokens: int, extra: dict,
                    lengths: list[int] | None = None) -> tuple[list[Sample], float]:
    """Closed loop: `concurrency` workers, each sending its next request when the last one answers, until
    `seconds` have passed or `max_requests` were started. Returns the samples and the elapsed wall time
    (from the first send to the last answer). lengths (unconstrained requests): request k asks for exactly
    lengths[k % len(lengths)] tokens (max_tokens and ignore_eos), the answer lengths of a constrained run."""
    samples: list[Sample] = []
    started = 0
    t0 = time.monotonic()

    async def worker(w: int) -> None:
        nonlocal started
        while time.monotonic() - t0 < seconds and started < max_requests:
            k = started
            started += 1
            si = (w + k) % len(schemas)
            kw = dict(extra)
            if lengths and not constrained:
                kw["max_tokens"] = max(1, lengths[k % len(lengths)])
                kw["extra_body"] = {**kw.get("extra_body", {}), "ignore_eos": True}
            if constrained:
                kw["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "record", "schema": schemas[si].schema}}
            t = time.monotonic()
            kw.setdefault("max_tokens", max_tokens)
            r = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Give me the record."}],
                seed=k, **kw)
            samples.append(Sample(time.monotonic() - t, r.usage.completion_tokens, r.choices[0].message.content or "",
                                  si, str(r.choices[0].finish_reason)))

    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return samples, time.monotonic() - t0


def pct(values: list[float], q: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


async def bench_server(name: str, port: int, model: str, schemas: list[Schema], args, extra: dict,
                       result: Result) -> None:
    import openai

    validators = [validator(s.schema) for s in schemas]
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=600, max_retries=0)
    # warm-up: every schema once (compiles), then an unconstrained request
    for s in range(len(schemas)):
        await run_level(client, model, schemas[s:s + 1], True, 1, 1e9, 1, args.max_tokens, extra)
    await run_level(client, model, schemas, False, 1, 1e9, 1, args.max_tokens, extra)
    matched = args.match_lengths and name.startswith("vllm")
    for run in range(args.runs):
        for conc in args.concurrency:
            # alternate which mode runs first; matched lengths need the constrained run first
            first_unconstrained = run % 2 == 0 and not matched
            modes = ["unconstrained", "constrained"] if first_unconstrained else ["constrained", "unconstrained"]
            lengths: list[int] | None = None
            for mode in modes:
                samples, elapsed = await run_level(client, model, schemas, mode == "constrained", conc, args.seconds,
                                                   args.max_requests, args.max_tokens, extra, lengths)
                if matched and mode == "constrained":
                    lengths = [s.completion_tokens for s in samples]
                ok = [is_valid(s.text, validators[s.schema] if mode == "constrained" else None) for s in samples]
                if mode == "constrained":
                    result.invalid_examples += [f"{name} {schemas[s.schema].name} ({s.finish_reason}): {s.text[:160]!r}"
                                                for s, good in zip(samples, ok) if not good][:3]
                lat = [s.latency_s for s in samples]
                per_tok = [1e3 * s.latency_s / max(1, s.completion_tokens) for s in samples]
                cell = Cell(name, conc, mode, run, len(samples), elapsed, sum(s.completion_tokens for s in samples),
                            pct(lat, 0.5), pct(lat, 0.99), pct(per_tok, 0.5), sum(ok), len(ok),
                            sum(s.finish_reason == "length" for s in samples))
                result.cells.append(cell)
                print(f"  {name:15s} c={conc:2d} {mode:13s} run {run}: {cell.requests:4d} req in {elapsed:5.1f}s "
                      f"{cell.rps:7.2f} req/s {cell.tps:8.1f} tok/s p50 {cell.p50_s:6.3f}s p99 {cell.p99_s:6.3f}s "
                      f"valid {cell.valid}/{cell.checked} cut {cell.cut_at_max_tokens}", flush=True)
    await client.close()


# ------------------------------------------------------------------------------------------- report
def summarise(result: Result) -> list[dict]:
    rows = []
    keys = sorted({(c.server, c.concurrency) for c in result.cells}, key=lambda k: (k[0], k[1]))
    for server, conc in keys:
        by_mode = {}
        for mode in ("unconstrained", "constrained"):
            cs = [c for c in result.cells if (c.server, c.concurrency, c.mode) == (server, conc, mode)]
            if not cs:
                continue
            by_mode[mode] = dict(
                runs=len(cs), requests=sum(c.requests for c in cs),
                rps=statistics.median(c.rps for c in cs), tps=statistics.median(c.tps for c in cs),
                p50_s=statistics.median(c.p50_s for c in cs), p99_s=statistics.median(c.p99_s for c in cs),
                ms_per_token_p50=statistics.median(c.ms_per_token_p50 for c in cs),
                valid=sum(c.valid for c in cs), checked=sum(c.checked for c in cs),
                cut=sum(c.cut_at_max_tokens for c in cs))
        row = dict(server=server, concurrency=conc, **{m: v for m, v in by_mode.items()})
        if len(by_mode) == 2:
            row["tps_ratio"] = by_mode["constrained"]["tps"] / by_mode["unconstrained"]["tps"]
            row["rps_ratio"] = by_mode["constrained"]["rps"] / by_mode["unconstrained"]["rps"]
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    print("\n| server | conc | mode | req/s | tok/s | p50 s | p99 s | ms/token p50 | valid | cut at max_tokens | constrained/unconstrained tok/s | req/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        for mode in ("unconstrained", "constrained"):
            m = row.get(mode)
            if m is None:
                continue
            valid = f"{m['valid']}/{m['checked']}" + (" JSON" if mode == "unconstrained" else " schema")
            ratio = (f"{row['tps_ratio']:.3f} | {row['rps_ratio']:.3f}" if mode == "constrained" and "tps_ratio" in row
                     else " | ")
            print(f"| {row['server']} | {row['concurrency']} | {mode} | {m['rps']:.2f} | {m['tps']:.0f} | "
                  f"{m['p50_s']:.3f} | {m['p99_s']:.3f} | {m['ms_per_token_p50']:.2f} | {valid} | {m['cut']} | {ratio} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="measured runs per (server, concurrency, mode); medians")
    p.add_argument("--seconds", type=float, default=15.0, help="time bound of one run")
    p.add_argument("--max-requests", type=int, default=2000, help="request bound of one run")
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--jsb", type=int, default=4, help="JSONSchemaBench schemas added to the two examples")
    p.add_argument("--jsb-dir", type=Path, default=DEFAULT_JSB)
    p.add_argument("--servers", nargs="+", default=["vllm-plugin", "vllm-xgrammar", "dllm-constrain"],
                   choices=["vllm-plugin", "vllm-xgrammar", "dllm-constrain"])
    p.add_argument("--own-python", default=sys.executable,
                   help="python that runs `-m dllm_constrain.serve` (default: this one)")
    p.add_argument("--json", type=Path, default=None, help="write every run and the summary here")
    p.add_argument("--model-size", choices=sorted(MODEL_SIZES), default="tiny",
                   help="the random Llama vLLM serves: tiny (the test's, a forward of a few ms) or small (8 layers, "
                        "hidden 512: a decoding step of tens of ms at 32 in flight, about what a 7-8B step costs on "
                        "a GPU, so the masks' share of a step is a GPU's)")
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="a tokenizer folder for the random Llama (e.g. ../shared/data/tokenizers/bpe32k: a real "
                        "vocabulary, so masks and logits rows have a real width); default the byte-level test one")
    p.add_argument("--match-lengths", action="store_true",
                   help="vLLM servers: each unconstrained run asks for exactly the answer lengths of the constrained "
                        "run before it (ignore_eos), so both modes serve the same requests per token")
    args = p.parse_args(argv)

    schemas = load_schemas(args.jsb_dir, args.jsb, args.max_tokens)
    print(f"# model {args.model_size} {MODEL_SIZES[args.model_size]}, tokenizer {args.tokenizer or 'byte-level (260)'}")
    print(f"# schemas: {', '.join(s.name for s in schemas)}; max_tokens {args.max_tokens}; runs {args.runs} x "
          f"{args.seconds:.0f}s; concurrency {args.concurrency}; cpu affinity {sorted(os.sched_getaffinity(0))}")
    result = Result(schemas=[s.name for s in schemas])
    with tempfile.TemporaryDirectory(prefix="bench_vllm_") as tmp:
        work = Path(tmp)
        model_dir = None
        for name in args.servers:
            port = free_port()
            if name.startswith("vllm"):
                if model_dir is None:
                    sys.path.insert(0, str(ROOT / "tests"))
                    from test_vllm_plugin import make_tiny_llama

                    model_dir = make_tiny_llama(work / "tiny-llama", tokenizer_dir=args.tokenizer,
                                                **MODEL_SIZES[args.model_size])
                server = vllm_server(name, model_dir, port, work, name == "vllm-plugin", max(args.concurrency))
                served, extra = "tiny", {"temperature": 1.0}
            else:
                server = own_server(port, work, args.own_python, max(args.concurrency))
                served, extra = "bundled", {}
            with server:
                asyncio.run(bench_server(name, port, served, schemas, args, extra, result))
    rows = summarise(result)
    print_table(rows)
    if result.invalid_examples:
        print("\ninvalid constrained answers (first ones):")
        for line in result.invalid_examples[:10]:
            print("  " + line)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "schemas": result.schemas,
                                         "summary": rows, "runs": [asdict(c) for c in result.cells]}, indent=1))
    # vLLM's xgrammar does not promise an answer that fits max_tokens (it allows whitespace between tokens);
    # an invalid answer from our layer fails the run
    bad = sum(r["constrained"]["checked"] - r["constrained"]["valid"] for r in rows
              if "constrained" in r and r["server"] != "vllm-xgrammar")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
