"""What a real `LLMEngine.step()` asks of the device, counted by `SyncCounter`: at most two host syncs per step,
both `to_host` reads (the head pass's row statistics, and the slot reads when a request asks for them), none inside
the model forward, one LM-head pass per step, and as many syncs at B = 8 as at B = 1.

A tiny random LLaDA checkpoint with the dual KV cache serves B requests: blocks of 8 of a 24-token canvas, the quota
policy at 2 commits per step (each block one Refresh step, then Reuse steps), half the requests arriving two steps
late (steps mixing Refresh and Reuse rows). Constrained runs give each request a JSON Schema or a regex. The mask
work runs on the step's thread (mask_workers=0) so it is counted, and the bitmask kernels take the branch CUDA takes:
the CPU-only native kernel (which masks through `.numpy()` of the logits) is off, and the unpack into the device
buffer uses shifts rather than the CPU branch's numpy table lookup (`_unpack_as_on_a_device`), so any `.numpy()`
read left in a step is one the device would make too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import pytest
import torch
from checkpoints import build_llada

from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.loader import load_checkpoint
from dllm_constrain.engine.logits import LogitsPath
from dllm_constrain.engine.model_runner import ModelRunner
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.engine.sync_counter import Counts, SyncCounter
from dllm_constrain.kernels import bitmask, masked_row_stats

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["id", "ok"]}
REGEX = r"[a-z]{2,6}-[0-9]{2,4}"
PARAMS = SamplingParams(max_new_tokens=24, block_length=8, policy="quota", steps=12)
LATE = 2  # the step at which the second half of the requests arrives
ALLOWED_SYNCS = {"to_host"}  # the head pass's row statistics; engine.logits.read_slots when a request reads slots


@dataclass
class Step:
    kind: str  # "refresh", "reuse" or "mixed": what the step's forward did with the KV cache; "none": no forward
    counts: Counts  # everything the step dispatched on its thread
    forwards: list[Counts]  # what each model forward inside it dispatched
    head_passes: int


@dataclass
class Run:
    steps: list[Step] = field(default_factory=list)

    def kinds(self) -> set[str]:
        return {s.kind for s in self.steps}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """served(batch, constrained) -> the Run of those requests through `LLMEngine.step()` (computed once each)."""
    folder = tmp_path_factory.mktemp("tiny_llada_syncs")
    build_llada(folder, seed=5)
    loaded = load_checkpoint(folder)
    info = TokenizerInfo.from_tokenizer(loaded.tokenizer, vocab_size=loaded.model.config.vocab_size,
                                        eos_id=loaded.model.special.eos_id, mask_id=loaded.model.special.mask_id)
    compiler = ConstraintCompiler(info, cache=False)
    constraints = [compiler.compile(schema=SCHEMA), compiler.compile(regex=REGEX)]

    @cache
    def run(batch: int, constrained: bool) -> Run:
        reqs = [Request(loaded.tokenizer.encode(f"request {i}: answer"), PARAMS,
                        constraints[i % 2] if constrained else None) for i in range(batch)]
        engine = LLMEngine(loaded.model, loaded.tokenizer,
                           config=EngineConfig(kv_cache="dual", mask_workers=0, gil_free_forward=False))
        return _count_steps(engine, reqs, SyncCounter.for_model(loaded.model))

    return run


def _unpack_as_on_a_device(packed: torch.Tensor, buffer: torch.Tensor, *, invert: bool = False) -> torch.Tensor:
    """`bitmask.unpack_bitmask_into` by its non-CPU branch (shifts into the buffer), which runs on the CPU too."""
    rows, words = packed.shape
    as_bytes = packed.contiguous().view(torch.uint8)
    bits = buffer[: rows * words * 32].view(rows, words * 4, 8)
    src = torch.bitwise_not(as_bytes) if invert else as_bytes
    torch.bitwise_right_shift(src[..., None], torch.arange(8, dtype=torch.uint8), out=bits).bitwise_and_(1)
    return bits.view(torch.bool).view(rows, words * 32)


def _count_steps(engine: LLMEngine, reqs: list[Request], counter: SyncCounter) -> Run:
    """Every request through `engine.step()` under `counter`, the late half added at step LATE."""
    run, heads, forwards = Run(), [0], []
    row_stats, packed_forward, native = LogitsPath.row_stats, ModelRunner._packed_forward, bitmask._bitmask_cpu
    unpack = bitmask.unpack_bitmask_into

    def counted_row_stats(self, *args, **kwargs):
        heads[0] += 1
        return row_stats(self, *args, **kwargs)

    def counted_forward(self, segments):
        before = counter.snapshot()
        try:
            return packed_forward(self, segments)
        finally:
            forwards.append(counter.snapshot() - before)

    early, late = reqs[:(len(reqs) + 1) // 2], reqs[(len(reqs) + 1) // 2:]
    for r in early:
        engine.add_request(r)
    LogitsPath.row_stats, ModelRunner._packed_forward, bitmask._bitmask_cpu = counted_row_stats, counted_forward, None
    bitmask.unpack_bitmask_into = masked_row_stats.unpack_bitmask_into = _unpack_as_on_a_device
    try:
        with counter:
            while engine.has_unfinished() or late:
                if len(run.steps) == LATE:
                    for r in late:
                        engine.add_request(r)
                    late = []
                stats = engine.forward_stats
                refreshed, served, heads_before = stats.refresh_rows, stats.request_rows, heads[0]
                forwards, before = [], counter.snapshot()
                for out in engine.step():
                    assert out.result.error is None, out.result.error
                counts = counter.snapshot() - before
                refreshed = engine.forward_stats.refresh_rows - refreshed
                served = engine.forward_stats.request_rows - served
                kind = ("none" if served == 0 else "refresh" if refreshed == served else
                        "reuse" if refreshed == 0 else "mixed")
                run.steps.append(Step(kind, counts, forwards, heads[0] - heads_before))
    finally:
        LogitsPath.row_stats, ModelRunner._packed_forward, bitmask._bitmask_cpu = row_stats, packed_forward, native
        bitmask.unpack_bitmask_into = masked_row_stats.unpack_bitmask_into = unpack
    return run


CASES = [(1, False), (1, True), (8, False), (8, True)]


@pytest.mark.parametrize("batch,constrained", CASES)
def test_each_step_syncs_the_host_at_most_twice_and_only_through_to_host(served, batch, constrained) -> None:
    run = served(batch, constrained)
    assert {"refresh", "reuse"} <= run.kinds(), run.kinds()
    if batch > 1:
        assert "mixed" in run.kinds()
    for i, step in enumerate(run.steps):
        assert step.counts.total_syncs <= 2, (i, step.kind, dict(step.counts.syncs))
        assert set(step.counts.syncs) <= ALLOWED_SYNCS, (i, step.kind, dict(step.counts.syncs))
        if step.kind != "none":  # the head pass's statistics come back (a step that ran no forward reads nothing)
            assert step.counts.syncs["to_host"] >= 1, (i, step.kind)


@pytest.mark.parametrize("batch,constrained", CASES)
def test_the_model_forward_never_syncs_the_host(served, batch, constrained) -> None:
    run = served(batch, constrained)
    for i, step in enumerate(s for s in run.steps if s.kind != "none"):
        assert len(step.forwards) == 1 and step.forwards[0].launches > 0, (i, step.kind)  # one counted forward
        assert step.forwards[0].total_syncs == 0, (i, step.kind, dict(step.forwards[0].syncs))


@pytest.mark.parametrize("batch,constrained", CASES)
def test_each_step_makes_one_lm_head_pass(served, batch, constrained) -> None:
    run = served(batch, constrained)
    assert [s.head_passes for s in run.steps] == [0 if s.kind == "none" else 1 for s in run.steps]


@pytest.mark.parametrize("constrained", [False, True])
def test_host_syncs_per_step_do_not_grow_with_the_batch(served, constrained) -> None:
    one, eight = (_syncs_per_forward_step(served(b, constrained)) for b in (1, 8))
    assert max(eight) <= max(one)
    assert sum(eight) / len(eight) <= sum(one) / len(one)


def _syncs_per_forward_step(run: Run) -> list[int]:
    return [s.counts.total_syncs for s in run.steps if s.kind != "none"]
