"""A request's constraint on a block-diffusion canvas, as vLLM's DiffusionGemma sampler sees it (no vLLM import).

vLLM denoises DiffusionGemma one block at a time: a block of W positions starts as random tokens, every step
samples all W positions over the flat logits `[sum of the batch's canvas widths, V]`, and on the commit step the
whole block (its argmax canvas) is emitted at once (`num_sampled` = W). For the answer region of `max_tokens`
positions, the committed blocks on the left are fixed and everything right of the current block is open, so:

- before a step, `block_rows(width)` gives each row of the block its mask from the constraint layer
  (`allowed_tokens(canvas, [b, b+W))`, exact for regular constraints): a token outside it cannot start any valid
  completion of the committed prefix, whatever the other positions become. `mask_flat_logits` writes the masks of
  the constrained requests onto their rows of the flat logits, with vLLM's own finite mask value, so the sampler's
  entropy (p log p) stays finite;
- on the commit step the block's positions were chosen each under its own mask, which does not make the block
  valid jointly (two positions can each be possible but not together). `commit(block, scores)` keeps the largest
  jointly valid subset by score (`select_commits`), then fills the other positions left to right, each with the
  best-scoring token of its exact row given everything already placed, so the committed canvas stays completable,
  and records the block as committed.

Tokens past the constraint's vocabulary (a padded logits width) are masked; after the first EOS only EOS is valid.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..constraints import CompiledConstraint
from ..constraints.protocol import CanvasConstraint

# vLLM's diffusion sampler masks with this finite value (diffusion_gemma.py, _MASKED_LOGIT): 0 * -inf would make
# the row's entropy NaN, 0 * -1e20 is 0, and it stays finite after the greedy temperature's 1e10 scaling.
MASKED_LOGIT = -1e20


@dataclass
class BlockConstraint:
    """One request's canvas constraint across its blocks (see the module docstring)."""

    state: CanvasConstraint
    max_tokens: int
    mask_id: int
    committed: list[int] = field(default_factory=list)
    repaired: int = 0  # positions whose token commit() replaced

    @classmethod
    def for_request(cls, compiled: CompiledConstraint, max_tokens: int) -> "BlockConstraint":
        """ConstraintTooLongError when no answer fits in max_tokens. The state runs without the layer's per-call
        deadline: a sampler draws from the rows directly, so they must be exact, not the deadline's fallback."""
        state = compiled.new_canvas_state(int(max_tokens), timeout_s=None)
        return cls(state, int(max_tokens), compiled.mask_id)

    @property
    def block_start(self) -> int:
        return len(self.committed)

    def _canvas(self, block: Sequence[int | None] = ()) -> list[int]:
        c = list(self.committed) + [self.mask_id if t is None else int(t) for t in block]
        return c + [self.mask_id] * (self.max_tokens - len(c))

    def _positions(self, width: int) -> list[int]:
        return list(range(self.block_start, min(self.block_start + int(width), self.max_tokens)))

    def block_rows(self, width: int, vocab: int) -> torch.Tensor:
        """Bool [width, vocab]: the current block's row masks (rows past max_tokens allow nothing but EOS would
        not be reached: vLLM caps a request's last canvas at max_tokens, so they do not occur)."""
        positions = self._positions(width)
        rows = self.state.allowed_tokens(self._canvas(), positions)
        out = torch.zeros((int(width), int(vocab)), dtype=torch.bool)
        k = min(rows.shape[1], int(vocab))
        out[:len(positions), :k] = rows[:, :k]
        return out

    def commit(self, block: Sequence[int], scores: torch.Tensor) -> list[int]:
        """The block to emit for the sampler's `block` (its committed tokens) and that step's `scores`
        ([len(block), V] logits of those rows): the block itself when jointly valid, else repaired (see the
        module docstring). Records it as committed."""
        positions = self._positions(len(block))
        block = [int(t) for t in block[:len(positions)]]
        scores = scores[:len(positions)].float()
        best = scores.gather(1, torch.tensor(block, dtype=torch.long).clamp(0, scores.shape[1] - 1)[:, None])
        proposals = [(p, t, float(s)) for p, t, s in zip(positions, block, best[:, 0].tolist())]
        kept = dict(self.state.select_commits(self._canvas(), proposals)) if proposals else {}
        placed: list[int | None] = [kept.get(p) for p in positions]
        for j, p in enumerate(positions):
            if placed[j] is not None:
                continue
            [row] = self.state.allowed_tokens(self._canvas(placed), [p])
            allowed = row.numpy()[:scores.shape[1]]
            candidates = np.flatnonzero(allowed)
            if candidates.size == 0:  # the layer's rows are never empty on a completable canvas
                raise RuntimeError(f"no token keeps the canvas completable at position {p}")
            pick = int(candidates[int(torch.argmax(scores[j, torch.from_numpy(candidates)]))])
            placed[j] = pick
            self.repaired += pick != block[j]
        final = [int(t) for t in placed]  # type: ignore[arg-type]
        self.committed.extend(final)
        return final

    def finished(self) -> bool:
        return len(self.committed) >= self.max_tokens


def mask_flat_logits(logits: torch.Tensor, row_starts: Sequence[int], row_masks: Sequence[torch.Tensor | None]
                     ) -> torch.Tensor:
    """Logits with each request's rows [row_starts[i], + len(row_masks[i])) masked outside row_masks[i] (bool
    [rows, >= V]); None leaves a request's rows alone. A copy when anything is masked: the runner owns `logits`."""
    out: torch.Tensor | None = None
    vocab = logits.shape[-1]
    for start, masks in zip(row_starts, row_masks):
        if masks is None:
            continue
        if out is None:
            out = logits.clone()
        rows = out[int(start):int(start) + masks.shape[0]]
        rows.masked_fill_(~masks[:rows.shape[0], :vocab].to(rows.device), MASKED_LOGIT)
    return logits if out is None else out
