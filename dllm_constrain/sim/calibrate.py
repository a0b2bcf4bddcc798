"""The CPU cost model: measured CPU steps, a fit over the counted features, and the real CPU run beside its simulation.

`calibrate`: the real engine runs random mixes of Refresh and Reuse rows (prompts of 16-160 tokens, canvases of
32-192, 1-12 running requests) on two models, the bundled checkpoint and a mid-size random LLaDA;
every step's wall time is recorded beside its counted work (dllm_constrain.sim.cost.step_features). A
`LinearCost` is fitted (non-negative least squares) on a seeded 70% of the steps and judged on the other 30%: the
median relative error of its predicted step times, per model.

`cpu`: the real in-process CPU serving run (the bundled model, wall clock) beside the simulation of the same
arrivals (the bundled model deciding every token, the fitted CPU cost on the virtual clock), for each policy: the
simulator is right on the CPU when its throughput and p50 match the real run's.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.scheduler import SchedulerConfig
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.sim.behaviour import real_engine
from dllm_constrain.sim.cost import LINEAR_FEATURES, LinearCost, ModelShape, StepFeatures, linear_row, step_features
from dllm_constrain.sim.harness import RequestFactory, ServingSetup, VirtualClock, WallClock, run_model
from dllm_constrain.sim.workloads import make_workload

def mid_llada(seed: int = 0) -> Any:
    """A mid-size random LLaDA (d_model 512, 8 layers, 8 heads, MLP 1536, vocabulary 4096) with the bundled
    model's special ids."""
    from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel

    torch.manual_seed(seed)
    cfg = LLaDAConfig(d_model=512, n_layers=8, n_heads=8, mlp_hidden_size=1536, vocab_size=4096, mask_token_id=3,
                      eos_token_id=1, pad_token_id=2, bos_token_id=0, max_sequence_length=2048)
    return LLaDAModel(cfg).eval()


def bundled() -> tuple[Any, Any]:
    from dllm_constrain.bundled import __file__ as bundled_init
    from dllm_constrain.engine.loader import load_checkpoint

    loaded = load_checkpoint(Path(bundled_init).parent)
    return loaded.model, loaded.tokenizer


