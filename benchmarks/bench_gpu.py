"""The engine's step on a GPU at LLaDA-8B's shape: Refresh / Reuse / mixed step times against the weight-read
roofline, committed tokens/s, peak memory, launches per step, constrained vs unconstrained, eager vs torch.compile.

    python benchmarks/bench_gpu.py --out /tmp/gpu              # CUDA: random LLaDA-8B shape in bf16, B = 1, 8, 32, 64
    python benchmarks/bench_gpu.py --tiny --batches 1,2         # CPU (or CUDA): a tiny shape, proves the code runs

The model: a random LLaDA-8B config (32 layers, d_model 4096, 32 heads, MLP 12288, vocabulary 126,464) built in bf16
on the device; special ids a byte-level tokenizer's, the EOS head row zeroed. Per B (`--batches`), B requests
(`--prompt`, `--canvas` in blocks of `--block`, quota policy at `--per-step`; the late half `--offset` steps late, so
steps mix Refresh and Reuse rows) run through `LLMEngine.step()` with the dual KV cache. Sections (`--sections`):
  steps        per B: median step time by kind, roofline (`--bandwidth`) ratio, tokens/s, peak memory, dispatched
               device ops (engine.sync_counter) and, on CUDA, profiled kernels per step
  constrained  the same at `--constrained-batch` with a JSON Schema on every request
  compile      the layers under torch.compile (default, reduce-overhead) at `--compile-batch`: the attention is one
               opaque custom op, so no graph break there (counted, with the graphs compiled: on the CPU the grouped
               path's per-group lists change length between steps, so dynamo recompiles); failures recorded
  layer_ops    device ops per layer of one mixed step (prompts of 3 to 202 tokens, odd requests refreshing) per B
Kernels are compiled first (`engine.warmup.warm_up`, "warm_up_s"). JSON to `--out`/bench_gpu.json and stdout;
GPU figures go in docs/measurements.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_step import head_pass_counter, new_engine, run_steps  # noqa: E402

from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel  # noqa: E402
from dllm_constrain.engine.state import Request, SamplingParams  # noqa: E402
from dllm_constrain.engine.sync_counter import SyncCounter  # noqa: E402
from dllm_constrain.engine.warmup import warm_up  # noqa: E402

LLADA_8B = dict(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, mlp_hidden_size=12288, vocab_size=126464,
                embedding_size=126464, rope_theta=500000.0, max_sequence_length=4096)
TINY = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden_size=192, vocab_size=512,
            embedding_size=512, rope_theta=500000.0, max_sequence_length=1024)
SPECIALS = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2, mask_token_id=3)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_model(shape: dict[str, Any], device: torch.device, dtype: torch.dtype) -> LLaDAModel:
    """The random model, its parameters made on `device` in `dtype` (no float32 or host copy on the way)."""
    torch.manual_seed(0)
    with torch.device(device), default_dtype(dtype):
        model = LLaDAModel(LLaDAConfig(**shape, **SPECIALS)).eval()
    with torch.no_grad():
        model.lm_head_weight()[SPECIALS["eos_token_id"]].zero_()
    return model


def weight_bytes(model: LLaDAModel) -> tuple[int, int]:
    """(bytes of every layer's weights, bytes of the LM head): what one forward and one head pass read."""
    head = model.lm_head_weight()
    layers = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".blocks." in n)
    return layers, head.numel() * head.element_size()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def workload(args: argparse.Namespace, batch: int, constraint: Any = None) -> list[Request]:
    params = SamplingParams(max_new_tokens=args.canvas, block_length=args.block, policy="quota",
                            steps=args.canvas // args.per_step)
    gen = torch.Generator().manual_seed(batch)
    return [Request(torch.randint(4, 260, (args.prompt,), generator=gen).tolist(), params, constraint)
            for _ in range(batch)]


def timed_run(model: LLaDAModel, args: argparse.Namespace, batch: int, constraint: Any = None) -> dict[str, Any]:
    """One run of the workload: step time medians by kind, tokens/s, peak memory, head passes per step."""
    device = next(model.parameters()).device
    times: dict[str, list[float]] = {}
    reqs = workload(args, batch, constraint)
    offset = args.offset if batch > 1 else 0
    run_steps(new_engine(model, batch), workload(args, batch, constraint)[:1], 0, lambda *_: None)  # warm
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    engine = new_engine(model, batch)
    sync(device)
    start = time.perf_counter()

    def on_step(kind: str, seconds: float) -> None:
        times.setdefault(kind, []).append(seconds)

    with head_pass_counter() as heads:
        committed = run_steps(engine, reqs, offset, on_step)
    sync(device)
    wall = time.perf_counter() - start
    steps = sum(len(v) for v in times.values())
    return {"batch": batch, "steps": steps, "committed_tokens": committed, "wall_s": round(wall, 3),
            "tokens_per_s": round(committed / wall, 1), "head_passes_per_step": round(heads[0] / steps, 2),
            "step_ms_median": {k: round(1e3 * statistics.median(v), 3) for k, v in sorted(times.items())},
            "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            if device.type == "cuda" else None}


def launches(model: LLaDAModel, args: argparse.Namespace, batch: int) -> dict[str, Any]:
    """Device ops dispatched per step (SyncCounter over the first `--count-steps` steps: the refresh, the late
    arrivals' mixed step and Reuse steps) and, on CUDA, kernels per step seen by torch.profiler over the same steps."""
    counter = SyncCounter.for_model(model)
    engine = new_engine(model, batch)
    steps = [0]
    with counter:
        run_steps(engine, workload(args, batch), args.offset if batch > 1 else 0,
                  lambda *_: steps.__setitem__(0, steps[0] + 1), args.count_steps)
    c = counter.counts
    out = {"dispatched_device_ops_per_step": round(c.launches / steps[0], 1),
           "host_syncs_per_step": round((c.total_syncs - c.syncs.get("numpy", 0)) / steps[0], 2)}
    device = next(model.parameters()).device
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        engine = new_engine(model, batch)
        steps[0] = 0
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run_steps(engine, workload(args, batch), args.offset if batch > 1 else 0,
                      lambda *_: steps.__setitem__(0, steps[0] + 1), args.count_steps)
        kernels = sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)
        out["cuda_kernels_per_step"] = round(kernels / steps[0], 1)
    return out


def layer_ops(model: LLaDAModel, batch: int) -> dict[str, Any]:
    """Device ops per layer (SyncCounter's layer_ops / layers) of one forward where the even requests reuse their
    cache and the odd ones refresh, prompts of different lengths (so the attention's sequences differ in shape)."""
    from dllm_constrain.engine.config import EngineConfig
    from dllm_constrain.engine.model_runner import ModelRunner

    engine = new_engine(model, batch)
    params = SamplingParams(max_new_tokens=16, block_length=8)
    states = [engine._new_state(i, Request([4 + j % 250 for j in range(3 + (i * 37) % 200)], params))
              for i in range(batch)]
    runner = ModelRunner(model, SPECIALS["pad_token_id"], EngineConfig(gil_free_forward=False))
    runner.reset(states)
    counter = SyncCounter.for_model(model)
    with torch.inference_mode():
        runner.forward_rows(states[::2])
        forward = model.hidden_states_cached

        def counted(*a: Any, **k: Any) -> Any:
            with counter:
                return forward(*a, **k)

        model.hidden_states_cached = counted
        refreshed = runner.stats.refresh_rows
        try:
            runner.forward_rows(states)
        finally:
            del model.hidden_states_cached
    refresh = runner.stats.refresh_rows - refreshed
    return {"batch": batch, "refresh": refresh, "reuse": batch - refresh,
            "layer_ops_per_layer": counter.counts.layer_ops / model.config.n_layers}


def roofline(model: LLaDAModel, result: dict[str, Any], bandwidth: float) -> dict[str, Any]:
    layers, head = weight_bytes(model)
    bytes_per_step = layers + head * result["head_passes_per_step"]
    ms = 1e3 * bytes_per_step / bandwidth
    return {"weight_read_ms": round(ms, 3),
            "measured_over_roofline": {k: round(v / ms, 2) for k, v in result["step_ms_median"].items()}}


def compile_section(model: LLaDAModel, args: argparse.Namespace, out: dict[str, Any],
                    saved: Callable[[], None]) -> dict[str, Any]:
    """Eager, then each torch.compile mode, into `out` (`saved` called after each)."""
    out["eager"] = timed_run(model, args, args.compile_batch)
    saved()
    blocks = model.transformer["blocks"]
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        try:
            for block in blocks:
                block.forward_with = torch.compile(block.forward_with, mode=mode, dynamic=True)
            torch._dynamo.utils.counters.clear()
            out[mode] = timed_run(model, args, args.compile_batch)
            counters = torch._dynamo.utils.counters
            out[mode]["graph_breaks"] = sum(counters["graph_break"].values())
            out[mode]["graphs_compiled"] = counters["stats"]["unique_graphs"]
        except Exception as exc:  # recorded, not raised: the other sections' figures stand
            out[mode] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        finally:
            for block in blocks:
                block.__dict__.pop("forward_with", None)
        saved()
    return out


def constrained_section(model: LLaDAModel, args: argparse.Namespace) -> dict[str, Any]:
    import dllm_constrain as dc

    llm = dc.LLM.from_model(model, byte_tokenizer(), prompt_format="raw", freeze_gc_heap=False)
    compiled = llm.compile(schema=SCHEMA)
    return {"unconstrained": timed_run(model, args, args.constrained_batch),
            "constrained": timed_run(model, args, args.constrained_batch, compiled)}


def save(report: dict[str, Any], out: str | None) -> None:
    """The report so far to `out`/bench_gpu.json (after every section: a run cut short by its time limit keeps what
    it measured)."""
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "bench_gpu.json").write_text(json.dumps(report, indent=1) + "\n")


