"""Hand-built stand-ins for engine tests: a model whose per-position distributions are scripted, and a
small exact CanvasConstraint for the regular language [digit]+ followed by the EOS-padded tail."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dllm_constrain.engine.models.base import SpecialTokens

BOS, EOS, PAD, MASK = 0, 1, 2, 3
VOCAB = 16  # ids 4..15 are ordinary tokens
DIGITS = list(range(4, 14))  # ten "digit" tokens


class ScriptedModel:
    """A DiffusionLM whose distribution at canvas position i is `script[i]` (token -> probability; the
    remaining mass is spread over the other tokens), whatever the canvas holds.

    hidden_states returns one-hot position ids and logits is a table lookup, so the engine's batching,
    padding and row gathering are exercised for real. It counts forwards and records every logits shape.
    """

    family = "scripted"

    def __init__(self, script: Sequence[dict[int, float]], prompt_len: int, vocab_size: int = VOCAB,
                 max_sequence_length: int = 128) -> None:
        self.special = SpecialTokens(mask_id=MASK, eos_id=EOS, pad_id=PAD, bos_id=BOS)
        self.vocab_size = vocab_size
        self.max_sequence_length = max_sequence_length
        self.table = torch.full((max_sequence_length, vocab_size), math.log(1e-6))
        for i, dist in enumerate(script):
            rest = max(1e-6, (1.0 - sum(dist.values())) / (vocab_size - len(dist)))
            row = torch.full((vocab_size,), math.log(rest))
            for tok, p in dist.items():
                row[tok] = math.log(p)
            self.table[prompt_len + i] = row
        self.forwards = 0
        self.logit_shapes: list[tuple[int, ...]] = []

    def hidden_states(self, input_ids, position_ids=None, key_padding_mask=None):
        self.forwards += 1
        return torch.nn.functional.one_hot(position_ids, self.max_sequence_length).float()

    def logits(self, hidden):
        self.logit_shapes.append(tuple(hidden.shape))
        return hidden @ self.table


class DigitsConstraint:
    """Exact constraint for `d+` (d in `digits`) on a fixed canvas: digits, then EOS to the end.

    A canvas is completable iff some end e in 1..L has every position < e digit-or-open and every
    position >= e EOS-or-open (`_fits`; masks, joint verification and forced tokens all use it, so a
    subclass can make `is_completable` stricter to play an approximate constraint). Counts its calls.
    """

    def __init__(self, digits: Sequence[int] = DIGITS, vocab_size: int = VOCAB, eos_id: int = EOS,
                 mask_id: int = MASK) -> None:
        self.digits = list(digits)
        self.vocab_size = vocab_size
        self.eos, self.mask = eos_id, mask_id
        self.calls: dict[str, int] = {"allowed_tokens": 0, "select_commits": 0, "forced_tokens": 0}

    def is_completable(self, canvas: Sequence[int]) -> bool:
        return self._fits(canvas)

    def _fits(self, canvas: Sequence[int]) -> bool:
        n = len(canvas)
        for end in range(1, n + 1):
            head_ok = all(t == self.mask or t in self.digits for t in canvas[:end])
            tail_ok = all(t == self.mask or t == self.eos for t in canvas[end:])
            if head_ok and tail_ok:
                return True
        return False

    def _allowed_at(self, canvas: list[int], pos: int) -> list[int]:
        out = []
        for tok in self.digits[:1] + [self.eos]:
            trial = list(canvas)
            trial[pos] = tok
            if self._fits(trial):
                out.extend(self.digits if tok != self.eos else [self.eos])
        return out

    def allowed_tokens(self, canvas: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        self.calls["allowed_tokens"] += 1
        mask = torch.zeros(len(positions), self.vocab_size, dtype=torch.bool)
        for j, pos in enumerate(positions):
            mask[j, self._allowed_at(list(canvas), pos)] = True
        return mask

    def select_commits(self, canvas, proposals):
        self.calls["select_commits"] += 1
        trial, kept = list(canvas), []
        for pos, tok, _score in sorted(proposals, key=lambda p: -p[2]):
            before = trial[pos]
            trial[pos] = tok
            if self._fits(trial):
                kept.append((pos, tok))
            else:
                trial[pos] = before
        return kept

    def forced_tokens(self, canvas: Sequence[int]) -> dict[int, int]:
        self.calls["forced_tokens"] += 1
        out = {}
        for pos, tok in enumerate(canvas):
            if tok == self.mask:
                allowed = self._allowed_at(list(canvas), pos)
                if len(allowed) == 1:
                    out[pos] = allowed[0]
        return out

    def accepts(self, token_ids: Sequence[int]) -> bool:
        """The answer (ids before the first EOS) is in the language."""
        return len(token_ids) >= 1 and all(t in self.digits for t in token_ids)
