"""Redraw a run's loss curve and summary from its log alone.

python -m dllm_constrain.train.report [--run runs/bundled] [--run runs/finetune ...] [--out DIR]

`log.jsonl` has one line per optimizer step ({"step", "loss", "ema", "lr", "seconds"}) and one per held-out
evaluation ({"step", "heldout_loss", "seconds"}); the curve shows the training loss (raw and EMA) and the
held-out loss on the same axes. Several `--run` folders are drawn as one run, in the order given, each after the
steps and seconds of the ones before: a run started with `train --init-from` the previous run's export goes on
from where that one ended.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def read_log(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training step records, held-out records) of a log.jsonl."""
    steps, evals = [], []
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                (evals if "heldout_loss" in rec else steps).append(rec)
    return steps, evals


def chain_logs(paths: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The records of several runs' logs as one run: each run's steps and seconds offset by the runs before it."""
    steps: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    step0, sec0 = 0, 0.0
    for path in paths:
        s, e = read_log(path)
        steps += [{**r, "step": r["step"] + step0, "seconds": r["seconds"] + sec0} for r in s]
        evals += [{**r, "step": r["step"] + step0, "seconds": r["seconds"] + sec0} for r in e]
        if s:
            step0, sec0 = steps[-1]["step"] + 1, steps[-1]["seconds"]
    return steps, evals


def summarize(config: dict[str, Any], n_params: int, steps: list[dict], evals: list[dict]) -> dict[str, Any]:
    return {"train_config": config, "parameters": n_params, "steps_done": len(steps),
            "final_loss_ema": steps[-1]["ema"] if steps else None,
            "final_heldout_loss": evals[-1]["heldout_loss"] if evals else None,
            "train_seconds": steps[-1]["seconds"] if steps else 0.0}


def plot_loss(steps: list[dict], evals: list[dict], path: Path) -> None:
    """The loss curve (raw, EMA, held-out) as a PNG; skipped quietly only when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], alpha=0.3, label="loss")
    ax.plot([r["step"] for r in steps], [r["ema"] for r in steps], label="EMA")
    if evals:
        ax.plot([r["step"] for r in evals], [r["heldout_loss"] for r in evals], "o-", label="held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("masked-diffusion loss")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dllm_constrain.train.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", default=None,
                        help="a run folder holding log.jsonl (repeat to chain a run and its --init-from successors)")
    parser.add_argument("--out", default=None, help="where to write loss_curve.png (default: the run folder)")
    args = parser.parse_args(argv)
    runs = args.run or ["runs/bundled"]
    steps, evals = chain_logs([Path(r) / "log.jsonl" for r in runs])
    out = Path(args.out or runs[-1])
    out.mkdir(parents=True, exist_ok=True)
    plot_loss(steps, evals, out / "loss_curve.png")
    last = steps[-1] if steps else {}
    print(json.dumps({"steps": len(steps), "final_loss_ema": last.get("ema"), "seconds": last.get("seconds"),
                      "heldout": [(r["step"], round(r["heldout_loss"], 4)) for r in evals]}))


if __name__ == "__main__":
    main()
