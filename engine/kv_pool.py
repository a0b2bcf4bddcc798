"""The KV pool: one preallocated key and one value tensor per layer, [Hkv, slots, D], shared by every request.

A request gets its slots when it is admitted to the cache (its first Refresh): ceil(n / PAGE) pages for its n
tokens of prompt + canvas (a dLLM sequence has its final length from the start), slot j of the request =
`slots(index)[j]`; `release` returns them. Pages, not ranges, so a freed request leaves no hole too small for the
next one. A Refresh writes the whole sequence's keys/values into its slots, a Reuse its span's (index_copy_, one
per layer for the step's rows); attention reads them through the slot lists (kernels.varlen_attention). With the
sparse cache (keep_ratio < 1) a bool keep mask [Hkv, slots] per layer says which keys a Reuse step reads.

Size (`capacity_tokens`, preallocated): EngineConfig.kv_cache_memory bytes / the model's dense KV bytes per token
(the scheduler admits within the same bytes); on CUDA without it, CUDA_FREE_FRACTION of the device memory free when
the runner is made (after the weights); on the CPU without it, nothing up front. A request that does not fit grows
the pool at admission (between forwards): by what it lacks under a size (page rounding only, when the scheduler
admits by the same bytes), by doubling without one.
Layer tensors are made at a layer's first write (shape and dtype from its keys), or all at once by `ensure`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

PAGE = 16  # slots per page
CUDA_FREE_FRACTION = 0.5  # share of free device memory the pool takes on CUDA when no size is configured


@dataclass
class KVPool:
    """Slots and per-layer K/V (and keep mask) tensors of the running requests (see the module docstring)."""

    capacity_tokens: int | None  # preallocated tokens (None: none up front, doubling as needed)
    sparse: bool = False
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    k: list[torch.Tensor] = field(default_factory=list)
    v: list[torch.Tensor] = field(default_factory=list)
    keep: list[torch.Tensor] = field(default_factory=list)
    pages: int = 0
    free: list[int] = field(default_factory=list)
    owned: dict[int, list[int]] = field(default_factory=dict)  # request index -> its pages
    lengths: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.capacity_tokens is not None:
            self._grow(self.capacity_tokens // PAGE)

    @staticmethod
    def capacity_for(bytes_per_token: int | None, memory: int | None, device: torch.device) -> int | None:
        """Tokens the pool holds: `memory` bytes, else on CUDA a share of the free memory, else None (grows)."""
        if bytes_per_token is None or bytes_per_token <= 0:
            return None
        if memory is None and device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            memory = int(free * CUDA_FREE_FRACTION)
        return None if memory is None else max(PAGE, memory // bytes_per_token)

    # ------------------------------------------------------------------ slots
    def __contains__(self, index: int) -> bool:
        return index in self.owned

    def admit(self, index: int, length: int) -> None:
        """Give request `index` slots for its `length` tokens (a no-op when it has them)."""
        if index in self.owned:
            return
        need = -(-length // PAGE)
        if need > len(self.free):
            lack = need - len(self.free)
            self._grow(lack if self.capacity_tokens is not None else max(self.pages, lack))
        self.owned[index] = [self.free.pop() for _ in range(need)]
        self.lengths[index] = length

    def release(self, index: int) -> None:
        """Return a request's pages (it finished or was aborted); nobody else's slots move."""
        pages = self.owned.pop(index, None)
        self.lengths.pop(index, None)
        if pages:
            self.free.extend(reversed(pages))

    def slots(self, index: int) -> torch.Tensor:
        """int64 [n]: the slot of each of the request's tokens (host tensor)."""
        pages = torch.tensor(self.owned[index], dtype=torch.long)
        return (pages[:, None] * PAGE + torch.arange(PAGE)).view(-1)[:self.lengths[index]]

    def _grow(self, pages: int) -> None:
        old = self.pages
        self.pages += pages
        self.free.extend(range(self.pages - 1, old - 1, -1))  # lowest page first out
        self.k = [_extend(t, pages * PAGE) for t in self.k]
        self.v = [_extend(t, pages * PAGE) for t in self.v]
        self.keep = [_extend(t, pages * PAGE) for t in self.keep]

    # ------------------------------------------------------------------ tensors
    def ensure(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        """Make the layer tensors up to `layers` (zeros; each [kv_heads, slots, head_dim])."""
        shape = (kv_heads, self.pages * PAGE, head_dim)
        while len(self.k) < layers:
            self.k.append(torch.zeros(shape, dtype=dtype, device=self.device))
            self.v.append(torch.zeros(shape, dtype=dtype, device=self.device))
            if self.sparse:
                self.keep.append(torch.zeros(shape[:2], dtype=torch.bool, device=self.device))

    def layer(self, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Layer `layer`'s K, V (and keep mask), made at its first use with the shape and dtype of `like`
        [Hkv, rows, D]."""
        if layer >= len(self.k):
            self.ensure(layer + 1, like.shape[0], like.shape[2], like.dtype)
        return self.k[layer], self.v[layer], self.keep[layer] if self.sparse else None

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token's slot takes over all layers made so far (0 before the first forward)."""
        per = sum(t[:, 0].numel() * t.element_size() for t in self.k + self.v)
        return per + sum(t[:, 0].numel() for t in self.keep)

    @property
    def nbytes(self) -> int:
        """Bytes the running requests' slots hold (pages, whole)."""
        return sum(len(p) for p in self.owned.values()) * PAGE * self.bytes_per_token


def _extend(t: torch.Tensor, slots: int) -> torch.Tensor:
    """`t` [H, S, ...] with `slots` zero slots appended (dim 1)."""
    return torch.cat([t, t.new_zeros((t.shape[0], slots) + t.shape[2:])], dim=1)
