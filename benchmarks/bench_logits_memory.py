"""Peak transient memory of the logits path: budgeted row chunks vs materializing [batch, canvas, vocab].

Both paths reduce the same B x L canvas rows of a random small-hidden LM head (hidden size 64 by default) to the
commit statistics (token, probability, entropy, top-2 margin) under a random packed grammar mask (~50% of tokens
allowed in every row):

  unbudgeted  logits = hidden [B, L, D] @ W^T -> [B, L, V] float32, then one reduction over all B*L rows
              (`reference_masked_row_stats_from_hidden` on all rows: the leanest form of "materialize, then reduce")
  budgeted    `budgeted_row_stats_from_hidden(..., budget_bytes)`: rows in chunks whose workspace fits the budget;
              each chunk is reduced before the next one overwrites its logits in a shared workspace (on CUDA the
              fused Triton kernel runs and the logits never exist; on CPU the torch path holds one chunk at a time)

Method: every (path, config) runs in its own subprocess. After building the inputs (hidden, LM head, packed mask)
the worker trims the heap (glibc malloc_trim), resets the kernel's peak-RSS counter (writing "5" to
/proc/self/clear_refs resets VmHWM), notes VmRSS, runs the path, and reports VmHWM - VmRSS-before: the peak resident
memory the logits path added, under the default allocator. (The budgeted path reuses one RowStatsWorkspace across
chunks; when each chunk allocated and freed its own tensors, glibc's dynamic mmap threshold kept freed blocks
resident and this figure reached 0.7-2.6 GB at 4,096 rows instead of 75 MiB.) Where the unbudgeted path would not
fit (its predicted peak, N * V * 8 bytes = float32 logits + their exp, 20 bytes when sampling, exceeds --max-run-gib
or half the available memory), it is not run: the table shows the analytic figure, marked "(a)", and the ratio is
taken against the float32 logits alone (N * V * 4 bytes), a lower bound for any unbudgeted path. Where both paths
run, the worker saves its outputs and the driver checks they are identical. The seconds columns are wall time
(meaningless on a loaded machine).

Figures on the shared 2-core CPU box (greedy, budget 64 MiB): budgeted peak 72-88 MiB for every vocab, batch and
canvas; unbudgeted measured 255 MiB .. 3.9 GiB where it ran (within 3% of N * V * 8), 7.9 / 16 GiB of logits alone at
batch 16 x canvas 1,024 (vocab 126,464 / 262,144): 106x / 186x lower; outputs bitwise identical where both ran.

  python benchmarks/bench_logits_memory.py                  # full table, greedy (~10 min on one idle core)
  python benchmarks/bench_logits_memory.py --temperature 0.8 --batch 1 4 --canvas 256   # seeded sampling
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MiB = 1024 * 1024


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _trim_heap() -> None:
    """Return freed heap memory to the OS (glibc malloc_trim), so the baseline holds only live data."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def worker(args: argparse.Namespace) -> None:
    import gc

    import torch

    from dllm_constrain.kernels.masked_row_stats import (
        budgeted_row_stats_from_hidden,
        reference_masked_row_stats_from_hidden,
    )

    torch.set_num_threads(args.threads)
    rows = args.batch * args.canvas
    g = torch.Generator().manual_seed(args.seed)
    hidden = torch.randn(args.batch, args.canvas, args.hidden, generator=g)
    weight = torch.randn(args.vocab, args.hidden, generator=g) * (4.0 / args.hidden**0.5)
    words = (args.vocab + 31) // 32
    mask = torch.randint(-(2**31), 2**31, (rows, words), generator=g, dtype=torch.int64).to(torch.int32)
    mask[::7] = -1  # every 7th row fully allowed
    flat = hidden.view(rows, args.hidden)
    gen = torch.Generator().manual_seed(args.seed + 1)
    gc.collect()
    _trim_heap()  # set-up garbage kept in the heap would be reused by the run and hide part of its peak

    exact_peak = _reset_peak()
    before_kb = _status_kb("VmRSS")
    t0 = time.perf_counter()
    if args.mode == "unbudgeted":
        stats = reference_masked_row_stats_from_hidden(flat, weight, mask, args.temperature, gen)
    else:
        stats = budgeted_row_stats_from_hidden(flat, weight, mask, args.temperature, gen,
                                               budget_bytes=args.budget_mib * MiB, backend=args.backend)
    seconds = time.perf_counter() - t0
    peak_kb = _status_kb("VmHWM")
    if not exact_peak:  # fall back on the lifetime peak (an over-estimate if set-up peaked higher)
        import resource

        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if args.out:
        torch.save({k: getattr(stats, k) for k in ("token", "prob", "entropy", "margin")}, args.out)
    print(json.dumps({"peak_bytes": max(0, peak_kb - before_kb) * 1024, "seconds": seconds,
                      "exact_peak": exact_peak}))