def byte_tokenizer() -> Any:
    """A byte-level BPE without merges: the 4 specials (the model's ids) then the 256 byte symbols."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = ["<|bos|>", "<|eos|>", "<|pad|>", "<|mask|>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(specials)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny shape (runs on the CPU)")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--canvas", type=int, default=64)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--per-step", type=int, default=4)
    ap.add_argument("--offset", type=int, default=3)
    ap.add_argument("--bandwidth", type=float, default=4.8e12, help="HBM bytes/s (H200: 4.8e12)")
    ap.add_argument("--sections", default="steps,constrained,compile")
    ap.add_argument("--count-steps", type=int, default=8, help="steps counted and profiled for launches")
    ap.add_argument("--constrained-batch", type=int, default=8)
    ap.add_argument("--compile-batch", type=int, default=8)
    ap.add_argument("--out", default=None, help="folder for bench_gpu.json")
    args = ap.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(1)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    start = time.perf_counter()
    model = build_model(TINY if args.tiny else LLADA_8B, device, dtype)
    sync(device)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                              "shape": "tiny" if args.tiny else "llada-8b", "dtype": str(dtype),
                              "build_s": round(time.perf_counter() - start, 2),
                              "weight_bytes": dict(zip(("layers", "lm_head"), weight_bytes(model)))}
    most_rows = max(int(b) for b in args.batches.split(",")) * args.block  # one head pass's rows, at most
    report["warm_up_s"] = round(warm_up(new_engine(model, 1), sampling=False, max_rows=most_rows), 2)
    save(report, args.out)
    sections = set(args.sections.split(","))
    if "steps" in sections:
        report["steps"] = []
        for b in (int(x) for x in args.batches.split(",")):
            result = timed_run(model, args, b)
            result.update(roofline(model, result, args.bandwidth))
            result.update(launches(model, args, b))
            report["steps"].append(result)
            print(json.dumps(result), flush=True)
            save(report, args.out)
    if "constrained" in sections:
        report["constrained"] = constrained_section(model, args)
        print(json.dumps(report["constrained"]), flush=True)
        save(report, args.out)
    if "compile" in sections:
        report["compile"] = {}
        compile_section(model, args, report["compile"], lambda: save(report, args.out))
        print(json.dumps(report["compile"]), flush=True)
    if "layer_ops" in sections:
        report["layer_ops"] = [layer_ops(model, int(b)) for b in args.batches.split(",")]
        print(json.dumps(report["layer_ops"]), flush=True)
        save(report, args.out)
    report["total_s"] = round(time.perf_counter() - start, 1)
    save(report, args.out)
    print(json.dumps({"total_s": report["total_s"]}))
    return report


if __name__ == "__main__":
    main()
