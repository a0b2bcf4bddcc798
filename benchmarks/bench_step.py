"""What one engine step asks of the device, counted on the CPU: ops, kernel launches, LM-head passes, host syncs.

    python benchmarks/bench_step.py                      # B = 1, 8, 32, 64, random LLaDA (4 layers, d 512)
    python benchmarks/bench_step.py --batches 8 --json   # one batch, the JSON only
    python benchmarks/bench_step.py --project run.json   # a saved run's counts projected onto LLaDA-8B / H200

A random LLaDA-shaped model (released tensor names, `--layers` x `--hidden`, vocabulary `--vocab`) serves B
requests through `LLMEngine.step()` with the dual KV cache on: a canvas of `--canvas` tokens in blocks of
`--block`, the quota policy at `--per-step` commits per step, so each block takes one Refresh then Reuse steps.
Half the requests (B >= 2) arrive `--offset` steps late, so some steps hold Refresh and Reuse rows together
("mixed"). The scheduler serves every running request at every step (FCFS, B slots). The EOS row of the LM head is
zeroed so no request ends early: every step serves the same requests in every revision.

Two passes per batch:
  counted  the steps under `engine.sync_counter.SyncCounter` (the model's parameters are the "device"; see that
           module for what counts as a launch and as a host sync) and with `LogitsPath.row_stats` calls counted
           (head passes: one per call). The kernels take their torch paths, as on CUDA, except the LM head's row
           statistics: on CUDA the fused Triton kernel is one launch per row chunk where the torch reference
           counted here is a dozen ops;
  timed    the same steps again without any instrument: step time median and committed tokens per second.
`.numpy()` of a device tensor is not counted among the syncs: on CUDA it raises, so only a kernel's CPU branch
(the bitmask unpack's numpy table lookup into a device buffer) makes one; the JSON keeps it as `cpu_branch_numpy`.
Per step it prints ops dispatched, launches (total and per layer: launches inside the transformer layers / layers),
head passes, host syncs (by kind), by step kind (refresh / reuse / mixed) and over all steps.

To compare two revisions of the engine, run this script in both worktrees on the same machine and compare the JSON
side by side (counts are exact; times only as ratios taken in one sitting). Timings on a shared, loaded machine vary:
the counts are the figure of merit here, times are indicative. JSON goes to benchmarks/results/bench_step.json when
that folder exists, else to stdout (`--json`: stdout only, no table).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.logits import LogitsPath
from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel
from dllm_constrain.engine.scheduler import SchedulerConfig
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.engine.sync_counter import Counts, SyncCounter
from dllm_constrain.kernels import bitmask

RESULTS = Path(__file__).resolve().parent / "results"
SPECIALS = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2, mask_token_id=3)


def build_model(layers: int, hidden: int, heads: int, vocab: int, seed: int = 0) -> LLaDAModel:
    """A random LLaDA (no GQA, MLP 3x hidden as LLaDA-8B) whose head never prefers EOS (its row is zero)."""
    torch.manual_seed(seed)
    cfg = LLaDAConfig(d_model=hidden, n_layers=layers, n_heads=heads, mlp_hidden_size=3 * hidden, vocab_size=vocab,
                      max_sequence_length=1024, **SPECIALS)
    model = LLaDAModel(cfg).eval()
    with torch.no_grad():
        model.lm_head_weight()[cfg.eos_token_id].zero_()
    return model


@contextmanager
def gpu_shaped_kernels() -> Iterator[None]:
    """The CPU-only native bitmask kernel off while counting: it applies the mask through `.numpy()` of the logits
    (a read, for the counter); without it the torch path runs, one masked_fill, as on CUDA."""
    native = bitmask._bitmask_cpu
    bitmask._bitmask_cpu = None
    try:
        yield
    finally:
        bitmask._bitmask_cpu = native


@contextmanager
def head_pass_counter() -> Iterator[list[int]]:
    """Counts calls of `LogitsPath.row_stats` (one LM-head pass each) while active."""
    calls = [0]
    original = LogitsPath.row_stats

    def counted(self: LogitsPath, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(self, *args, **kwargs)

    LogitsPath.row_stats = counted  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        LogitsPath.row_stats = original  # type: ignore[method-assign]


def requests(batch: int, prompt: int, vocab: int, params: SamplingParams, seed: int) -> list[Request]:
    gen = torch.Generator().manual_seed(seed)
    return [Request(torch.randint(4, vocab, (prompt,), generator=gen).tolist(), params) for _ in range(batch)]


def new_engine(model: LLaDAModel, batch: int) -> LLMEngine:
    config = EngineConfig(kv_cache="dual", gil_free_forward=False, mask_workers=0)
    return LLMEngine(model, config=config, scheduler_config=SchedulerConfig(max_num_seqs=batch, policy="fcfs"))


def run_steps(engine: LLMEngine, reqs: list[Request], offset: int, on_step: Any,
              max_steps: int | None = None) -> int:
    """Every request through `engine.step()`, the late half added at step `offset`; on_step(kind, seconds) after
    each step; returns the committed tokens. max_steps: stop after that many steps (requests left unfinished)."""
    early, late = reqs[:(len(reqs) + 1) // 2], reqs[(len(reqs) + 1) // 2:]
    for r in early:
        engine.add_request(r)
    committed, step = 0, 0
    while (engine.has_unfinished() or late) and (max_steps is None or step < max_steps):
        if step == offset:
            for r in late:
                engine.add_request(r)
            late = []
        before = engine.forward_stats.refresh_rows, engine.forward_stats.request_rows
        start = time.perf_counter()
        outputs = engine.step()
        seconds = time.perf_counter() - start
        refreshed = engine.forward_stats.refresh_rows - before[0]
        served = engine.forward_stats.request_rows - before[1]
        kind = "refresh" if refreshed == served else ("reuse" if refreshed == 0 else "mixed")
        on_step(kind, seconds)
        committed += sum(len(o.result.canvas_ids) for o in outputs)
        step += 1
    return committed


def summarize(deltas: list[tuple[str, Counts, int]], layers: int) -> dict[str, Any]:
    """Per-step means of the counted figures, over all steps and by step kind."""
    def mean(rows: list[tuple[str, Counts, int]]) -> dict[str, Any]:
        n = len(rows)
        kinds: Counter = Counter()
        for _, c, _ in rows:
            kinds.update(c.syncs)
        numpy = kinds.pop("numpy", 0)
        return {
            "steps": n,
            "ops": sum(c.total_ops for _, c, _ in rows) / n,
            "launches": sum(c.launches for _, c, _ in rows) / n,
            "launches_per_layer": sum(c.layer_ops for _, c, _ in rows) / n / layers,
            "head_passes": sum(h for _, _, h in rows) / n,
            "syncs": sum(kinds.values()) / n,
            "sync_kinds": {k: v / n for k, v in sorted(kinds.items())},
            "cpu_branch_numpy": numpy / n,
        }

    out = {"all": mean(deltas)}
    for kind in ("refresh", "reuse", "mixed"):
        rows = [d for d in deltas if d[0] == kind]
        if rows:
            out[kind] = mean(rows)
    return out


def counted_steps(model: LLaDAModel, batch: int, reqs: list[Request], offset: int) -> list[tuple[str, Counts, int]]:
    """The counted pass: each step's kind, its `SyncCounter` delta and its head passes."""
    deltas: list[tuple[str, Counts, int]] = []
    counter = SyncCounter.for_model(model)
    engine = new_engine(model, batch)
    with gpu_shaped_kernels(), head_pass_counter() as heads, counter:
        last = [counter.snapshot(), 0]

        def record(kind: str, _seconds: float) -> None:
            now = counter.snapshot()
            deltas.append((kind, now - last[0], heads[0] - last[1]))
            last[0], last[1] = now, heads[0]

        run_steps(engine, reqs, offset, record)
    return deltas


