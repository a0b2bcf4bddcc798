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

The LLaDA-reference loop (`llada_reference_generate`) follows GSAI-ML/LLaDA's generate.py: the whole sequence is
recomputed at every step (model(x) -> logits [B, L, V]), semi-autoregressive blocks, low_confidence remasking with
the get_num_transfer_tokens quota, Gumbel noise as add_gumbel_noise. Batches are left-padded with an attention mask
(as the repository's batched version); the position ids count real tokens only (our models' convention), so a row
computes what it computes alone, as in our engine.

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
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.models.base import default_position_ids
from dllm_constrain.engine.policies import make_policy
from dllm_constrain.engine.state import Request, SamplingParams


# ----------------------------------------------------------------------------------------- the LLaDA-reference loop
def add_gumbel_noise(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """LLaDA's add_gumbel_noise: exp(logits) / (-log U)^T in float64 (argmax = a sample of softmax(logits / T))."""
    if temperature == 0:
        return logits
    logits = logits.to(torch.float64)
    noise = torch.rand_like(logits, dtype=torch.float64)
    gumbel_noise = (-torch.log(noise)) ** temperature
    return logits.exp() / gumbel_noise


def get_num_transfer_tokens(mask_index: torch.Tensor, steps: int) -> torch.Tensor:
    """LLaDA's get_num_transfer_tokens: masked count // steps per step, the remainder on the first steps."""
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base = mask_num // steps
    remainder = mask_num % steps
    num_transfer_tokens = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + base
    for i in range(mask_num.size(0)):
        num_transfer_tokens[i, : remainder[i]] += 1
    return num_transfer_tokens


@torch.no_grad()
def llada_reference_generate(model: Any, prompt: torch.Tensor, attention_mask: torch.Tensor, steps: int,
                             gen_length: int, block_length: int, temperature: float = 0.0,
                             mask_id: int = 126336) -> torch.Tensor:
    """LLaDA's generate.py (remasking='low_confidence', cfg_scale=0) over a left-padded prompt batch [B, P]."""
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt.clone()
    attention_mask = torch.cat([attention_mask, torch.ones((prompt.shape[0], gen_length), dtype=torch.bool)], dim=-1)
    position_ids = default_position_ids(attention_mask)
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    steps = steps // num_blocks
    for num_block in range(num_blocks):
        lo = prompt.shape[1] + num_block * block_length
        block_mask_index = x[:, lo: lo + block_length] == mask_id
        num_transfer_tokens = get_num_transfer_tokens(block_mask_index, steps)
        for i in range(steps):
            mask_index = x == mask_id
            logits = model(x, position_ids, attention_mask)  # [B, L, V]: the whole canvas, every step
            logits_with_noise = add_gumbel_noise(logits, temperature=temperature)
            x0 = torch.argmax(logits_with_noise, dim=-1)
            p = F.softmax(logits, dim=-1)
            x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            x0_p[:, lo + block_length:] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(-np.inf, dtype=x0_p.dtype))
            transfer_index = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(confidence.shape[0]):
                _, select_index = torch.topk(confidence[j], k=int(num_transfer_tokens[j, i]))
                transfer_index[j, select_index] = True
            x[transfer_index] = x0[transfer_index]
    return x


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
            allowed = engine._allowed(s, s.canvas_view(mask_id), positions)
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


