"""The budgeted logits path: commit statistics for a request's open block positions, never [batch, canvas, vocab].

For one request and one step the engine hands over the hidden states of the rows it may commit (the open positions
of the active block) and their allowed-token masks. `LogitsPath.row_stats` projects them in row chunks whose
transient workspace fits a byte budget, applies the masks inside each chunk and reduces it at once to token,
probability, entropy and top-2 margin (`dllm_constrain.kernels.masked_row_stats`: the fused Triton kernel over
hidden states and the LM head on CUDA, where the logits tile never leaves registers; the torch reference with one
reused workspace on CPU), then moves on; the chunk's logits are overwritten by the next chunk.

Models that expose their LM head (`lm_head_weight()`: LLaDA, Dream) take the fused hidden x head path; any other
model (e.g. DiffusionGemma's soft-capped head, test doubles) has `model.logits(chunk)` called per chunk and the
chunk reduced by the same masked-row-statistics dispatcher.

Noise at T > 0 is drawn from the request's generator chunk after chunk in row order, on the model's device (the
generator lives there: `LLMEngine` creates it with the model's device), so no noise is drawn on the host and copied.
On the CPU it is float64 and torch's CPU generator yields the same stream as one [rows, vocab] draw, so the chunking
never changes a sample; on CUDA it is float32 and the Philox stream depends on the chunk sizes, so a seed reproduces
on the same device with the same logits budget. Results for a seed are reproducible per device, not across devices
(as in vLLM).

The default budget (`default_logits_budget`): on CUDA a quarter of the free device memory
(`torch.cuda.mem_get_info`), on CPU 1/16 of the available RAM (psutil if installed, else MemAvailable from
/proc/meminfo, else sysconf's available pages), clamped to [16 MiB, 4 GiB].
"""
from __future__ import annotations

import os
from typing import Any

import torch

from dllm_constrain.engine.sampling import RowStats, reduce_logits
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
    fn = getattr(model, "lm_head_weight", None)
    return fn() if callable(fn) else None


def _to_engine_stats(stats: RowStats) -> RowStats:
    """Row statistics (possibly on the GPU) on the CPU, with the dtypes the policies expect."""
    return RowStats(token=stats.token.to("cpu", torch.long), prob=stats.prob.to("cpu", torch.float32),
                    entropy=stats.entropy.to("cpu", torch.float32), margin=stats.margin.to("cpu", torch.float32))


class LogitsPath:
    """Row statistics of one request's committable rows under a byte budget (see the module docstring).

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

    def reset_budget(self, device: torch.device | str = "cpu") -> None:
        """Re-derive the default budget from the current free memory (a no-op with an explicit budget)."""
        self.budget_bytes = self.budget_setting if self.budget_setting is not None else default_logits_budget(device)
        self.workspace = mrs.RowStatsWorkspace()

    def rows_per_chunk(self, vocab: int, sampling: bool, device: torch.device) -> int:
        fused = self.weight is not None and mrs.resolve_backend(self.backend, device) == "triton"
        budget = self.budget_bytes if self.budget_bytes is not None else default_logits_budget(device)
        rows = mrs.rows_per_chunk(vocab, budget, sampling=sampling, fused=fused)
        return min(rows, self.max_rows) if self.max_rows is not None else rows

    @torch.no_grad()
    def row_stats(self, hidden: torch.Tensor, allowed: torch.Tensor, temperature: float,
                  generator: torch.Generator | None) -> RowStats:
        """Statistics of the rows `hidden` [n, D] under the masks `allowed`: the engine's token bitmask int32
        [n, ceil(V / 32)] (kernels.bitmask), passed to the kernels as is; bool [n, V] masks are accepted too."""
        n = int(hidden.shape[0])
        if n == 0:
            return RowStats.cat([])
        if not self.budgeted:  # reduced where the logits are, i.e. where the request's generator draws its noise
            logits = self.model.logits(hidden)
            self.chunks += 1
            return _to_engine_stats(reduce_logits(logits, allowed.to(logits.device), temperature, generator))
        device = hidden.device
        vocab = int(allowed.shape[-1]) if allowed.dtype == torch.bool else int(self.model.vocab_size)
        sampling = temperature > 0
        step = self.rows_per_chunk(vocab, sampling, device)
        parts = []
        for start in range(0, n, step):
            stop = min(n, start + step)
            mask = allowed[start:stop].to(device)
            # at T > 0 the kernels draw the chunk's noise from the request's generator, on this device
            if self.weight is not None:
                stats = mrs.masked_row_stats_from_hidden(hidden[start:stop], self.weight, mask, temperature, generator,
                                                         backend=self.backend, workspace=self.workspace)
            else:
                logits = self.model.logits(hidden[start:stop])
                stats = mrs.masked_row_stats(logits, mask, temperature, generator, backend=self.backend,
                                             workspace=self.workspace)
            parts.append(_to_engine_stats(stats))
            self.chunks += 1
        return RowStats.cat(parts)
