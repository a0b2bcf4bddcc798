"""Constraint masks beside the forward (EngineConfig.mask_workers) vs serially before it, forced tokens on and off.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/bench_overlap.py --runs 5          # examples/ + JSONSchemaBench
    python benchmarks/bench_overlap.py --jsb 0 --runs 3                                  # examples/ only

The bundled model generates one batch (one `LLMEngine.generate` call, the engine's scheduler) for every schema of
examples/ and the first `--jsb` schemas of each `--subsets` file of ../shared/data/jsonschemabench (left out
cleanly when that folder is absent; a schema that does not compile or fit the canvas is left out and counted),
greedy, with the checkpoint's decoding defaults (generation_config.json). Each configuration
(mask_workers x forced_tokens) runs `--runs` times, the configurations alternating inside a run so the machine's
load moves them alike; the figures are medians over the runs:

  wall/forward     the call's wall time / its forwards (steps with a forward)
  forward          the forward's own wall time per forward
  mask/forward     mask computation time per forward (summed over requests; on workers or serial)
  probe/forward    of it, the frontier probes on the loop thread before the forward (forced tokens on, mask
                   workers >= 1): the constraint's prefix hints (the tokens the committed prefix forces at the
                   frontier), or a one-position mask for a constraint without the hint
  overlap          (mask time that ran while the forward was running) / (total mask time), from the mask jobs'
                   start/end and the forward's start/end timestamps (`engine.mask_workers.MaskTiming`)
  NFE              forwards summed over requests; forced: tokens committed as forced; saved: forwards_saved
                   (medians over the runs too: a mask call stops exploring new transitions after
                   constraints.canvas.EXPAND_S of wall time, so under load the masks, hence the paths, can vary)

The outputs are checked: every answer is accepted by its compiled constraint. Identity (`--identity`): with
forced tokens off and masks that no clock cuts (exact canvas states: no per-call exploration budget nor time
limit; freshly compiled constraints for each run, so every run starts from the same automata), the outputs of
mask_workers=0 and >= 1 must be identical; the script prints how many are (and the same for forced tokens on,
where only the forward's context differs). The timed runs use the engine's default canvas states, whose mask
calls answer from what they computed within their time allowances: their masks, hence the outputs, follow the
clock on either path.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.state import Request
from dllm_constrain.errors import DllmConstrainError

ROOT = Path(__file__).resolve().parents[1]
JSB = ROOT.parent / "shared" / "data" / "jsonschemabench"


def load_schemas(jsb: int, subsets: list[str]) -> list[tuple[str, Any]]:
    """(name, schema): examples/*.json, then the first `jsb` schemas of each JSONSchemaBench subset present."""
    out = [(p.stem, json.loads(p.read_text())) for p in sorted((ROOT / "examples").glob("*.json"))]
    if jsb <= 0:
        return out
    if not JSB.is_dir():
        print(f"note: {JSB} is absent; examples/ only", file=sys.stderr)
        return out
    for subset in subsets:
        path = JSB / f"{subset}.jsonl"
        if not path.is_file():
            print(f"note: {path} is absent; left out", file=sys.stderr)
            continue
        with path.open() as f:
            for i, line in enumerate(f):
                if i >= jsb:
                    break
                row = json.loads(line)
                out.append((row.get("id", f"{subset}-{i}"), row["schema"]))
    return out


def build_requests(llm: Any, schemas: list[tuple[str, Any]], options: dict[str, Any]
                   ) -> tuple[list[Request], list[Any], list[str]]:
    """One request per schema that compiles and fits (the compiled constraints are kept for the checks)."""

    requests, compiled, left_out = [], [], []
    for name, schema in schemas:
        prompt = f"Write a JSON value for the schema {name}."
        try:
            [req] = llm.processor.build(prompt, schema=schema, **options).make_requests()
            req.constraint_state()  # the fit check (ConstraintTooLongError) before the timed runs
        except DllmConstrainError as err:
            left_out.append(f"{name}: {type(err).__name__}")
            continue
        requests.append(req)
        compiled.append(req.constraint)
    return requests, compiled, left_out


def run(llm: Any, requests: list[Request], workers: int, forced: bool, core_split: bool | None = None
        ) -> dict[str, Any]:
    reqs = [Request(r.prompt_ids, replace(r.params, forced_tokens=forced), r.constraint) for r in requests]
    config = replace(llm.engine.config, mask_workers=workers, core_split=core_split)
    engine = LLMEngine(llm.model, llm.tokenizer, config=config)
    t = time.perf_counter()
    results = engine.generate(reqs, raise_errors=False)
    wall = time.perf_counter() - t
    timing = engine.mask_timing
    return {"results": results, "wall": wall, "forwards": timing.forwards, "forward_s": timing.forward_seconds,
            "mask_s": timing.mask_seconds, "overlap": timing.overlap_fraction, "mask_calls": timing.mask_calls,
            "probe_s": timing.probe_seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jsb", type=int, default=4, help="schemas per JSONSchemaBench subset (0: examples/ only)")
    ap.add_argument("--subsets", default="Github_easy,Glaiveai2K,Kubernetes",
                    help="comma-separated JSONSchemaBench subsets")
    ap.add_argument("--workers", default="0,1,2", help="comma-separated mask_workers values")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="canvas (default: the checkpoint's)")
    ap.add_argument("--core-split", choices=("auto", "on", "off"), default="auto",
                    help="EngineConfig.core_split with the GIL-free forward (auto: the engine's rule)")
    ap.add_argument("--identity", action=argparse.BooleanOptionalAction, default=True,
                    help="also compare the outputs on exact masks (slow: exact masks on cold automata)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from dllm_constrain.api import LLM

    split = {"auto": None, "on": True, "off": False}[args.core_split]
    llm = LLM(None)
    options = {"max_new_tokens": args.max_new_tokens, "temperature": 0.0, "seed": 0}
    schemas = load_schemas(args.jsb, args.subsets.split(","))
    requests, compiled, left_out = build_requests(llm, schemas, options)
    if not requests:
        print("no schema compiled and fit the canvas; nothing to measure")
        return
    workers = [int(w) for w in args.workers.split(",")]
    configs = [(w, f) for f in (True, False) for w in workers]
    runs: dict[tuple[int, bool], list[dict[str, Any]]] = {c: [] for c in configs}
    run(llm, requests[:2], 1, True)  # warm-up: the automata of the first masks are built once, outside the timing
    for _ in range(args.runs):
        for w, f in configs:
            runs[(w, f)].append(run(llm, requests, w, f, split))

    print(f"{len(requests)} requests (batch of all; {len(left_out)} schemas left out: {'; '.join(left_out) or '-'})")
    print(f"canvas {requests[0].params.max_new_tokens}, blocks of {requests[0].params.block_length}, policy "
          f"{requests[0].params.policy}; medians over {args.runs} runs; torch threads {torch.get_num_threads()}; "
          f"core split {args.core_split}")
    print(f"{'workers':>7} {'forced':>6} {'wall/fwd ms':>11} {'fwd ms':>7} {'mask/fwd ms':>11} {'probe':>5} "
          f"{'overlap':>7} {'wall s':>7} {'NFE':>5} {'forced':>6} {'saved':>5} {'valid':>7}")
    med = statistics.median
    for w, f in configs:
        rs = runs[(w, f)]
        first = rs[0]["results"]
        valid = min(sum(c.accepts_tokens(x.token_ids) and x.error is None for c, x in zip(compiled, r["results"]))
                    for r in rs)
        print(f"{w:>7} {str(f):>6} {med(r['wall'] / r['forwards'] * 1e3 for r in rs):>11.1f} "
              f"{med(r['forward_s'] / r['forwards'] * 1e3 for r in rs):>7.1f} "
              f"{med(r['mask_s'] / r['forwards'] * 1e3 for r in rs):>11.1f} "
              f"{med(r['probe_s'] / r['forwards'] * 1e3 for r in rs):>5.1f} {med(r['overlap'] for r in rs):>7.1%} "
              f"{med(r['wall'] for r in rs):>7.2f} {med(sum(x.nfe for x in r['results']) for r in rs):>5} "
              f"{med(sum(x.forced_tokens for x in r['results']) for r in rs):>6} "
              f"{med(sum(x.forwards_saved for x in r['results']) for r in rs):>5} {valid:>3}/{len(first):<3}")
    if args.identity:
        identity_check(llm, schemas, options, [w for w in workers if w > 0])


def identity_check(llm: Any, schemas: list[tuple[str, Any]], options: dict[str, Any], workers: list[int]) -> None:
    """Exact masks, fresh automata per run: mask_workers=0 and each w >= 1 compared (forced tokens off, then on)."""
    from dllm_constrain.constraints import clear_cache

    def fresh(workers: int, forced: bool) -> list[list[int]]:
        clear_cache()
        requests, _, _ = build_requests(llm, schemas, options)
        exact = [Request(r.prompt_ids, r.params, r.constraint.new_canvas_state(
            r.params.max_new_tokens, expand_budget=None, timeout_s=None)) for r in requests]
        return [r.canvas_ids for r in run(llm, exact, workers, forced)["results"]]

    for forced in (False, True):
        serial = fresh(0, forced)
        for w in workers:
            same = sum(a == b for a, b in zip(serial, fresh(w, forced)))
            print(f"exact masks, forced_tokens={forced!s:<5}: mask_workers={w} gives the outputs of mask_workers=0 "
                  f"for {same}/{len(serial)}")


if __name__ == "__main__":
    main()