# ------------------------------------------------------------------------------------------------------ roofline
@dataclass(frozen=True)
class ModelDims:
    d_model: int = 4096  # LLaDA-8B
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 32
    mlp: int = 12288
    vocab: int = 126464

    @property
    def layer_params(self) -> int:
        hd = self.d_model // self.n_heads
        attn = 2 * self.d_model * self.d_model + 2 * self.d_model * self.n_kv_heads * hd
        return attn + 3 * self.d_model * self.mlp

    @property
    def kv_bytes_per_token(self) -> int:  # K and V of every layer, bf16
        return 2 * self.n_layers * self.n_kv_heads * (self.d_model // self.n_heads) * 2


def step_cost(dims: ModelDims, batch: int, prompt: int, canvas: int, block: int, kind: str,
              keep_ratio: float = 1.0, rows: int | None = None) -> tuple[float, float]:
    """(FLOPs, HBM bytes) of one denoising step of `batch` requests, bf16 weights and activations.

    kind: "full" (the reference loop: whole sequence, logits for every position), "refresh" (whole sequence, K/V
    written to the cache, logits for the committable rows only), "reuse" (the block against the cached K/V).
    rows: committable rows per request projected through the LM head (default: the whole block).
    Counted: the matmul FLOPs (2 per multiply-add) of the projections, attention (QK^T and PV) and LM head; bytes:
    the weights read once per step, the KV cache read/written, the logits written (full) and the hidden states in
    and out of each layer (small). Norms, RoPE, softmax and the embedding gather are left out (< 2%).
    """
    n = prompt + canvas
    rows = block if rows is None else rows
    d, L, hd = dims.d_model, dims.n_layers, dims.d_model // dims.n_heads
    wbytes = 2 * dims.layer_params * L
    head_bytes = 2 * dims.vocab * d
    if kind in ("full", "refresh"):
        tokens, keys = n, n
    elif kind == "reuse":
        tokens, keys = block, block + keep_ratio * (n - block)
    else:
        raise ValueError(kind)
    flops = 2 * dims.layer_params * L * tokens * batch  # projections and MLP
    flops += 4 * L * dims.n_heads * hd * tokens * keys * batch  # QK^T and PV
    logit_rows = n if kind == "full" else rows
    flops += 2 * d * dims.vocab * logit_rows * batch
    nbytes = wbytes + head_bytes
    kv = dims.kv_bytes_per_token
    if kind == "refresh":
        nbytes += kv * n * batch  # written
    elif kind == "reuse":
        nbytes += kv * keys * batch + kv * block * batch  # read (kept keys + fresh block) and the block written
    else:
        nbytes += kv * n * batch  # activations K/V pass through HBM once even without a cache
    nbytes += 2 * 2 * d * L * tokens * batch  # layer inputs/outputs
    if kind == "full":
        nbytes += 2 * dims.vocab * n * batch  # bf16 logits of every position written (and read by softmax)
    return float(flops), float(nbytes)


def roofline_table(peak_flops: float = 989e12, bandwidth: float = 3.35e12) -> str:
    """Roofline time per step (max(FLOPs / peak, bytes / bandwidth)) for LLaDA-8B on an H100 SXM (bf16)."""
    dims = ModelDims()
    lines = [f"LLaDA-8B: {dims.layer_params * dims.n_layers / 1e9:.2f}B layer parameters "
             f"({2 * dims.layer_params * dims.n_layers / 1e9:.1f} GB bf16), LM head {dims.vocab} x {dims.d_model} "
             f"({2 * dims.vocab * dims.d_model / 1e9:.2f} GB), KV cache {dims.kv_bytes_per_token / 1024:.0f} KiB per "
             f"token; H100 SXM {peak_flops / 1e12:.0f} TFLOP/s bf16 dense, {bandwidth / 1e12:.2f} TB/s: ridge "
             f"{peak_flops / bandwidth:.0f} FLOP/byte", "",
             "| batch | prompt+canvas | block | step | TFLOP | GB moved | FLOP/byte | bound | roofline ms | "
             "vs full |", "|---:|---:|---:|---|---:|---:|---:|---|---:|---:|"]
    for batch, prompt, canvas, block in [(1, 256, 256, 32), (1, 1024, 1024, 32), (16, 256, 256, 32),
                                         (16, 1024, 1024, 32), (64, 256, 256, 32)]:
        base = None
        for kind, keep in [("full", 1.0), ("refresh", 1.0), ("reuse", 1.0), ("reuse", 0.25)]:
            f, b = step_cost(dims, batch, prompt, canvas, block, kind, keep)
            t = max(f / peak_flops, b / bandwidth)
            base = base or t
            bound = "compute" if f / peak_flops >= b / bandwidth else "memory"
            name = kind if keep == 1.0 else f"reuse, keep {keep}"
            lines.append(f"| {batch} | {prompt}+{canvas} | {block} | {name} | {f / 1e12:.2f} | {b / 1e9:.1f} | "
                         f"{f / b:.0f} | {bound} | {t * 1e3:.2f} | {base / t:.1f}x |")
    return "\n".join(lines)


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