def bench_batch(model: LLaDAModel, args: argparse.Namespace, batch: int) -> dict[str, Any]:
    params = SamplingParams(max_new_tokens=args.canvas, block_length=args.block, policy="quota",
                            steps=args.canvas // args.per_step)
    reqs = requests(batch, args.prompt, args.vocab, params, seed=batch)
    offset = args.offset if batch > 1 else 0

    deltas = [] if args.no_count else counted_steps(model, batch, reqs, offset)

    times: dict[str, list[float]] = {}
    engine = new_engine(model, batch)
    start = time.perf_counter()
    committed = run_steps(engine, reqs, offset, lambda kind, s: times.setdefault(kind, []).append(s))
    wall = time.perf_counter() - start
    result = {"batch": batch, "committed_tokens": committed, "wall_s": round(wall, 3),
              "tokens_per_s": round(committed / wall, 1),
              "step_ms_median": round(1e3 * statistics.median([t for ts in times.values() for t in ts]), 2),
              "step_ms_median_by_kind": {k: round(1e3 * statistics.median(v), 2) for k, v in sorted(times.items())},
              "per_step": summarize(deltas, model.config.n_layers) if deltas else {}}
    return result


def table(results: list[dict[str, Any]]) -> str:
    head = ("| B | step kind | steps | ops/step | launches/step | launches/layer | head passes/step | syncs/step |"
            " step ms (median) | tokens/s |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in results:
        for kind, s in r["per_step"].items():
            ms = r["step_ms_median"] if kind == "all" else r["step_ms_median_by_kind"].get(kind, float("nan"))
            tps = f"{r['tokens_per_s']:.0f}" if kind == "all" else ""
            lines.append(f"| {r['batch']} | {kind} | {s['steps']} | {s['ops']:.0f} | {s['launches']:.0f} | "
                         f"{s['launches_per_layer']:.1f} | {s['head_passes']:.1f} | {s['syncs']:.1f} | {ms:.1f} | "
                         f"{tps} |")
    return "\n".join(lines)


# LLaDA-8B on an H200, for the projection below: bf16 bytes of the 32 layers' weights and of the LM head; HBM bytes/s
LLADA_8B_LAYERS, LLADA_8B_LAYER_BYTES, LLADA_8B_HEAD_BYTES = 32, 2 * 32 * 218_112_000, 2 * 126_464 * 4096
H200_BANDWIDTH = 4.8e12
LAUNCH_US = 5.0  # the least a CUDA kernel launch costs the host (eager PyTorch ops cost more: 10-20 us)


def llada_8b_projection(report: dict[str, Any], kind: str = "reuse") -> str:
    """What the counted steps would ask of LLaDA-8B on an H200: launches at 32 layers (the non-layer launches plus
    32 x the per-layer ones), their host floor at LAUNCH_US each, the weight bytes read (the layers once, the LM head
    once per head pass: the fused head kernel streams the whole head for each call) over the HBM bandwidth, and the
    host syncs (each drains the device queue before the host goes on)."""
    lines = ["| B | launches/step (32 layers) | launch floor ms | head passes/step | weight reads GB/step | "
             "weight-read floor ms | syncs/step |", "|---:|---:|---:|---:|---:|---:|---:|"]
    layers = report["model"]["layers"]
    for r in report["results"]:
        s = r["per_step"].get(kind, r["per_step"]["all"])
        per_layer = s["launches_per_layer"]
        launches = s["launches"] - per_layer * layers + per_layer * LLADA_8B_LAYERS
        gb = (LLADA_8B_LAYER_BYTES + s["head_passes"] * LLADA_8B_HEAD_BYTES) / 1e9
        lines.append(f"| {r['batch']} | {launches:.0f} | {launches * LAUNCH_US / 1e3:.1f} | {s['head_passes']:.1f} | "
                     f"{gb:.1f} | {gb * 1e9 / H200_BANDWIDTH * 1e3:.2f} | {s['syncs']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--canvas", type=int, default=64)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--per-step", type=int, default=4, help="quota commits per step")
    ap.add_argument("--offset", type=int, default=3, help="steps after which the late half of the requests arrives")
    ap.add_argument("--json", action="store_true", help="print the JSON only, write nothing")
    ap.add_argument("--no-count", action="store_true", help="the timed pass only (no per-step counts)")
    ap.add_argument("--project", metavar="JSON", help="print the LLaDA-8B / H200 projection of a saved run's JSON")
    args = ap.parse_args(argv)
    if args.project:
        report = json.loads(Path(args.project).read_text())
        print(llada_8b_projection(report))
        return report
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    model = build_model(args.layers, args.hidden, args.heads, args.vocab)
    results = [bench_batch(model, args, int(b)) for b in args.batches.split(",")]
    report = {"model": {"family": "llada", "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                        "vocab": args.vocab, "parameters": sum(p.numel() for p in model.parameters())},
              "workload": {k: getattr(args, k) for k in ("prompt", "canvas", "block", "per_step", "offset")},
              "torch_threads": torch.get_num_threads(), "results": results}
    text = json.dumps(report, indent=1)
    if args.json:
        print(text)
        return report
    print(table(results))
    print("\nLLaDA-8B on an H200, Reuse steps (llada_8b_projection):")
    print(llada_8b_projection(report))
    if RESULTS.is_dir():
        (RESULTS / "bench_step.json").write_text(text + "\n")
        print(f"wrote {RESULTS / 'bench_step.json'}")
    else:
        print(text)
    return report


if __name__ == "__main__":
    main()
