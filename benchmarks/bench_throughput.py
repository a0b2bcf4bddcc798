"""Tokens per second and NFE of our engine against the LLaDA-reference loop and transformers' DiffusionGemma generate().

Sections (all in one run; every loop is timed inside the same repetition, one after the other, so a busy machine
slows all of them alike; figures are medians over --runs repetitions):

  bundled   the bundled checkpoint (or --model) on held-out requests (ExampleGenerator(10007), schema in the prompt,
            as in training), greedy: the LLaDA-reference loop vs our engine under several settings; also each loop's
            schema-valid rate and field-value recall (dllm_constrain.train.heldout.score)
  mid       a mid-size random LLaDA config on random prompts: reference loop vs our engine
  gemma     a tiny random DiffusionGemma: transformers' generate() vs our engine driving the same weights
  agreement on the bundled model, how often KV reuse (and head-centric sparse reuse) commits what the full
            recompute commits: per step (same canvas, cached forward vs full forward, the policy's commits compared)
            and end to end (final canvases of the cached run vs the full run)

Tokens = answer tokens up to and including the first EOS (a canvas without EOS counts in full), per second of wall
time of the whole batch loop. NFE = forwards per request (the reference loop: one per step, every step).

The LLaDA-reference loop (`llada_reference_generate` in _llada_reference.py) follows GSAI-ML/LLaDA's generate.py:
the whole sequence recomputed at every step, left-padded batches whose rows compute what they compute alone. The
roofline section's step costs are in _roofline.py.

    python benchmarks/bench_throughput.py                         # bundled, mid, gemma with the defaults below
    python benchmarks/bench_throughput.py --sections bundled,mid,gemma --n 24 --runs 3   # docs/performance.md
    python benchmarks/bench_throughput.py --sections agreement --n 16
    python benchmarks/bench_throughput.py --sections quality --n 200          # the reference loop's held-out quality
    python benchmarks/bench_throughput.py --sections bundled --constrained   # + schema-constrained rows (masks)

The bundled section's canvas and block length default to the checkpoint's generation_config.json; its engine rows
name their policy (quota: LLaDA's one commit per step; threshold: Fast-dLLM's confidence threshold) and cache
setting explicitly.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from _llada_reference import llada_reference_generate
from _roofline import roofline_table

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.policies import make_policy
from dllm_constrain.engine.state import Request, SamplingParams


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (width - len(r)) + list(r) for r in rows], dtype=torch.long)
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    return ids, mask


def answer_ids(canvas: list[int], eos_id: int) -> tuple[list[int], int]:
    """(ids before the first EOS, tokens produced incl. that EOS)."""
    end = canvas.index(eos_id) if eos_id in canvas else len(canvas)
    return canvas[:end], end + (1 if end < len(canvas) else 0)


# ------------------------------------------------------------------------------------------------------ harness
@dataclass
class LoopResult:
    texts: list[str]
    produced: int
    nfe: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    name: str
    times: list[float] = field(default_factory=list)
    result: LoopResult | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def run_side_by_side(loops: dict[str, Callable[[], LoopResult]], runs: int, log: Callable[[str], None]) -> dict[str, Row]:
    """Every loop once per repetition, in the listed order; medians over repetitions."""
    rows = {name: Row(name) for name in loops}
    for rep in range(runs):
        for name, fn in loops.items():
            t = time.perf_counter()
            res = fn()
            dt = time.perf_counter() - t
            rows[name].times.append(dt)
            rows[name].result = rows[name].result or res
            log(f"  run {rep + 1}/{runs} {name}: {dt:.2f}s")
    return rows


def table(rows: dict[str, Row], baseline: str, quality: dict[str, tuple[float, float]] | None = None) -> str:
    head = "| loop | median s | tokens/s | speed-up | NFE/request |"
    sep = "|---|---:|---:|---:|---:|"
    if quality is not None:
        head += " schema-valid | field recall |"
        sep += "---:|---:|"
    out = [head, sep]
    base = rows[baseline]
    base_tps = base.result.produced / base.median
    for name, row in rows.items():
        tps = row.result.produced / row.median
        line = f"| {name} | {row.median:.2f} | {tps:.1f} | {tps / base_tps:.2f}x | {row.result.nfe:.1f} |"
        if quality is not None:
            sv, rc = quality[name]
            line += f" {sv:.1%} | {rc:.1%} |"
        out.append(line)
    return "\n".join(out)


def engine_loop(engine: LLMEngine, requests: list[Request], config: EngineConfig, batch: int) -> Callable[[], LoopResult]:
    def fn() -> LoopResult:
        results = []
        for i in range(0, len(requests), batch):
            results += engine.generate(requests[i:i + batch], config=config)
        produced = sum(answer_ids(r.canvas_ids, engine.special.eos_id)[1] for r in results)
        return LoopResult([r.text for r in results], produced, statistics.mean(r.nfe for r in results),
                          {"refreshes": statistics.mean(r.refreshes for r in results),
                           "canvases": [r.canvas_ids for r in results]})
    return fn


def reference_loop(model: Any, tokenizer: Any, prompts: list[list[int]], batch: int, steps: int, gen_length: int,
                   block_length: int, decode: Callable[[list[int]], str]) -> Callable[[], LoopResult]:
    sp = model.special

    def fn() -> LoopResult:
        texts, produced, canvases = [], 0, []
        for i in range(0, len(prompts), batch):
            ids, mask = left_pad(prompts[i:i + batch], sp.pad_id)
            x = llada_reference_generate(model, ids, mask, steps, gen_length, block_length, 0.0, sp.mask_id)
            for row in x[:, ids.shape[1]:].tolist():
                ans, n = answer_ids(row, sp.eos_id)
                texts.append(decode(ans))
                produced += n
                canvases.append(row)
        return LoopResult(texts, produced, float(steps), {"canvases": canvases})
    return fn


# ------------------------------------------------------------------------------------------------------ sections
def load_bundled(path: str | None):
    from dllm_constrain.api import LLM

    return LLM(path)


def heldout(llm: Any, n: int):
    from dllm_constrain.train.data import ExampleGenerator

    examples = ExampleGenerator(10007, plain_text_share=0.0).examples(n)
    prompts = [llm.encode(llm.format(e["request"], e["schema"])) for e in examples]
    return examples, prompts


def quality_of(examples: list[dict[str, Any]], texts: list[str]) -> tuple[float, float]:
    from dllm_constrain.train.heldout import score

    scored = [score(e, t) for e, t in zip(examples, texts)]
    schema = sum(s[1] for s in scored) / len(scored)
    recall = sum(s[2] for s in scored) / max(1, sum(s[3] for s in scored))
    return schema, recall


def engine_configs(args) -> dict[str, tuple[EngineConfig, dict[str, Any]]]:
    """name -> (EngineConfig, SamplingParams overrides) of the unconstrained engine rows."""
    thr = dict(policy="threshold", threshold=args.threshold)
    return {
        "engine, quota, full recompute (kv_cache=none)": (EngineConfig(kv_cache="none"), {}),
        "engine, quota, DualCache refresh per block": (EngineConfig(), {}),
        "engine, quota, adaptive refresh 0.25": (EngineConfig(refresh="adaptive", refresh_threshold=0.25), {}),
        "engine, quota, refresh every 4 steps": (EngineConfig(refresh="steps", refresh_steps=4), {}),
        "engine, quota, sparse keep_ratio=0.5": (EngineConfig(keep_ratio=0.5), {}),
        f"engine, threshold {args.threshold}, full recompute": (EngineConfig(kv_cache="none"), thr),
        f"engine, threshold {args.threshold}, DualCache refresh per block": (EngineConfig(), thr),
    }


def section_bundled(args, log) -> dict[str, Any]:
    llm = load_bundled(args.model)
    model, tok = llm.model, llm.tokenizer
    examples, prompts = heldout(llm, args.n)
    new_tokens = args.max_new_tokens or llm.defaults.max_new_tokens
    block = args.block_length or llm.defaults.block_length
    steps = args.steps or new_tokens
    base = dict(max_new_tokens=new_tokens, block_length=block, steps=steps)
    loops: dict[str, Callable[[], LoopResult]] = {
        "LLaDA-reference loop": reference_loop(model, tok, prompts, args.batch, steps, new_tokens, block,
                                               llm.engine.decode)}
    for name, (cfg, over) in engine_configs(args).items():
        params = SamplingParams(**{**base, **over})
        loops[name] = engine_loop(llm.engine, [Request(p, params) for p in prompts], cfg, args.batch)
    if args.constrained:
        # the schema as a constraint too (compiled once per schema outside the timed loop, as an LLM caches it)
        compiled = [llm.compile(schema=e["schema"]) for e in examples]

        def constrained_loop(params: SamplingParams) -> Callable[[], LoopResult]:
            def fn() -> LoopResult:
                requests = [Request(p, params, c.new_canvas_state(new_tokens)) for p, c in zip(prompts, compiled)]
                return engine_loop(llm.engine, requests, EngineConfig(), args.batch)()
            return fn

        loops["engine, quota, DualCache, schema-constrained"] = constrained_loop(SamplingParams(**base))
        loops[f"engine, threshold {args.threshold}, DualCache, schema-constrained"] = constrained_loop(
            SamplingParams(**base, policy="threshold", threshold=args.threshold))
    log(f"bundled: {args.n} held-out requests, batch {args.batch}, canvas {new_tokens}, block {block}, steps "
        f"{steps}, prompt tokens median {statistics.median(map(len, prompts))}; checkpoint defaults {llm.defaults}")
    rows = run_side_by_side(loops, args.runs, log)
    quality = {name: quality_of(examples, row.result.texts) for name, row in rows.items()}
    text = table(rows, "LLaDA-reference loop", quality)
    return {"table": text, "rows": {k: {"times": r.times, "produced": r.result.produced, "nfe": r.result.nfe,
                                        "schema_valid": quality[k][0], "field_recall": quality[k][1],
                                        "refreshes": r.result.extra.get("refreshes")} for k, r in rows.items()}}


def section_quality(args, log) -> dict[str, Any]:
    """Held-out quality of the LLaDA-reference loop (once, untimed beyond one pass): the figures the engine's
    `python -m dllm_constrain.train.heldout` results are compared with."""
    llm = load_bundled(args.model)
    examples, prompts = heldout(llm, args.n)
    new_tokens = args.max_new_tokens or llm.defaults.max_new_tokens
    block = args.block_length or llm.defaults.block_length
    steps = args.steps or new_tokens
    t = time.perf_counter()
    res = reference_loop(llm.model, llm.tokenizer, prompts, args.batch, steps, new_tokens, block, llm.engine.decode)()
    dt = time.perf_counter() - t
    schema, recall = quality_of(examples, res.texts)
    valid = 0
    for text in res.texts:
        try:
            json.loads(text)
            valid += 1
        except ValueError:
            pass
    log(f"quality: reference loop on {args.n} held-out requests in {dt:.0f}s")
    table_text = ("| loop | requests | valid JSON | schema-valid | field recall | s/sample |\n"
                  "|---|---:|---:|---:|---:|---:|\n"
                  f"| LLaDA-reference loop | {args.n} | {valid / args.n:.1%} | {schema:.1%} | {recall:.1%} | "
                  f"{dt / args.n:.2f} |")
    row = {"valid_json": valid / args.n, "schema_valid": schema, "field_recall": recall, "seconds": dt}
    return {"table": table_text, "rows": {"LLaDA-reference loop": row}}


def section_mid(args, log) -> dict[str, Any]:
    from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel

    torch.manual_seed(0)
    cfg = LLaDAConfig(d_model=args.mid_d_model, n_layers=args.mid_layers, n_heads=args.mid_heads,
                      mlp_hidden_size=args.mid_mlp, vocab_size=args.mid_vocab, mask_token_id=3, eos_token_id=1,
                      pad_token_id=2, bos_token_id=0, max_sequence_length=4096)
    model = LLaDAModel(cfg).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, args.mid_vocab, (args.mid_prompt,), generator=gen).tolist()
               for _ in range(args.mid_n)]
    steps = args.mid_canvas
    block = args.block_length or 32
    engine = LLMEngine(model)
    params = SamplingParams(max_new_tokens=args.mid_canvas, block_length=block, steps=steps)
    loops = {"LLaDA-reference loop": reference_loop(model, None, prompts, args.mid_n, steps, args.mid_canvas,
                                                    block, lambda ids: ""),
             "engine, full recompute (kv_cache=none)": engine_loop(engine, [Request(p, params) for p in prompts],
                                                                   EngineConfig(kv_cache="none"), args.mid_n),
             "engine, defaults (DualCache, refresh per block)": engine_loop(
                 engine, [Request(p, params) for p in prompts], EngineConfig(), args.mid_n),
             "engine, sparse keep_ratio=0.5": engine_loop(engine, [Request(p, params) for p in prompts],
                                                          EngineConfig(keep_ratio=0.5), args.mid_n)}
    n_params = sum(p.numel() for p in model.parameters())
    log(f"mid: random LLaDA d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads, mlp {cfg.mlp_hidden_size}, "
        f"vocab {cfg.vocab_size} ({n_params / 1e6:.0f}M parameters); {args.mid_n} prompts of {args.mid_prompt} tokens, "
        f"canvas {args.mid_canvas}, block {block}, steps {steps}")
    rows = run_side_by_side(loops, args.mid_runs, log)
    return {"table": table(rows, "LLaDA-reference loop"),
            "rows": {k: {"times": r.times, "produced": r.result.produced, "nfe": r.result.nfe} for k, r in rows.items()}}


def section_gemma(args, log) -> dict[str, Any]:
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from checkpoints import build_diffusion_gemma  # the tiny random DiffusionGemmaConfig builder of the tests

    from dllm_constrain.engine.loader import load_checkpoint

    canvas = args.gemma_canvas
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_diffusion_gemma(Path(tmp) / "dg", canvas_length=canvas, sliding_window=args.gemma_window)
        loaded = load_checkpoint(folder, dtype=torch.float32)
    adapter = loaded.model
    hf = adapter.hf
    gen = torch.Generator().manual_seed(2)
    vocab = adapter.vocab_size
    prompts = [torch.randint(10, vocab - 10, (args.gemma_prompt,), generator=gen).tolist() for _ in range(args.gemma_n)]
    new_tokens = args.gemma_blocks * canvas
    eos = adapter.special.eos_id

    def hf_loop() -> LoopResult:
        torch.manual_seed(0)
        ids = torch.tensor(prompts)
        with torch.no_grad():
            out = hf.generate(ids, max_new_tokens=new_tokens, return_dict_in_generate=True)
        seqs = out.sequences[:, ids.shape[1]:].tolist()
        produced = sum(answer_ids(r, eos)[1] for r in seqs)
        tpf = out.tokens_per_forward
        tpf = float(tpf.float().mean()) if torch.is_tensor(tpf) else float(tpf or 0)
        nfe = (sum(len(r) for r in seqs) / len(seqs)) / tpf if tpf else float("nan")
        return LoopResult([""] * len(seqs), produced, nfe)

    engine = LLMEngine(adapter, loaded.tokenizer)
    params = SamplingParams(max_new_tokens=new_tokens, block_length=canvas, policy="entropy_bound",
                            temperature=0.8, seed=0)
    loops = {"transformers DiffusionGemma generate()": hf_loop,
             "engine (entropy_bound, lockstep blocks)": engine_loop(engine, [Request(p, params) for p in prompts],
                                                                    EngineConfig(), args.gemma_n)}
    log(f"gemma: tiny random DiffusionGemma (tests/checkpoints.py) canvas {canvas}, {args.gemma_n} prompts of "
        f"{args.gemma_prompt} tokens, {new_tokens} new tokens")
    rows = run_side_by_side(loops, args.runs, log)
    return {"table": table(rows, "transformers DiffusionGemma generate()"),
            "rows": {k: {"times": r.times, "produced": r.result.produced, "nfe": r.result.nfe} for k, r in rows.items()}}


def step_agreement(llm: Any, prompts: list[list[int]], params: SamplingParams, config: EngineConfig,
                   batch: int) -> tuple[int, int, int, int, list[list[int]]]:
    """Run the cached engine; at each Reuse forward also run the full forward on the same canvases and compare the
    policy's commits. Returns (agreeing reuse commits, reuse commits, refresh commits, steps, final canvases)."""
    engine = LLMEngine(llm.model, llm.tokenizer, config=config)
    counts = {"agree": 0, "total": 0}
    mask_id = engine.special.mask_id

    def audit(states, hidden, offs):
        _, full, foffs = engine.runner.full_forward(states)
        for r, s in enumerate(states):
            positions = s.open_in_block()
            if not positions:
                continue
            allowed = engine.structured.allowed(s, s.canvas_view(mask_id), positions)
            a = engine.logits_path.row_stats(hidden[r, [offs[r] + p for p in positions]], allowed, 0.0, None)
            b = engine.logits_path.row_stats(full[r, [foffs[r] + p for p in positions]], allowed, 0.0, None)
            policy = make_policy(s.params)
            sa, sb = policy.select(a, s), policy.select(b, s)
            ca = {(positions[i], int(a.token[i])) for i in sa.commit}
            cb = {(positions[i], int(b.token[i])) for i in sb.commit}
            counts["agree"] += len(ca & cb)
            counts["total"] += len(ca)

    engine.reuse_hook = audit
    canvases, refresh_steps, steps = [], 0, 0
    for i in range(0, len(prompts), batch):
        results = engine.generate([Request(p, params) for p in prompts[i:i + batch]])
        canvases += [r.canvas_ids for r in results]
        refresh_steps += sum(r.refreshes for r in results)
        steps += sum(r.nfe for r in results)
    return counts["agree"], counts["total"], refresh_steps, steps, canvases