def measure_steps(model: Any, tokenizer: Any, steps: int, seed: int) -> list[tuple[StepFeatures, float]]:
    """`steps` real engine steps of random request mixes: (counted work, wall seconds) per forward. The number of
    running requests moves through 1-12 (a new target every 16 steps), so per-step and per-request costs separate."""
    rng = random.Random(seed)
    engine = real_engine(model, tokenizer, EngineConfig(), scheduler_config=SchedulerConfig(max_num_seqs=12))
    shape = ModelShape.from_model(model)
    out: list[tuple[StepFeatures, float]] = []
    live, target, stepped = 0, 1, 0
    while len(out) < steps:
        if stepped % 16 == 0:
            target = rng.choice([1, 2, 3, 4, 6, 8, 12])
        while live < target:
            canvas = rng.choice([32, 64, 128, 192])
            prompt = [rng.randrange(4, 4000) for _ in range(rng.randint(16, 160))]
            engine.add_request(Request(prompt, SamplingParams(max_new_tokens=canvas, block_length=32,
                                                              policy=rng.choice(["threshold", "quota"]),
                                                              threshold=0.9, steps=canvas // 4)))
            live += 1
        logged = len(engine.work_log)
        start = time.perf_counter()
        live -= len(engine.step())
        wall = time.perf_counter() - start
        stepped += 1
        work = engine.work_log[logged:]
        if work:
            out.append((step_features(shape, work[0]), wall))
    return out


def fit_nonnegative(x: np.ndarray, y: np.ndarray, relative: bool = False) -> np.ndarray:
    """Least squares with non-negative coefficients (Lawson-Hanson active set, features scaled to unit norm);
    `relative`: each row weighted by 1 / y, so the fit minimises relative errors (what the held-out check judges)."""
    if relative:
        x, y = x / y[:, None], np.ones_like(y)
    scale = np.linalg.norm(x, axis=0)
    scale[scale == 0] = 1.0
    a = x / scale
    n = a.shape[1]
    coef, passive = np.zeros(n), np.zeros(n, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(a.T @ y).max()))
    for _ in range(3 * n):
        grad = a.T @ (y - a @ coef)
        if passive.all() or (grad[~passive] <= tol).all():
            break
        passive[int(np.argmax(np.where(passive, -np.inf, grad)))] = True
        while True:
            trial = np.zeros(n)
            trial[passive] = np.linalg.lstsq(a[:, passive], y, rcond=None)[0]
            if (trial[passive] > 0).all():
                coef = trial
                break
            bad = passive & (trial <= 0)
            alpha = float(np.min(coef[bad] / (coef[bad] - trial[bad])))
            coef = coef + alpha * (trial - coef)
            passive &= coef > tol
            coef[~passive] = 0.0
    return coef / scale


def calibrate(steps_per_model: int = 150, seed: int = 0) -> dict[str, Any]:
    """Fit the CPU LinearCost on both models' steps; the held-out median relative error per model."""
    torch.set_flush_denormal(True)
    model, tok = bundled()
    samples = {"bundled": measure_steps(model, tok, steps_per_model, seed),
               "mid-llada": measure_steps(mid_llada(seed), tok, steps_per_model, seed + 1)}
    rng = random.Random(seed)
    train, held = [], {}
    for name, rows in samples.items():
        idx = list(range(len(rows)))
        rng.shuffle(idx)
        cut = int(0.7 * len(idx))
        train += [rows[i] for i in idx[:cut]]
        held[name] = [rows[i] for i in idx[cut:]]
    x = np.array([linear_row(f) for f, _ in train])
    y = np.array([t for _, t in train])
    cost = LinearCost(tuple(float(c) for c in fit_nonnegative(x, y, relative=True)))
    errors = {}
    for name, rows in held.items():
        rel = [abs(cost.step_time(f).seconds - t) / t for f, t in rows]
        errors[name] = {"held_out_steps": len(rows), "median_rel_error": float(np.median(rel)),
                        "p90_rel_error": float(np.quantile(rel, 0.9))}
    return {"coefficients": dict(zip(LINEAR_FEATURES, cost.coefficients)), "held_out": errors,
            "train_steps": len(train),
            "samples": {name: [[*linear_row(f), t] for f, t in rows] for name, rows in samples.items()}}


def load_cost(path: str | Path) -> LinearCost:
    data = json.loads(Path(path).read_text())
    return LinearCost(tuple(float(data["coefficients"][k]) for k in LINEAR_FEATURES))


def cpu_runs(cost: LinearCost, requests: int, load_rps: float, policies: list[str], seed: int) -> list[dict]:
    """The real CPU run (wall clock) and its simulation (virtual clock, fitted cost) per policy, same arrivals."""
    torch.set_flush_denormal(True)
    model, tok = bundled()
    factory = RequestFactory(tok)
    setup = ServingSetup(max_num_seqs=8, step_tokens=1024)
    workload = make_workload("cpu-small", requests, load_rps, seed, constrained_share=0.0)
    shape = ModelShape.from_model(model)
    rows = []
    for policy in policies:
        real = run_model(workload, policy, setup, factory, model, WallClock())
        sim = run_model(workload, policy, setup, factory, model, VirtualClock(cost, shape))
        row = {"policy": policy, "real": real.summary(), "simulated": sim.summary(),
               "throughput_sim/real": sim.throughput / real.throughput,
               "p50_sim/real": sim.latency(50) / real.latency(50)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def add_commands(sub: Any) -> None:
    c = sub.add_parser("calibrate", help="fit the CPU cost model on measured CPU steps")
    c.add_argument("--steps", type=int, default=150, help="measured steps per model")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--out", default="cpu_cost.json")
    c.set_defaults(func=_calibrate_cmd)
    r = sub.add_parser("cpu", help="the real CPU serving run beside its simulation (calibrated cost)")
    r.add_argument("--cost", default="cpu_cost.json",
                   help="the fitted CPU cost (written by `calibrate`; with --calibrate-steps, fitted here and written)")
    r.add_argument("--calibrate-steps", type=int, default=0,
                   help="fit the CPU cost first, in this process, on this many steps per model (the fit and the runs "
                        "then share the machine's conditions)")
    r.add_argument("--requests", type=int, default=24)
    r.add_argument("--rate", type=float, default=2.0, help="arrivals per second")
    r.add_argument("--policies", nargs="+", default=["phase", "fcfs", "static"])
    r.add_argument("--seed", type=int, default=0)
    r.set_defaults(func=_cpu_cmd)


def _cpu_cmd(args: argparse.Namespace) -> None:
    if args.calibrate_steps:
        result = calibrate(args.calibrate_steps, args.seed)
        Path(args.cost).write_text(json.dumps(result, indent=2))
        print(json.dumps({k: v for k, v in result.items() if k != "samples"}), flush=True)
    cpu_runs(load_cost(args.cost), args.requests, args.rate, args.policies, args.seed)


def _calibrate_cmd(args: argparse.Namespace) -> None:
    result = calibrate(args.steps, args.seed)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
