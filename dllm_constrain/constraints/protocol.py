"""The seams between the engine and the constraint layer: what the engine calls, and nothing else.

  Compiled            what the engine needs of a compiled constraint (min_tokens, new_canvas_state)
  CompiledKind        the one interface of the package's compiled kinds (regex, JSON Schema, Lark grammar)
  CanvasConstraint    a request's canvas state, made by `Compiled.new_canvas_state` for one canvas length
  RowMaskConstraint   the smaller protocol a caller's own constraint may implement; `as_canvas_constraint` adapts it
  fill_token_bitmask  `as_canvas_constraint(c).fill_token_bitmask(...)`, for callers holding either kind
  declares            the cheap nominal check: the package's classes name their protocol among their bases
  first_unfit_pin     the admission check of a pinned canvas (one protocol method, `is_completable`)

The canvas passed to a state is the answer region only (length = canvas_len), token ids with `mask_id` at every
open position. Valid: the tokens up to the first EOS decode to an accepted string and every later position is EOS.
Completable: some assignment of the open positions makes the canvas valid.

Masks travel in one format, xgrammar's packed token bitmask: int32 [rows, ceil(vocab / 32)], bit t % 32 of word
t // 32 allowing token t (`dllm_constrain.kernels.bitmask`). The engine allocates it, the state fills it in place,
and the engine ANDs its own restrictions into the same tensor before the kernels read it.
Every member below is implemented by every state and compiled constraint of this package, so the engine calls
them directly (no optional attributes): a capability a kind lacks answers None / False as its docstring says.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from dllm_constrain.kernels.bitmask import bitmask_bytes, pack_bool_mask


@runtime_checkable
class CanvasConstraint(Protocol):
    """One request's constraint state for a canvas of `canvas_len` positions. Used by one thread at a time; states
    of one compiled constraint share its lazily grown structures (`shared_state`)."""

    @property
    def canvas_len(self) -> int | None:
        """The canvas length the state was made for (None: any length, a caller's own constraint)."""
        ...

    @property
    def offers_prefix_hint(self) -> bool:
        """Whether `prefix_hint` answers from the committed prefix alone, without computing a mask. When False it
        always answers None and the engine probes the frontier's mask row instead."""
        ...

    def shared_state(self) -> object:
        """The mutable compiled structure this state shares with the other states of its compiled constraint (a
        regular constraint's set algebra, a grammar's compiled grammar; a caller's own constraint: itself). The
        engine gives the states sharing one such object to the same mask worker, in the loop's order."""
        ...

    def fill_token_bitmask(self, canvas: Sequence[int], positions: Sequence[int], out: torch.Tensor) -> None:
        """Write the mask of positions[j] into row j of `out` (a CPU int32 bitmask [>= len(positions), W], rows
        contiguous): token t allowed iff committing it alone keeps the canvas completable (exact for regular
        constraints; sound over-approximation elsewhere). Every word of rows 0..len(positions)-1 is written; tokens
        at or past the constraint's vocabulary are 0, tokens past 32 W are dropped. Other rows are left alone."""
        ...

    def select_commits(
        self, canvas: Sequence[int], proposals: Sequence[tuple[int, int, float]]
    ) -> list[tuple[int, int]]:
        """Joint verification of one step's commits. proposals = (position, token, score); returns the
        highest-scoring subset (greedy by score) whose joint commit keeps the canvas completable. Never
        empty when proposals is non-empty and each proposal was allowed alone."""
        ...

    def is_completable(self, canvas: Sequence[int]) -> bool:
        """True when some assignment of the open positions makes the canvas valid."""
        ...

    def prefix_hint(self, canvas: Sequence[int], position: int) -> int | None:
        """The one token the committed prefix alone allows at `position`, the first open position of a completable
        canvas (a superset of its mask row, so a single token is the position's only allowed token); None when the
        prefix allows more than one, or when the state offers no such hint (`offers_prefix_hint` False)."""
        ...


@runtime_checkable
class Compiled(Protocol):
    """What the engine needs of a compiled constraint, whatever made it (the package's kinds, or a substitute
    compiler's result: tests, adapters): the fewest tokens of an accepted text, and a request's canvas state for a
    canvas length. `compiler.new_request_state` is the engine's one call on it."""

    def min_tokens(self) -> int:
        """Fewest tokens of an accepted text (EOS not counted), or a bound that never refuses a request that fits."""
        ...

    def new_canvas_state(self, canvas_len: int) -> CanvasConstraint | RowMaskConstraint:
        """A request's canvas state for `canvas_len` positions; ConstraintTooLongError when none fits."""
        ...


class CompiledKind(Compiled, Protocol):
    """The whole interface of the package's compiled kinds (`CompiledConstraint`, `cfg.CompiledGrammar`, which
    declare it): what `ConstraintCompiler.compile` returns. Thread-safe to share between requests."""

    kind: str  # "regex", "json_schema", "grammar" or "ast"
    tokenizer_info: Any  # the TokenizerInfo the constraint was compiled against

    def min_tokens(self, timeout_s: float | None = ...) -> int:
        """`Compiled.min_tokens`, memoised; timeout_s: the last-resort limit of the search (None: unbounded)."""
        ...

    def fits_by_bytes(self, canvas_len: int) -> bool:
        """True when an accepted text provably fits `canvas_len` tokens without a search; False: not decided."""
        ...

    def new_canvas_state(self, canvas_len: int, *, timeout_s: float | None = ...) -> CanvasConstraint:
        """A request's canvas state for `canvas_len` positions; ConstraintTooLongError when the kind's own fit check
        proves no accepted text fits (`compiler.new_request_state` adds the fewest-token check of admission).
        timeout_s bounds every call of the state (None: unbounded)."""
        ...

    def memory_bytes(self) -> int:
        """An estimate of the memory held (what the compile cache charges); grows as requests explore it."""
        ...

    def worn_out(self) -> bool:
        """Whether the compile cache should compile the constraint afresh for the next request (its shared
        structures have grown near their bound)."""
        ...

    def accepts_text(self, text: str) -> bool:
        """Whether `text` is an accepted output."""
        ...

    def accepts_tokens(self, ids: Sequence[int]) -> bool:
        """Whether the tokens up to the first EOS spell an accepted output."""
        ...


@runtime_checkable
class RowMaskConstraint(Protocol):
    """The least a caller's own constraint implements (tests, tools, outside constraint libraries): bool mask rows,
    joint verification and completability, with `CanvasConstraint`'s meanings."""

    def allowed_tokens(self, canvas: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """Bool [len(positions), vocab_size]: row j allows the tokens of positions[j] (True = allowed)."""
        ...

    def select_commits(
        self, canvas: Sequence[int], proposals: Sequence[tuple[int, int, float]]
    ) -> list[tuple[int, int]]: ...

    def is_completable(self, canvas: Sequence[int]) -> bool: ...


class RowMaskAdapter:
    """A `CanvasConstraint` over a `RowMaskConstraint`: its bool rows packed into the bitmask, no prefix hint,
    any canvas length, shared state the wrapped object itself."""

    def __init__(self, rows: RowMaskConstraint) -> None:
        self.rows = rows

    canvas_len = None
    offers_prefix_hint = False

    def shared_state(self) -> object:
        return self.rows

    def fill_token_bitmask(self, canvas: Sequence[int], positions: Sequence[int], out: torch.Tensor) -> None:
        n = len(positions)
        rows = torch.as_tensor(self.rows.allowed_tokens(canvas, positions), dtype=torch.bool)
        dst = bitmask_bytes(out[:n])
        packed = bitmask_bytes(pack_bool_mask(rows))
        k = min(dst.shape[1], packed.shape[1])
        dst[:, :k] = packed[:, :k]
        dst[:, k:] = 0

    def select_commits(self, canvas: Sequence[int],
                       proposals: Sequence[tuple[int, int, float]]) -> list[tuple[int, int]]:
        return self.rows.select_commits(canvas, proposals)

    def is_completable(self, canvas: Sequence[int]) -> bool:
        return self.rows.is_completable(canvas)

    def prefix_hint(self, canvas: Sequence[int], position: int) -> int | None:
        return None


def declares(obj: object, protocol: type) -> bool:
    """Whether obj's class names `protocol` among its bases (the package's compiled constraints and states do): a
    nominal check, ~0.1 us, where a structural isinstance against a protocol with properties takes ~20 us."""
    return protocol in type(obj).__mro__


def as_canvas_constraint(constraint: CanvasConstraint | RowMaskConstraint) -> CanvasConstraint:
    """`constraint` itself when it implements `CanvasConstraint`, else a `RowMaskAdapter` over it: the one place
    where a caller's own constraint is told apart (the engine adapts a request's constraint once, on admission)."""
    if declares(constraint, CanvasConstraint) or isinstance(constraint, CanvasConstraint):
        return constraint
    return RowMaskAdapter(constraint)


def fill_token_bitmask(constraint: CanvasConstraint | RowMaskConstraint, canvas: Sequence[int],
                       positions: Sequence[int], out: torch.Tensor) -> None:
    """`as_canvas_constraint(constraint).fill_token_bitmask(canvas, positions, out)`."""
    as_canvas_constraint(constraint).fill_token_bitmask(canvas, positions, out)


def first_unfit_pin(constraint: CanvasConstraint | RowMaskConstraint, canvas_len: int, pins: dict[int, int],
                    mask_id: int) -> int | None:
    """The first pinned position (in position order) that no valid output can hold together with the pins left of
    it, or None when the pinned canvas is completable: the admission check of a template (pinned tokens are the
    canvas's committed tokens at step 0).

    One completability call when the pins fit (the common case); otherwise a binary search over position-ordered
    prefixes of the pins (completability is monotone: a canvas with more committed tokens has no more completions),
    so O(log pins) calls name the position. None also when no output fits the bare canvas (a length problem, which
    the constraint reports itself)."""
    order = sorted(pins)

    def fits(k: int) -> bool:
        view = [mask_id] * canvas_len
        for p in order[:k]:
            view[p] = pins[p]
        return constraint.is_completable(view)

    if fits(len(order)):
        return None
    lo, hi = 0, len(order)  # fits(lo) holds, fits(hi) does not
    if not fits(0):  # nothing fits the canvas at all: the constraint's own length error says so, not a pin
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return order[hi - 1]