def final_agreement(canvases: list[list[int]], others: list[list[int]], eos: int) -> tuple[int, int, int]:
    """(positions equal, positions compared, identical answers): each pair compared up to one past the longer
    answer (EOS-padded), so agreeing EOS tails do not inflate the figure."""
    same = compared = exact = 0
    for a, b in zip(canvases, others):
        aa, _ = answer_ids(a, eos)
        bb, _ = answer_ids(b, eos)
        n = max(len(aa), len(bb)) + 1
        pa, pb = (a + [eos] * n)[:n], (b + [eos] * n)[:n]
        same += sum(x == y for x, y in zip(pa, pb))
        compared += n
        exact += aa == bb
    return same, compared, exact


def section_agreement(args, log) -> dict[str, Any]:
    llm = load_bundled(args.model)
    _, prompts = heldout(llm, args.n)
    new_tokens = args.max_new_tokens or llm.defaults.max_new_tokens
    block = args.block_length or llm.defaults.block_length
    steps = args.steps or new_tokens
    eos = llm.model.special.eos_id
    out_rows = []
    for policy in args.agreement_policies:
        over = dict(policy=policy, threshold=args.threshold) if policy == "threshold" else dict(policy=policy)
        params = SamplingParams(max_new_tokens=new_tokens, block_length=block, steps=steps, **over)
        full = engine_loop(llm.engine, [Request(p, params) for p in prompts], EngineConfig(kv_cache="none"),
                           args.batch)()
        full_canvases = full.extra["canvases"]
        settings = {"refresh per block": EngineConfig(),
                    "refresh every 4 steps": EngineConfig(refresh="steps", refresh_steps=4),
                    "adaptive 0.5": EngineConfig(refresh="adaptive", refresh_threshold=0.5),
                    "adaptive 0.25": EngineConfig(refresh="adaptive", refresh_threshold=0.25)}
        for r in args.keep_ratios:
            settings[f"sparse keep {r}, per block"] = EngineConfig(keep_ratio=r)
        for name, cfg in settings.items():
            t = time.perf_counter()
            agree, total, refreshes, nfe, canvases = step_agreement(llm, prompts, params, cfg, args.batch)
            dt = time.perf_counter() - t
            same, n_all, exact = final_agreement(canvases, full_canvases, eos)
            row = {"policy": policy, "setting": name, "reuse_commit_agreement": agree / max(1, total),
                   "reuse_commits": total, "refresh_share": refreshes / max(1, nfe),
                   "token_agreement": same / max(1, n_all), "exact_answers": exact / len(prompts)}
            if name == "refresh per block":
                dense_canvases = canvases
            if cfg.keep_ratio < 1.0:  # sparse against the dense cache (same refresh schedule)
                same, n_all, _ = final_agreement(canvases, dense_canvases, eos)
                row["token_agreement_vs_dense"] = same / max(1, n_all)
            out_rows.append(row)
            log(f"  {policy:9s} {name:26s} reuse-step commit agreement {row['reuse_commit_agreement']:.1%} "
                f"({total} commits), refresh share {row['refresh_share']:.1%}, final-token agreement "
                f"{row['token_agreement']:.1%}, identical answers {row['exact_answers']:.1%} ({dt:.0f}s)")
    lines = ["| policy | setting | commit agreement on Reuse steps | forwards that refresh | final-token agreement "
             "| identical answers | final-token agreement with dense reuse |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in out_rows:
        vs_dense = f"{r['token_agreement_vs_dense']:.1%}" if "token_agreement_vs_dense" in r else "-"
        lines.append(f"| {r['policy']} | {r['setting']} | {r['reuse_commit_agreement']:.1%} | {r['refresh_share']:.1%} "
                     f"| {r['token_agreement']:.1%} | {r['exact_answers']:.1%} | {vs_dense} |")
    return {"table": "\n".join(lines), "rows": out_rows}


def section_roofline(args, log) -> dict[str, Any]:
    return {"table": roofline_table()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="bundled,mid,gemma",
                    help="comma list of bundled, mid, gemma, agreement, quality, roofline")
    ap.add_argument("--model", default=None, help="checkpoint folder for the bundled/agreement sections "
                                                  "(default: the bundled model)")
    ap.add_argument("--n", type=int, default=16, help="held-out requests")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="bundled/agreement canvas (default: the checkpoint's generation_config.json)")
    ap.add_argument("--block-length", type=int, default=None,
                    help="block length (default: the checkpoint's generation_config.json; mid: 32)")
    ap.add_argument("--steps", type=int, default=None, help="default: max_new_tokens (LLaDA's one token per step)")
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--constrained", action="store_true", help="bundled: add a schema-constrained engine row")
    ap.add_argument("--mid-d-model", type=int, default=512)
    ap.add_argument("--mid-layers", type=int, default=8)
    ap.add_argument("--mid-heads", type=int, default=8)
    ap.add_argument("--mid-mlp", type=int, default=1536)
    ap.add_argument("--mid-vocab", type=int, default=32768)
    ap.add_argument("--mid-n", type=int, default=2)
    ap.add_argument("--mid-prompt", type=int, default=128)
    ap.add_argument("--mid-canvas", type=int, default=64)
    ap.add_argument("--mid-runs", type=int, default=3)
    ap.add_argument("--gemma-canvas", type=int, default=16)
    ap.add_argument("--gemma-window", type=int, default=16)
    ap.add_argument("--gemma-blocks", type=int, default=2)
    ap.add_argument("--gemma-n", type=int, default=4)
    ap.add_argument("--gemma-prompt", type=int, default=24)
    ap.add_argument("--agreement-policies", nargs="+", default=["quota", "threshold"])
    ap.add_argument("--keep-ratios", nargs="+", type=float, default=[0.75, 0.5, 0.25])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="write every figure here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    report: dict[str, Any] = {"argv": sys.argv, "threads": args.threads, "torch": torch.__version__,
                              "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    fns = {"bundled": section_bundled, "mid": section_mid, "gemma": section_gemma, "agreement": section_agreement,
           "quality": section_quality, "roofline": section_roofline}
    for name in args.sections.split(","):
        name = name.strip()
        t = time.perf_counter()
        report[name] = fns[name](args, log)
        print(f"\n## {name} ({time.perf_counter() - t:.0f}s)\n\n{report[name]['table']}\n", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
