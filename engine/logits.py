"""The budgeted logits path and the step's one head pass: commit statistics, never [batch, canvas, vocab].

  `head_pass`            every request's open rows of a step gathered from its hidden states (`gather_rows`: one
                         index_select), reduced in ONE `LogitsPath.row_stats` call, read to the host in ONE
                         `to_host` (engine.host_sync); each request's host statistics come back;
  `LogitsPath.row_stats` rows projected in chunks whose transient workspace fits a byte budget, each chunk masked
                         and reduced at once to token, probability, entropy and top-2 margin
                         (kernels.masked_row_stats: the fused Triton kernel over hidden states and the LM head on
                         CUDA, the torch reference with one reused workspace on the CPU); per-row temperatures, and
                         noise hashed from per-row keys (kernels.hashed_noise) or drawn from a generator;
  `read_slots`           the log-probabilities of SamplingParams.read_slots, one projection for a step.
Models with a linear LM head (`LinearHeadLM`: LLaDA, Dream) take the fused hidden x head path; any other (e.g.
DiffusionGemma's soft-capped head, test doubles) has `model.logits(chunk)` called per chunk. The default budget
(`default_logits_budget`): on CUDA a quarter of the free device memory, on the CPU 1/16 of the available RAM
(psutil, else /proc/meminfo, else sysconf), clamped to [16 MiB, 4 GiB]. docs/engine.md, "The head pass".
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from dllm_constrain.engine.host_sync import to_host
from dllm_constrain.engine.models.base import LinearHeadLM
from dllm_constrain.engine.sampling import RowStats
from dllm_constrain.kernels import hashed_noise
from dllm_constrain.kernels import masked_row_stats as mrs

MiB = 1 << 20
MIN_BUDGET = 16 * MiB
MAX_BUDGET = 4096 * MiB
CPU_FRACTION = 1 / 16
CUDA_FRACTION = 1 / 4


def available_ram_bytes() -> int | None:
    """Bytes of RAM available to new allocations (psutil, /proc/meminfo, then sysconf), None if unknown."""
    try:
        import psutil  # type: ignore[import-not-found]

        return int(psutil.virtual_memory().available)
    except Exception:
        pass
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def default_logits_budget(device: torch.device | str = "cpu") -> int:
    """The default transient-logits budget in bytes for `device` (see the module docstring)."""
    device = torch.device(device)
    free: int | None = None
    fraction = CPU_FRACTION
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        fraction = CUDA_FRACTION
    else:
        free = available_ram_bytes()
    if free is None:
        return 256 * MiB
    return int(min(MAX_BUDGET, max(MIN_BUDGET, free * fraction)))


def lm_head_weight(model: Any) -> torch.Tensor | None:
    """The [V, D] LM head weight when the model exposes it (logits = hidden @ W^T, nothing else), else None."""
    return model.lm_head_weight() if isinstance(model, LinearHeadLM) else None


def _engine_dtypes(stats: RowStats) -> RowStats:
    """Row statistics with the dtypes the policies expect, where they were computed (read to the host later, all
    of a step's at once: engine.host_sync)."""
    return RowStats(token=stats.token.to(torch.long), prob=stats.prob.to(torch.float32),
                    entropy=stats.entropy.to(torch.float32), margin=stats.margin.to(torch.float32))


class LogitsPath:
    """Row statistics of a step's committable rows under a byte budget (see the module docstring).

    budget_bytes: the chunk workspace budget (None: `default_logits_budget` of the hidden states' device, read when
    `reset_budget` is called, i.e. once per `LLMEngine.generate`). max_rows: an optional cap on rows per chunk.
    budgeted=False: one projection of all rows and one `engine.sampling.reduce_logits` call (the unbudgeted path the
    budgeted one is tested against). backend: the kernels' backend ("auto": Triton on CUDA, torch on CPU).
    """

    def __init__(self, model: Any, *, budget_bytes: int | None = None, max_rows: int | None = None,
                 budgeted: bool = True, backend: str = "auto") -> None:
        self.model = model
        self.budget_setting = budget_bytes
        self.budget_bytes: int | None = budget_bytes
        self.max_rows = max_rows
        self.budgeted = budgeted
        self.backend = backend
        self.weight = lm_head_weight(model)
        self.workspace = mrs.RowStatsWorkspace()
        self.chunks = 0  # chunks reduced so far (for tests and benchmarks)
        self.calls = 0  # row_stats calls so far (one per step: tests count them)

    def reset_budget(self, device: torch.device | str = "cpu") -> None:
        """Re-derive the default budget from the current free memory (a no-op with an explicit budget)."""
        self.budget_bytes = self.budget_setting if self.budget_setting is not None else default_logits_budget(device)
        self.workspace = mrs.RowStatsWorkspace()

    def halve_budget(self, device: torch.device | str = "cpu") -> None:
        """Halve the chunk budget (after an out-of-memory in the head pass), never below one row per chunk."""
        budget = self.budget_bytes if self.budget_bytes is not None else default_logits_budget(device)
        self.budget_bytes = max(1, budget // 2)
        self.workspace = mrs.RowStatsWorkspace()

    def rows_per_chunk(self, vocab: int, sampling: bool, device: torch.device, hashed: bool = False) -> int:
        """Rows per chunk under the budget; `hashed` noise (`kernels.masked_row_stats.hashed_gumbel_noise`) adds
        its two int64 words per token."""
        fused = self.weight is not None and mrs.resolve_backend(self.backend, device) == "triton"
        budget = self.budget_bytes if self.budget_bytes is not None else default_logits_budget(device)
        per_row = mrs.workspace_bytes_per_row(vocab, sampling=sampling, fused=fused) + (16 * vocab if hashed else 0)
        rows = max(1, int(budget) // per_row)
        return min(rows, self.max_rows) if self.max_rows is not None else rows

    @torch.no_grad()
    def row_stats(self, hidden: torch.Tensor, allowed: torch.Tensor, temperature: float | Sequence[float],
                  generator: torch.Generator | None = None, *, keys: torch.Tensor | None = None) -> RowStats:
        """Statistics of the rows `hidden` [n, D] under the masks `allowed` (the engine's token bitmask int32
        [n, ceil(V / 32)], kernels.bitmask, passed to the kernels as is; bool [n, V] masks are accepted too), on
        the rows' device. `temperature`: one for all rows, or one per row; with `keys` (int64 [n], one noise key
        per row: `kernels.masked_row_stats.noise_key`) the Gumbel noise of a row at T > 0 is a function of its key
        (`hashed_gumbel_noise`), else it is drawn from `generator` chunk after chunk."""
        self.calls += 1
        n = int(hidden.shape[0])
        if n == 0:
            return RowStats.cat([])
        device = hidden.device
        temps = None if isinstance(temperature, (int, float)) else [float(t) for t in temperature]
        scale = None  # per-row temperatures: noise scaled by each row's T, reduced at T = 1 (see _row_noise)
        if temps is not None:
            temperature = 1.0 if any(t > 0 for t in temps) else 0.0
            if temperature > 0:
                scale = torch.tensor(temps, dtype=mrs.noise_dtype(device)).to(device, non_blocking=True)
        if keys is not None:
            keys = keys.to(device, non_blocking=True)
        if not self.budgeted:  # reduced where the logits are, i.e. where the request's generator draws its noise
            logits = self.model.logits(hidden)
            self.chunks += 1
            noise = _row_noise(keys, scale, 0, n, int(logits.shape[-1]), temperature)
            return _engine_dtypes(mrs.masked_row_stats(logits, allowed.to(logits.device), temperature, generator,
                                                       noise=noise, backend=self.backend))
        return self._chunked(hidden, allowed, temperature, generator, keys, scale)

    def _chunked(self, hidden: torch.Tensor, allowed: torch.Tensor, temperature: float,
                 generator: torch.Generator | None, keys: torch.Tensor | None,
                 scale: torch.Tensor | None) -> RowStats:
        """`row_stats` in row chunks under the budget, each masked and reduced at once."""
        n, device = int(hidden.shape[0]), hidden.device
        vocab = int(allowed.shape[-1]) if allowed.dtype == torch.bool else int(self.model.vocab_size)
        sampling = temperature > 0
        step = self.rows_per_chunk(vocab, sampling, device, hashed=sampling and keys is not None)
        parts = []
        for start in range(0, n, step):
            stop = min(n, start + step)
            mask = allowed[start:stop].to(device, non_blocking=True)
            # at T > 0 the chunk's noise: hashed from the rows' keys, else drawn from the generator on this device
            noise = _row_noise(keys, scale, start, stop, vocab, temperature)
            if self.weight is not None:
                stats = mrs.masked_row_stats_from_hidden(hidden[start:stop], self.weight, mask, temperature, generator,
                                                         noise=noise, backend=self.backend, workspace=self.workspace)
            else:
                logits = self.model.logits(hidden[start:stop])
                stats = mrs.masked_row_stats(logits, mask, temperature, generator, noise=noise, backend=self.backend,
                                             workspace=self.workspace)
            parts.append(_engine_dtypes(stats))
            self.chunks += 1
        return RowStats.cat(parts)


def _row_noise(keys: torch.Tensor | None, scale: torch.Tensor | None, start: int, stop: int, vocab: int,
               temperature: float) -> torch.Tensor | None:
    """The noise of rows start .. stop - 1 at T > 0 when they have keys (None: drawn from the generator). With
    per-row temperatures (`scale`) the rows are reduced at T = 1 on x + T_row * g: the same argmax as x / T_row + g
    for T_row > 0, and exactly argmax x for a greedy row (its noise is 0)."""
    if temperature == 0 or keys is None:
        return None
    noise = hashed_noise.hashed_gumbel_noise(keys[start:stop], vocab)
    if scale is not None:
        noise.mul_(scale[start:stop, None])
    return noise


@dataclass
class HeadJob:
    """One request's rows in a step's head pass: canvas position p's hidden state is `hidden[offset + p]`; the
    rows are its open `positions` under their masks `allowed` (host bitmask [len(positions), W]); `temperature`
    and `row_key` (`kernels.masked_row_stats.noise_row_key` of its seed and step) set its noise. `packed`: the
    step's whole hidden output, of which `hidden[0]` is row `start` (None: `hidden` stands alone)."""

    state: Any
    hidden: torch.Tensor
    offset: int
    positions: list[int]
    allowed: torch.Tensor
    temperature: float
    row_key: int
    packed: torch.Tensor | None = None
    start: int = 0


def gather_rows(jobs: Sequence[HeadJob]) -> torch.Tensor:
    """Every job's open rows, in job order, as one [rows, D] tensor: one index_select from the step's hidden
    states (one torch.cat first when they are not one tensor, e.g. parked rows beside the forward's)."""
    sources: dict[int, tuple[torch.Tensor, int]] = {}  # id(source) -> (source, its first row in the packed tensor)
    index: list[int] = []
    total = 0
    for job in jobs:
        source, start = (job.hidden, 0) if job.packed is None else (job.packed, job.start)
        if id(source) not in sources:
            sources[id(source)] = (source, total)
            total += int(source.shape[0])
        first = sources[id(source)][1] + start + job.offset
        index.extend(first + p for p in job.positions)
    tensors = [t for t, _ in sources.values()]
    packed = tensors[0] if len(tensors) == 1 else torch.cat(tensors)
    return packed.index_select(0, torch.tensor(index, dtype=torch.long).to(packed.device, non_blocking=True))


def head_pass(logits_path: LogitsPath, jobs: Sequence[HeadJob]) -> list[RowStats]:
    """The step's one head pass: every job's open rows projected and reduced in one `row_stats` call, the
    statistics read to the host in one `to_host`; returns each job's host statistics. Nothing is computed when
    no job has an open row."""
    counts = [len(job.positions) for job in jobs]
    if not sum(counts):
        return [RowStats.cat([]) for _ in jobs]
    rows = gather_rows(jobs)
    allowed = torch.cat([job.allowed for job in jobs if job.positions])
    temps = [job.temperature for job in jobs for _ in job.positions]
    keys = None
    if any(t > 0 for t in temps):  # greedy rows need no noise
        keys = torch.tensor([hashed_noise.noise_key(job.row_key, p) for job in jobs for p in job.positions],
                            dtype=torch.long)
    stats = logits_path.row_stats(rows, allowed, temps, keys=keys)
    host = RowStats(*to_host(stats.token, stats.prob, stats.entropy, stats.margin))
    parts, start = [], 0
    for n in counts:
        parts.append(host.span(start, start + n))
        start += n
    return parts


def read_slots(model: Any, reads: list[tuple[HeadJob, set[int]]]) -> None:
    """Keep the reading of every slot (SamplingParams.read_slots) this step's commits touched first: the
    log-probabilities of the slot's ids at its positions that were open at this forward (the others, committed
    before without the model, stay NaN). One LM-head projection and one host read for all of the step's."""
    wanted: list[tuple[Any, int, list[int]]] = []
    rows: list[HeadJob] = []
    for job, committed in reads:
        s, open_rows = job.state, set(job.positions)
        for k, (start, end, _ids) in enumerate(s.params.read_slots or ()):
            if k in s.slot_reads or not any(start <= p < end for p in committed):
                continue
            positions = [p for p in range(start, end) if p in open_rows]
            wanted.append((s, k, positions))
            rows.append(replace(job, positions=positions))
    if not wanted:
        return
    logp = (torch.log_softmax(model.logits(gather_rows(rows)).float(), dim=-1)
            if any(positions for _, _, positions in wanted) else None)
    (host,) = to_host(logp) if logp is not None else (None,)
    first = 0
    for s, k, positions in wanted:
        start, end, ids = s.params.read_slots[k]
        read = torch.full((end - start, len(ids)), float("nan"))
        if positions:
            read[[p - start for p in positions]] = host[first:first + len(positions)][:, list(ids)]
        s.slot_reads[k] = read
        first += len(positions)
