"""One step's forward for the running requests: ONE model forward, whatever mix of Refresh and Reuse rows it holds.

`ModelRunner.forward_rows(states)` returns one `Row` per request: canvas position p's hidden state is
`hidden[offset + p]` = `packed[start + offset + p]` (`packed`: the step's hidden states [T, D], shared by all rows;
only the active block's positions are guaranteed). `start_rows` is the same in two halves (start, then wait).
  plan            each request's segment: refresh (whole sequence), reuse (its query span), full (no cache)
  _packed_forward the segments' rows packed into one [1, T] forward of the model's span forward; attention is one
                  varlen call per layer (engine.attention_step over engine.kv_pool)
  full_forward    models without a span forward or with per-request state: one left-padded [b, L] forward
  GIL-free        the packed forward as the TorchScript twin (engine.models.scripted_forward), same attention
Why it is built this way (row independence, MIN_PACKED_ROWS, the refresh policy): docs/attention.md.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dllm_constrain.engine.attention_step import StepAttention
from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.gil_share import loop_activity
from dllm_constrain.engine.kv_pool import KVPool
from dllm_constrain.engine.models.base import (
    NeighborTokensLM,
    RequestStateLM,
    ScriptableLM,
    default_position_ids,
    packs_rows,
)
from dllm_constrain.engine.core_split import CoreSplit
from dllm_constrain.engine.models.scripted_forward import ScriptedWeights, start_span_forward
from dllm_constrain.engine.placement import usable_cores
from dllm_constrain.engine.scheduler import kv_bytes_per_token
from dllm_constrain.engine.state import RequestState

Group = tuple[list[RequestState], torch.Tensor, list[int]]

# Fewest rows of a packed forward: below 4 rows the CPU GEMM takes a different kernel (see the module docstring).
MIN_PACKED_ROWS = 4


def supports_packed_forward(model: Any) -> bool:
    """Families with a span forward (LLaDA, Dream); models with per-request state never pack."""
    return packs_rows(model)


def supports_kv_cache(model: Any) -> bool:
    """The Refresh/Reuse cache needs only the span forward (the runner supplies every layer's attention)."""
    return packs_rows(model)


def supports_gil_free_forward(model: Any) -> bool:
    """Families whose packed forward has a TorchScript twin that runs without the GIL (LLaDA, Dream)."""
    return isinstance(model, ScriptableLM) and packs_rows(model)


def model_device(model: Any) -> torch.device:
    if isinstance(model, torch.nn.Module):
        for p in model.parameters():
            return p.device
    return torch.device("cpu")


@dataclass
class RowMeta:
    """A request's cache bookkeeping: the block its cache entry was refreshed for, forwards since, and how many of
    that block's positions were committed at the refresh."""

    block: int
    forwards: int
    committed_at_refresh: int


@dataclass(frozen=True)
class Segment:
    """One request's rows in a packed forward."""

    state: RequestState
    kind: str  # "refresh" | "reuse" | "full" (see the module docstring)
    start: int  # first packed row
    first: int  # the request's slot of the segment's first token (0 for a whole sequence, the span start for reuse)
    length: int
    span: tuple[int, int]  # the request's query span [a, b) in its own slots

    @property
    def rows(self) -> slice:
        return slice(self.start, self.start + self.length)


@dataclass(frozen=True)
class Row:
    """One request's output of a step's forward: canvas position p's hidden state is hidden[offset + p], which is
    packed[start + offset + p] (one LM-head pass over all requests gathers from `packed`)."""

    state: RequestState
    hidden: torch.Tensor  # [L, D]
    offset: int
    packed: torch.Tensor  # [T, D]: the step's hidden states, shared by every row of the step
    start: int  # the row of packed that is hidden[0]


@dataclass
class ForwardStats:
    """What the forwards cost, counted (not timed): for occupancy figures."""

    forwards: int = 0  # model forward calls
    request_rows: int = 0  # requests served, summed over forwards
    token_rows: int = 0  # token rows run, padding included
    refresh_rows: int = 0  # request rows that refreshed (or ran whole without a cache)


class ModelRunner:
    def __init__(self, model: Any, pad_id: int, config: EngineConfig) -> None:
        self.model = model
        self.pad_id = pad_id
        self.config = config
        self.device = model_device(model)
        self.packed = supports_packed_forward(model)
        self.shift = int(model.kv_query_shift) if self.packed else 0
        # each row's neighbour ids for models whose input mixes them in (LLaDA's input token shift)
        self.neighbor_offsets: tuple[int, ...] = (tuple(model.neighbor_offsets)
                                                  if isinstance(model, NeighborTokensLM) else ())
        self.neighbors = bool(self.neighbor_offsets)
        self.cached = config.kv_cache == "dual" and supports_kv_cache(model)
        # tokens the KV pool holds (None: it grows): EngineConfig.kv_cache_memory, or a share of free CUDA memory
        self.kv_capacity_tokens = (KVPool.capacity_for(kv_bytes_per_token(model), config.kv_cache_memory, self.device)
                                   if self.cached else None)
        self.cache: KVPool | None = self._new_pool()
        self.meta: dict[int, RowMeta] = {}
        self.refreshes: dict[int, int] = {}  # request index -> refresh forwards it took part in (until released)
        self.stats = ForwardStats()
        # the model's tensors for the GIL-free forward (engine.models.scripted_forward), when it is on
        self.scripted: ScriptedWeights | None = None
        # the cores for the GIL-free forward's threads (engine.core_split), set by the engine's loop; pinned once a
        # forward has made torch's pool threads
        self.core_split: CoreSplit | None = None
        self._pin_attempts = 2  # at the first forward's launch and at its end; none after (no pool thread found)
        if config.gil_free_forward:
            self.use_gil_free_forward(True)
        # called with (states, hidden, offsets) after every forward that reused the cache, for those rows
        # (agreement measurements)
        self.on_reuse: Callable[[list[RequestState], torch.Tensor, list[int]], None] | None = None

    def gil_free_forward_applies(self) -> bool:
        """Whether `use_gil_free_forward(True)` would turn it on: a packed model that has the twin, a dense cache, and
        on the CPU at least two usable cores. With one core there is nothing to run beside the forward, and torch
        (2.13) aborts the process at exit after a `torch.jit.fork` when its affinity is a single core."""
        dense = self.cache is None or not self.cache.sparse
        cores = self.device.type != "cpu" or usable_cores() >= 2
        return self.packed and dense and cores and supports_gil_free_forward(self.model)

    def use_gil_free_forward(self, on: bool) -> bool:
        """Run packed forwards as the TorchScript twin on torch's inter-op pool (the calling thread waits without the
        GIL, so Python threads, the mask workers, run beside it), where it applies (`gil_free_forward_applies`: not
        with the sparse cache, whose kernels stay eager); returns whether it is on."""
        ok = on and self.gil_free_forward_applies()
        self.scripted = self.model.scripted_weights() if ok else None
        return ok

    def _new_pool(self) -> KVPool | None:
        if not self.cached:
            return None
        return KVPool(self.kv_capacity_tokens, sparse=self.config.keep_ratio < 1.0, device=self.device)

    def reset(self, states: Sequence[RequestState] = ()) -> None:
        """Forget every request: an empty cache."""
        self.cache = self._new_pool()
        self.meta = {}
        self.refreshes = {s.index: 0 for s in states}

    def release(self, index: int) -> None:
        """A request left (finished, failed or aborted): free its pool slots and bookkeeping, nobody else's."""
        if self.cache is not None:
            self.cache.release(index)
        self.meta.pop(index, None)
        self.refreshes.pop(index, None)

    # ------------------------------------------------------------------ full forward (no span forward)
    def _rows(self, states: Sequence[RequestState], width: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Left-padded ids [b, width], key-padding mask, and each row's slot of canvas position 0."""
        ids = torch.full((len(states), width), self.pad_id, dtype=torch.long)
        kpm = torch.zeros((len(states), width), dtype=torch.bool)
        offsets = []
        for b, s in enumerate(states):
            n = len(s.prompt_ids) + s.canvas_len
            pad = width - n
            ids[b, pad:pad + len(s.prompt_ids)] = torch.tensor(s.prompt_ids, dtype=torch.long)
            ids[b, pad + len(s.prompt_ids):] = s.canvas
            kpm[b, pad:] = True
            offsets.append(pad + len(s.prompt_ids))
        return ids, kpm, offsets

    def full_forward(self, states: Sequence[RequestState]) -> Group:
        """One forward of every request's whole sequence, left-padded to the longest (no cache)."""
        width = max(len(s.prompt_ids) + s.canvas_len for s in states)
        ids, kpm, offsets = self._rows(states, width)
        kwargs: dict[str, Any] = {}
        if isinstance(self.model, RequestStateLM):
            kwargs["request_states"] = list(states)
        kpm_d = kpm.to(self.device)
        hidden = self.model.hidden_states(ids.to(self.device), position_ids=default_position_ids(kpm_d),
                                          key_padding_mask=kpm_d, **kwargs)
        return list(states), hidden, offsets

    # ------------------------------------------------------------------ refresh decisions
    def _committed_in_block(self, s: RequestState) -> int:
        start, end = s.block_bounds()
        return int(s.committed[start:end].sum())

    def needs_refresh(self, s: RequestState) -> bool:
        meta = self.meta.get(s.index)
        if meta is None or self.cache is None or s.index not in self.cache or meta.block != s.block:
            return True
        if self.config.refresh == "steps":
            return meta.forwards >= self.config.refresh_steps
        if self.config.refresh == "adaptive":
            start, end = s.block_bounds()
            new = self._committed_in_block(s) - meta.committed_at_refresh
            return new >= self.config.refresh_threshold * (end - start)
        return False

    def phase_tokens(self, s: RequestState) -> int:
        """The rows the request's segment of the next forward takes, its phase cost for the scheduler: the whole
        sequence for a Refresh (or a forward without the cache), the query span for a Reuse."""
        if self.packed and self.cached and not self.needs_refresh(s):
            a, b = self._span(s)
            return b - a
        return len(s.prompt_ids) + s.canvas_len

    # ------------------------------------------------------------------ packed forward
    def _span(self, s: RequestState) -> tuple[int, int]:
        start, end = s.block_bounds()
        p = len(s.prompt_ids)
        return p + start - self.shift, p + end

    def plan(self, states: Sequence[RequestState]) -> list[Segment]:
        """Each request's segment of this step's packed forward (the refresh decisions are made here)."""
        segments: list[Segment] = []
        row = 0
        for s in states:
            n = len(s.prompt_ids) + s.canvas_len
            span = self._span(s)
            if not self.cached:
                seg = Segment(s, "full", row, 0, n, span)
            elif self.needs_refresh(s):
                seg = Segment(s, "refresh", row, 0, n, span)
                assert self.cache is not None
                self.cache.admit(s.index, n)  # its slots for life (a no-op when it has them)
            else:
                seg = Segment(s, "reuse", row, span[0], span[1] - span[0], span)
            segments.append(seg)
            row += seg.length
        return segments

    def _packed_forward(self, segments: list[Segment]) -> torch.Tensor:
        """Hidden states [T, D] of the packed rows of `segments` (one model forward, one attention call per layer)."""
        ids, pos, neighbors, total = self._packed_inputs(segments)
        step = StepAttention.build(segments, self.cache, ids.shape[1], self.device, self.config.keep_ratio,
                                   self.config.backend)
        kwargs = {} if neighbors is None else {"neighbor_ids": neighbors.to(self.device)}
        hidden = self.model.hidden_states_cached(ids.to(self.device), pos.to(self.device), step.attend, **kwargs)
        return hidden[0, :total]

    def _start_gil_free_forward(self, segments: list[Segment]) -> Callable[[], torch.Tensor]:
        """The packed forward by the TorchScript twin, started on the inter-op pool with the same attention metadata
        (it writes the pool in place as `StepAttention.attend` does); the returned function waits for it without the
        GIL and gives the hidden states [T, D]."""
        assert self.scripted is not None
        ids, pos, neighbors, total = self._packed_inputs(segments)
        step = StepAttention.build(segments, self.cache, ids.shape[1], self.device, backend="torch")  # the twin's path
        w = self.scripted
        pool_k: list[torch.Tensor] = []
        pool_v: list[torch.Tensor] = []
        if self.cache is not None:
            self.cache.ensure(len(w.layers), w.n_kv, w.head_dim, w.wte.dtype)
            pool_k, pool_v = self.cache.k, self.cache.v
        nb = neighbors if neighbors is not None else torch.empty((1, ids.shape[1], 0), dtype=torch.long)
        future = start_span_forward(w, ids.to(self.device), pos.to(self.device), nb.to(self.device), step, pool_k,
                                    pool_v)
        self._pin_forward_threads()

        def finish() -> torch.Tensor:
            with loop_activity.waiting():  # no GIL needed: a compilation beside the loop runs now (engine.gil_share)
                hidden = future.wait()
            self._pin_forward_threads()  # the pool's threads were only being made at the first launch
            return hidden[0, :total]

        return finish

    def _pin_forward_threads(self) -> None:
        """Keep torch's pool threads, which run the GIL-free forward, on the core split's forward cores: once per
        runner (the threads are the process's and keep their cores), at the first forward's launch, or at its end
        when its launch found none (the pool's threads were being made), and never again after that."""
        if self.core_split is not None and self._pin_attempts > 0:
            self._pin_attempts = 0 if self.core_split.pin_forward_threads() > 0 else self._pin_attempts - 1

    def _packed_inputs(self, segments: list[Segment]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
        """The packed rows' ids and position ids [1, rows], their neighbour ids [1, rows, N] (None without the input
        token shift), and the number of real rows (rows >= MIN_PACKED_ROWS, padded)."""
        total = sum(seg.length for seg in segments)
        rows = max(total, MIN_PACKED_ROWS)
        ids = torch.full((1, rows), self.pad_id, dtype=torch.long)
        pos = torch.zeros((1, rows), dtype=torch.long)
        # each row's neighbours in its own sequence, for models whose input mixes them in (LLaDA's token shift)
        offsets = self.neighbor_offsets
        neighbors = torch.full((1, rows, len(offsets)), -1, dtype=torch.long) if self.neighbors else None
        w = max((abs(o) for o in offsets), default=0)
        none = torch.full((w,), -1, dtype=torch.long)
        for seg in segments:
            s = seg.state
            seq = torch.cat([torch.tensor(s.prompt_ids, dtype=torch.long), s.canvas.cpu()])
            a, b = seg.first, seg.first + seg.length
            ids[0, seg.rows] = seq[a:b]
            pos[0, seg.rows] = torch.arange(a, b)
            if neighbors is not None:
                padded = torch.cat([none, seq, none])  # padded[i + w] = seq[i]
                for col, o in enumerate(offsets):
                    neighbors[0, seg.rows, col] = padded[a + w + o:b + w + o]
        return ids, pos, neighbors, total

    def forward_rows(self, states: Sequence[RequestState]) -> list[Row]:
        """This step's forward for the running `states`: one model call (see the module docstring)."""
        return self.start_rows(states)()

    def start_rows(self, states: Sequence[RequestState]) -> Callable[[], list[Row]]:
        """`forward_rows` in two halves: plan and start the forward now, and return the function that waits for it and
        gives the rows. With the GIL-free forward the caller's Python (e.g. the step's mask jobs, submitted after
        this) runs while the forward computes. An eager forward has issued all its ops when this returns: on CUDA the
        device is still computing them while the caller's Python runs; on the CPU they are done, so what the caller
        does next follows the forward."""
        states = list(states)
        if not states:
            return list
        self.stats.forwards += 1
        self.stats.request_rows += len(states)
        if not self.packed:
            group, hidden, offsets = self.full_forward(states)
            self.stats.token_rows += hidden.shape[0] * hidden.shape[1]
            self.stats.refresh_rows += len(states)
            for s in states:
                self.refreshes[s.index] = self.refreshes.get(s.index, 0) + 1
            flat = hidden.reshape(-1, hidden.shape[-1])
            width = hidden.shape[1]
            rows = [Row(s, hidden[b], offsets[b], flat, b * width) for b, s in enumerate(group)]
            return lambda: rows
        segments = self.plan(states)
        if self.scripted is not None:
            finish = self._start_gil_free_forward(segments)
            return lambda: self._packed_rows(segments, finish())
        hidden = self._packed_forward(segments)
        return lambda: self._packed_rows(segments, hidden)

    def _packed_rows(self, segments: list[Segment], hidden: torch.Tensor) -> list[Row]:
        """Each segment's rows of a finished packed forward, with the cache bookkeeping of its refresh decision."""
        self.stats.token_rows += max(hidden.shape[0], MIN_PACKED_ROWS)
        out = []
        for seg in segments:
            s = seg.state
            out.append(Row(s, hidden[seg.rows], len(s.prompt_ids) - seg.first, hidden, seg.start))
            if seg.kind == "reuse":
                self.meta[s.index].forwards += 1
                continue
            self.stats.refresh_rows += 1
            self.refreshes[s.index] = self.refreshes.get(s.index, 0) + 1
            if seg.kind == "refresh":
                self.meta[s.index] = RowMeta(block=s.block, forwards=1,
                                             committed_at_refresh=self._committed_in_block(s))
        reused = [row for row, seg in zip(out, segments) if seg.kind == "reuse"]
        if self.on_reuse is not None and reused:
            group, hidden_b, offs = _stack(reused)
            self.on_reuse(group, hidden_b, offs)
        return out

    def forward(self, states: Sequence[RequestState]) -> list[Group]:
        """`forward_rows` as one padded group [(states, hidden [b, L, D], offsets)] (empty list for no states)."""
        rows = self.forward_rows(states)
        return [_stack(rows)] if rows else []


def _stack(rows: list[Row]) -> Group:
    """Rows of different lengths as one right-padded tensor [b, L, D] (offsets unchanged)."""
    width = max(r.hidden.shape[0] for r in rows)
    first = rows[0].hidden
    hidden = first.new_zeros((len(rows), width, first.shape[-1]))
    for b, r in enumerate(rows):
        hidden[b, :r.hidden.shape[0]] = r.hidden
    return [r.state for r in rows], hidden, [r.offset for r in rows]