def run_worker(base: list[str], mode: str, vocab: int, batch: int, canvas: int, out: str | None) -> dict:
    cmd = base + ["--worker", "--mode", mode, "--vocab", str(vocab), "--batch", str(batch), "--canvas", str(canvas)]
    if out:
        cmd += ["--out", out]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"worker failed ({' '.join(cmd)}):\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def available_bytes() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def compare(a_path: str, b_path: str) -> str:
    import torch

    a, b = torch.load(a_path), torch.load(b_path)
    if not torch.equal(a["token"], b["token"]):
        return f"NO ({int((a['token'] != b['token']).sum())} tokens differ)"
    if all(torch.equal(a[k], b[k]) for k in ("prob", "entropy", "margin")):
        return "yes (bitwise)"
    diff = max(float((a[k] - b[k]).abs().max()) for k in ("prob", "entropy", "margin"))
    return f"tokens yes, stats max|diff| {diff:.1e}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, nargs="+", default=[126_464, 262_144])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--canvas", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--budget-mib", type=int, default=64, help="byte budget of one row chunk's workspace")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-run-gib", type=float, default=4.0, help="run the unbudgeted path only below this peak")
    p.add_argument("--backend", default="auto")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=["budgeted", "unbudgeted"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.vocab, args.batch, args.canvas = args.vocab[0], args.batch[0], args.canvas[0]
        worker(args)
        return

    base = [sys.executable, os.path.abspath(__file__), "--hidden", str(args.hidden), "--budget-mib",
            str(args.budget_mib), "--temperature", str(args.temperature), "--backend", args.backend,
            "--threads", str(args.threads), "--seed", str(args.seed)]
    sampling = args.temperature > 0
    per_elem = 20 if sampling else 8  # unbudgeted workspace per logit: see workspace_bytes_per_row
    limit = min(args.max_run_gib * 1024**3, available_bytes() / 2)
    print(f"logits-path peak transient memory, hidden {args.hidden}, budget {args.budget_mib} MiB, "
          f"T={args.temperature}, {args.threads} thread(s); measured = peak RSS added (VmHWM reset), "
          f"(a) = analytic, not run")
    head = (f"{'vocab':>7} {'batch':>5} {'canvas':>6} {'rows':>6} | {'budgeted MiB':>12} {'s':>6} | "
            f"{'unbudgeted MiB':>16} {'s':>6} | {'logits MiB':>10} | {'ratio':>7} | identical")
    print(head)
    print("-" * len(head))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for vocab in args.vocab:
            for canvas in args.canvas:
                for batch in args.batch:
                    rows = batch * canvas
                    logits_bytes = rows * vocab * 4
                    predicted = rows * vocab * per_elem
                    runs_unbudgeted = predicted <= limit
                    fb = os.path.join(tmp, "b.pt") if runs_unbudgeted else None
                    fu = os.path.join(tmp, "u.pt")
                    bud = run_worker(base, "budgeted", vocab, batch, canvas, fb)
                    if runs_unbudgeted:
                        unb = run_worker(base, "unbudgeted", vocab, batch, canvas, fu)
                        unb_bytes, unb_txt, unb_s = unb["peak_bytes"], f"{unb['peak_bytes'] / MiB:,.0f}", \
                            f"{unb['seconds']:.1f}"
                        same = compare(fb, fu)
                        ratio = unb_bytes / max(bud["peak_bytes"], 1)
                    else:
                        unb_bytes, unb_txt, unb_s = predicted, f"{predicted / MiB:,.0f} (a)", "-"
                        same = "not run"
                        ratio = logits_bytes / max(bud["peak_bytes"], 1)  # lower bound: the logits alone
                    print(f"{vocab:>7} {batch:>5} {canvas:>6} {rows:>6} | {bud['peak_bytes'] / MiB:>12,.1f} "
                          f"{bud['seconds']:>6.1f} | {unb_txt:>16} {unb_s:>6} | {logits_bytes / MiB:>10,.0f} | "
                          f"{ratio:>6.1f}x | {same}", flush=True)
                    results.append((vocab, batch, canvas, bud["peak_bytes"], unb_bytes, ratio, runs_unbudgeted))
    print()
    for vocab in args.vocab:
        for canvas in args.canvas:
            peaks = [r[3] for r in results if r[0] == vocab and r[2] == canvas]
            if len(peaks) > 1:
                print(f"vocab {vocab} canvas {canvas}: budgeted peak over batches {args.batch}: "
                      f"min {min(peaks) / MiB:.1f} MiB, max {max(peaks) / MiB:.1f} MiB "
                      f"(spread {(max(peaks) - min(peaks)) / MiB:.1f} MiB)")
    big = [r for r in results if r[1] == 16 and r[2] == 1024]
    for r in big:
        kind = "measured" if r[6] else "vs float32 logits alone (lower bound)"
        print(f"vocab {r[0]} batch 16 x canvas 1024: budgeted is {r[5]:.0f}x lower ({kind}); target >= 16x: "
              f"{'met' if r[5] >= 16 else 'NOT met'}")


if __name__ == "__main__":
    main()
