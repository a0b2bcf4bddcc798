"""The constraint stage of a step (vLLM v1's StructuredOutputManager, in shape): masks, forced tokens, compilations.

The request loop (engine.llm_engine) asks this stage, per request and step:
  `prepare`        the forward-free part: step bound, block / EOS bookkeeping (`settle`), the masks with their
                   forced tokens serially, or True: "hand this step's masks to the mask workers, beside the forward";
  `after_forward`  once the forward ran: park a request whose constraint still compiles, else take the masks
                   computed beside or after the forward and commit their forced tokens; True when the request goes
                   on to the step's head pass;
  `head_masks`     the allowed-token bitmask of the rows the head pass reduces;
  `verify`         the constraint's joint verification of the policy's picks, and the backtrack when they left the
                   canvas uncompletable;
  `unpark` / `wait_parked`   a parked request whose compilation ended; waiting when nothing else can run.
A request's `RequestState.phase` (COMPILING, PARKED, MASKS_AFTER, READY, DONE) says where it stands; only this
stage moves it between the first four. docs/engine.md explains masks beside the forward, forced tokens and the
first forward; `engine_constraint` says what the stage reads from a constraint.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any

import torch

from dllm_constrain.constraints.protocol import (
    CanvasConstraint,
    RowMaskConstraint,
    as_canvas_constraint,
    first_unfit_pin,
)
from dllm_constrain.engine.gil_share import loop_activity
from dllm_constrain.engine.mask_workers import ForwardWindow, MaskResult, MaskTiming
from dllm_constrain.engine.models.base import SpecialTokens
from dllm_constrain.engine.policies import POLICIES
from dllm_constrain.engine.state import RequestPhase, RequestState
from dllm_constrain.errors import GenerationTimeoutError, PinnedTokenError
from dllm_constrain.kernels.bitmask import (
    allocate_token_bitmask,
    clear_token,
    pack_bool_mask,
    single_token_rows,
    single_tokens,
)

__all__ = ["Forwarded", "StructuredOutputManager", "base_allowed", "check_step_bound", "engine_constraint"]

# the phases whose step masks are computed after the forward when no worker computed them beside it
_MASKS_AFTER = (RequestPhase.COMPILING, RequestPhase.PARKED, RequestPhase.MASKS_AFTER)


def engine_constraint(constraint: CanvasConstraint | RowMaskConstraint | None) -> CanvasConstraint | None:
    """What the stage reads from a request's constraint: the `CanvasConstraint` protocol (masks filled into the
    engine's bitmask, joint verification, completability, the optional prefix hint); a caller's own
    `RowMaskConstraint` is adapted to it once, on admission."""
    return None if constraint is None else as_canvas_constraint(constraint)


@dataclass
class Forwarded:
    """A request whose step reaches the head pass: its rows (`hidden[offset + p]`: position p) and the masks the
    workers computed beside the forward. `packed` is the step's whole hidden output, of which `hidden[0]` is row
    `start` (the head pass gathers every request's rows from it at once); None: `hidden` stands alone."""

    state: RequestState
    hidden: torch.Tensor
    offset: int
    masks: MaskResult | None = None
    parked: bool = False  # rows kept from its first forward, the request just unparked
    packed: torch.Tensor | None = None
    start: int = 0


class StructuredOutputManager:
    """The constraint stage of one engine (see the module docstring). `place_helper_thread` puts a compile thread
    the stage starts on the helper cores (`LLMEngine.place_helper_thread`)."""

    def __init__(self, special: SpecialTokens, base_allowed: torch.Tensor,
                 place_helper_thread: Callable[[], None]) -> None:
        self.special = special
        self.mask_id = special.mask_id
        self.vocab_size = int(base_allowed.shape[0])
        self.base_allowed = base_allowed
        self.base_bitmask = pack_bool_mask(base_allowed)  # the same, as one token-bitmask row [W]
        self.place_helper_thread = place_helper_thread

    # ------------------------------------------------------------------ masks
    def allowed(self, s: RequestState, view: list[int], positions: list[int]) -> torch.Tensor:
        """Token bitmask int32 [len(positions), ceil(vocab / 32)] (kernels.bitmask): the constraint fills it in
        place, the base mask and the banned pairs narrow it, and the logits path hands it to the kernels as is."""
        if s.constraint is None:
            allowed = self.base_bitmask.expand(len(positions), -1).clone()
        else:
            allowed = allocate_token_bitmask(len(positions), self.vocab_size)
            s.constraint.fill_token_bitmask(view, positions, allowed)
            allowed &= self.base_bitmask
        for j, pos in enumerate(positions):
            for bpos, btok in s.banned:
                if bpos == pos and 0 <= btok < self.vocab_size:
                    clear_token(allowed, j, btok)
        return allowed

    def allowed_beside(self, s: RequestState, view: list[int], positions: list[int],
                       forward_running: ForwardWindow) -> torch.Tensor | None:
        """`allowed` on a mask worker. A constraint still compiling is waited for while the forward runs and made
        the request's canvas state here (the worker owns the request's constraint until the join); None when it is
        still compiling after the forward (the request then parks, see `after_forward`)."""
        if s.pending is not None:
            pending = s.pending.constraint
            pending.start(self.place_helper_thread)
            if not forward_running.wait_done(pending.future):
                return None
            self.resolve_pending(s)
        return self.allowed(s, view, positions)

    def timed_allowed(self, s: RequestState, view: list[int], positions: list[int],
                      timing: MaskTiming | None, probe: bool = False) -> torch.Tensor:
        """`allowed` computed on the loop thread (serially), its time recorded in `timing`."""
        start = time.perf_counter()
        allowed = self.allowed(s, view, positions)
        if timing is not None:
            timing.add_mask(start, time.perf_counter(), probe=probe)
        return allowed

    def base_allows(self, token: int) -> bool:
        """Whether the engine's own mask (specials the model may not write) allows `token`."""
        return 0 <= token < self.vocab_size and bool(self.base_allowed[token])

    @staticmethod
    def resolve_pending(s: RequestState) -> None:
        """Make a compiled pending constraint the request's canvas state (its compilation or fit error is raised)."""
        if s.pending is not None:
            s.constraint, s.pending = engine_constraint(s.pending.constraint_state()), None

    def pin(self, s: RequestState, pins: dict[int, int], decode: Callable[[list[int]], str] | None) -> None:
        """Commit a template's pinned tokens (before the first step), after checking that some valid output holds
        them: tokens the model may write at all, EOS only followed by EOS (the canvas conventions), and under a
        constraint a completable pinned canvas (`first_unfit_pin`). Raises PinnedTokenError naming the first
        position that cannot be part of any valid output."""
        special = next((p for p, t in pins.items() if not self.base_allows(t)), None)
        if s.constraint is not None:
            # validity under a constraint includes the EOS tail; the pins left of a special are searched
            bad = first_unfit_pin(s.constraint, s.canvas_len, {p: t for p, t in pins.items()
                                                                 if special is None or p < special},
                                  self.mask_id)
            if bad is not None:
                text = decode([pins[bad]]) if decode is not None else ""
                raise PinnedTokenError(
                    f"pinned token {pins[bad]} ({text!r}) at canvas position {bad} cannot be part of any output the "
                    f"constraint accepts (given the pins left of it)", position=bad, token=pins[bad])
        else:
            eos = self.special.eos_id
            eos_at = next((p for p, t in pins.items() if t == eos), None)
            after = next((p for p, t in pins.items() if eos_at is not None and p > eos_at and t != eos), None)
            if after is not None and (special is None or after < special):
                raise PinnedTokenError(f"pinned token {pins[after]} at canvas position {after} follows the pinned "
                                       f"EOS at position {eos_at}: after EOS only EOS is valid",
                                       position=after, token=pins[after])
        if special is not None:
            raise PinnedTokenError(f"pinned token {pins[special]} at canvas position {special} is not one the model "
                                   f"may write (a special such as MASK/BOS/PAD, or past the vocabulary)",
                                   position=special, token=pins[special])
        s.commit(list(pins), list(pins.values()))

    # ------------------------------------------------------------------ before the forward
    def prepare(self, s: RequestState, timing: MaskTiming | None = None, workers: bool = False,
                first_beside: bool = False) -> bool:
        """The forward-free part of a step: bound check, block/EOS bookkeeping, and the masks with the forced
        tokens, serially, unless the loop has mask workers (`workers`) and this step's masks can wait for them:
        then True is returned and the loop hands them to its workers, beside the forward. With `first_beside`
        (the request loop) a request's first forward never waits for its constraint (docs/engine.md, "The first
        forward"); with workers, the frontier's forced tokens are committed first (docs/engine.md, "Forced
        tokens")."""
        check_step_bound(s)
        s.step += 1
        self.settle(s)
        if s.done or (s.constraint is None and s.pending is None):
            return False
        if first_beside and s.nfe == 0:
            return self._prepare_first(s, timing, workers)
        if workers:
            if not s.params.forced_tokens:
                return True
            hinted = self._commit_prefix_forced(s, timing)
            if hinted is not None:
                return hinted
            if not self._frontier_forced(s, timing):
                return True
        if s.params.forced_tokens:
            self._commit_forced(s, timing)
        else:
            positions = s.open_in_block()
            s.allowed_cache = (positions, self.timed_allowed(s, s.canvas_view(self.mask_id), positions, timing))
        return False

    def _prepare_first(self, s: RequestState, timing: MaskTiming | None, workers: bool) -> bool:
        """`prepare` before a request's first forward: nothing is forced before it, unless the forced tokens fill
        the whole answer (`_forced_fill`); its masks go beside it (workers) or after it (MASKS_AFTER)."""
        if s.pending is None and s.params.forced_tokens:
            if self._forced_fill(s, timing, workers):
                return False
            if s.allowed_cache is not None:  # the check computed the masks: they serve after the forward
                s.phase = RequestPhase.MASKS_AFTER
                return False
        if workers:
            return True
        if s.phase is RequestPhase.READY:
            s.phase = RequestPhase.MASKS_AFTER
        return False

    def _forced_fill(self, s: RequestState, timing: MaskTiming | None, workers: bool) -> bool:
        """Whether the forced tokens alone complete the request's answer: they are then committed (no forward is
        needed); otherwise the canvas is left as it was (the first forward reads it all open). With mask workers
        and the constraint's cheap prefix hint, the hint's chain decides; else the active block's masks are
        computed, and unless every row is forced they stay in `allowed_cache` for after the forward."""
        saved = (s.canvas.clone(), s.committed.clone(), s.block, s.block_step, s.forced_tokens, s.forwards_saved)
        if workers and s.constraint.offers_prefix_hint:
            self._commit_prefix_forced(s, timing)
        else:
            positions = s.open_in_block()
            allowed = self.timed_allowed(s, s.canvas_view(self.mask_id), positions, timing)
            if not bool(single_token_rows(allowed).all()):
                s.allowed_cache = (positions, allowed)
                return False
            self._commit_forced(s, timing)
        if s.done:
            return True
        s.canvas, s.committed, s.block, s.block_step, s.forced_tokens, s.forwards_saved = saved
        s.allowed_cache = None
        return False

    def _commit_prefix_forced(self, s: RequestState, timing: MaskTiming | None) -> bool | None:
        """With mask workers: commit, before the forward, the chain of tokens the committed prefix alone forces at
        the left frontier (the constraint's cheap `prefix_hint`: no mask is computed), moving to the
        next block when one closes (a block closed this way costs no forward). Returns whether the step's masks
        go to the workers (False: the request ended), or None when the constraint offers no hint (the caller
        probes the frontier's mask instead). Safe: the canvas is completable and the prefix row is a superset of
        the frontier's mask, so a single prefix token is the frontier's only allowed token."""
        constraint = s.constraint
        if not constraint.offers_prefix_hint:
            return None
        while not s.done:
            positions = s.open_in_block()
            view = s.canvas_view(self.mask_id)
            start = time.perf_counter()
            token = constraint.prefix_hint(view, positions[0])
            if timing is not None:
                timing.add_mask(start, time.perf_counter(), probe=True)
            if token is None or (positions[0], token) in s.banned or not self.base_allows(token):
                break
            steps_left = s.budget[s.block] - s.block_step
            block_before = s.block
            s.commit([positions[0]], [token])
            s.forced_tokens += 1
            self.settle(s)
            if s.block != block_before or s.done:
                count_saved(s, steps_left)
        return not s.done

    def _frontier_forced(self, s: RequestState, timing: MaskTiming | None) -> bool:
        """Whether the mask of the active block's leftmost open position allows a single token."""
        frontier = s.open_in_block()[:1]
        row = self.timed_allowed(s, s.canvas_view(self.mask_id), frontier, timing, probe=True)
        return bool(single_token_rows(row)[0])

    def _commit_forced(self, s: RequestState, timing: MaskTiming | None = None) -> None:
        """Commit every open position of the active block whose allowed set has exactly one token: no model
        confidence needed. Committing a forced token leaves the set of valid completions (hence every other mask)
        unchanged, so the remaining rows are kept for the step's commit decision. A block closed this way moves on
        to the next one without a forward (counted in `forwards_saved`)."""
        while not s.done:
            positions = s.open_in_block()
            allowed = self.timed_allowed(s, s.canvas_view(self.mask_id), positions, timing)
            steps_left = s.budget[s.block] - s.block_step
            block_before = s.block
            if self._force_rows(s, positions, allowed):
                count_saved(s, steps_left)
            if not s.done and s.block == block_before:
                return
            s.allowed_cache = None

    def _force_rows(self, s: RequestState, positions: list[int], allowed: torch.Tensor) -> bool:
        """Commit the positions whose mask row allows a single token (counted in `forced_tokens`), settle, and
        cache the other rows for the policy (`allowed_cache`). True when the forced tokens closed the block."""
        forced = single_tokens(allowed).tolist()  # host masks: a few rows, Python lists
        rows = [r for r, t in enumerate(forced) if t >= 0]
        if not rows:
            s.allowed_cache = (positions, allowed)
            return False
        s.commit([positions[r] for r in rows], [forced[r] for r in rows])
        s.forced_tokens += len(rows)
        block_before = s.block
        self.settle(s)
        if not s.done and s.block == block_before:
            keep = [r for r, t in enumerate(forced) if t < 0]
            # a budgeted constraint may leave masks right of the left frontier empty (sound, not exact); the
            # forced commits may have made one of them the new frontier, whose mask must then be recomputed (the
            # constraint decides the frontier exactly): keep the rows only if it is not empty
            if keep:
                kept = allowed[keep]
                if bool(kept[0].any()):
                    s.allowed_cache = ([positions[r] for r in keep], kept)
        return len(rows) == len(positions)

    # ------------------------------------------------------------------ after the forward
    def after_forward(self, s: RequestState, hidden: torch.Tensor, offset: int, masks: MaskResult | None = None,
                      timing: MaskTiming | None = None) -> bool:
        """The constraint's part once the request's forward ran (`hidden[offset + p]`: position p's row): park it
        while its constraint still compiles, else take the masks computed beside the forward (or compute them now,
        for a phase that says so) and commit their forced tokens. True when the request goes on to the head pass."""
        s.nfe += 1
        if masks is not None and masks.compiling:  # its masks are computed after the forward instead
            masks = None
        if s.pending is not None and not s.pending.constraint_ready:
            # keep the rows this forward gave the block until it has compiled (their masks are computed then)
            positions = s.open_in_block()
            kept = hidden.new_zeros((positions[-1] + 1, hidden.shape[-1]))
            kept[positions] = hidden[[offset + p for p in positions]]
            s.parked_rows, s.phase = kept, RequestPhase.PARKED
            return False
        return self._ready(s, masks, timing)

    def unpark(self, s: RequestState, masks: MaskResult | None, timing: MaskTiming | None) -> torch.Tensor | None:
        """A parked request whose constraint has compiled (or failed) since: the rows it kept (position p's row is
        row p), for its first forward's commits, once its masks are taken (`masks`: computed by the workers beside
        this step's forward; without them, here). None when the masks' forced tokens ended its step."""
        if masks is not None and masks.compiling:
            masks = None
        hidden, s.parked_rows = s.parked_rows, None
        return hidden if self._ready(s, masks, timing) else None

    def _ready(self, s: RequestState, masks: MaskResult | None, timing: MaskTiming | None) -> bool:
        """Resolve a pending constraint (raising its error for this request), compute the step's masks where its
        phase puts them after the forward, and take them (`take_masks`); the request is READY from here on."""
        self.resolve_pending(s)
        if masks is None and s.phase in _MASKS_AFTER and s.constraint is not None:
            positions = s.open_in_block()
            start = time.perf_counter()
            cached, s.allowed_cache = s.allowed_cache, None
            allowed = (cached[1] if cached is not None and cached[0] == positions
                       else self.timed_allowed(s, s.canvas_view(self.mask_id), positions, timing))
            masks = MaskResult(positions, allowed, None, start, time.perf_counter())
        s.phase = RequestPhase.READY
        return masks is None or not self.take_masks(s, masks)

    def take_masks(self, s: RequestState, masks: MaskResult) -> bool:
        """This step's masks computed beside (or after) the forward, on the canvas the forward saw: re-raise the
        job's failure (a typed one ends this request only), else commit their forced tokens now, after the
        forward (forced_tokens on), and keep the other rows for the policy. True when the forced tokens closed
        the block or ended the request: the step is then over for it (docs/engine.md, "Forced tokens")."""
        if masks.error is not None:
            raise masks.error
        positions = s.open_in_block()
        if masks.positions != positions or masks.allowed is None:  # not the canvas the job saw: recompute later
            return False
        if not s.params.forced_tokens:
            s.allowed_cache = (positions, masks.allowed)
            return False
        block_before = s.block
        self._force_rows(s, positions, masks.allowed)
        if s.done or s.block != block_before:
            s.allowed_cache = None
            return True
        return False

    def head_masks(self, s: RequestState, timing: MaskTiming | None) -> tuple[list[int], torch.Tensor]:
        """The open positions of the active block and their allowed-token bitmask, for the head pass (the rows
        kept from this step's masks, or computed now)."""
        positions = s.open_in_block()
        cached, s.allowed_cache = s.allowed_cache, None
        if cached is not None and cached[0] == positions:
            return positions, cached[1]
        if not positions:
            return positions, self.base_bitmask.new_empty((0, self.base_bitmask.shape[0]))
        return positions, self.timed_allowed(s, s.canvas_view(self.mask_id), positions, timing)

    @staticmethod
    def wait_parked(running: list[RequestState]) -> None:
        """No request can take a forward: wait a little for a parked one's compilation (the caller steps again)."""
        futures = [s.pending.constraint.future for s in running
                   if s.phase is RequestPhase.PARKED and s.pending is not None]
        if futures:
            with loop_activity.waiting():
                wait_futures(futures, timeout=0.02, return_when=FIRST_COMPLETED)

    # ------------------------------------------------------------------ commits
    def verify(self, s: RequestState, view: list[int], proposals: list[tuple[int, int, float]]
               ) -> list[tuple[int, int]]:
        """The proposals the constraint accepts jointly (all of them without a constraint; the best one alone
        when it accepts none: each was allowed alone); the rejected ones are counted as remasks."""
        accepted = [(p, t) for p, t, _ in proposals]
        if s.constraint is not None:
            accepted = [(int(p), int(t)) for p, t in s.constraint.select_commits(view, proposals)]
            if not accepted:
                accepted = [proposals[0][:2]]
            s.remasks += len(proposals) - len(accepted)
        return accepted

    def completable(self, s: RequestState) -> bool:
        """Whether some output the constraint accepts still completes the canvas (always, without one)."""
        return s.constraint is None or s.constraint.is_completable(s.canvas_view(self.mask_id))

    def settle(self, s: RequestState) -> None:
        """Stop if the answer has ended (fill the tail with EOS); otherwise move past completed blocks."""
        eos = self.special.eos_id
        while not s.done:
            first = self._answer_end(s)  # EOS or a stop id (the answer ends there; the tail becomes EOS)
            if first is not None and bool(s.committed[:first].all()):
                s.canvas[first:] = eos
                s.committed[first:] = True
                s.finish("eos")
                return
            if bool(s.committed.all()):
                s.finish("length")
                return
            if s.open_in_block():
                return
            s.block += 1
            s.block_step = 0
            s.schedule_step = 0

    def _answer_end(self, s: RequestState) -> int | None:
        """The first committed EOS or stop id that ends the answer. Under a constraint a stop id other than EOS ends
        it only where the constraint accepts the text before it as a whole output; elsewhere it is content (a stop
        id the constraint allows mid-answer must not cut the answer into an invalid one)."""
        eos = self.special.eos_id
        for p in s.stop_positions(eos):
            if s.constraint is None or int(s.canvas[p]) == eos:
                return p
            ended = s.canvas_view(self.mask_id)[:p] + [eos] * (s.canvas_len - p)
            if s.constraint.is_completable(ended):
                return p
        return None


def check_step_bound(s: RequestState) -> None:
    """End a request past its step bound (4 canvas lengths + 64) or its timeout with GenerationTimeoutError."""
    bound = 4 * s.canvas_len + 64
    if s.step >= bound:
        raise GenerationTimeoutError(
            f"request {s.index} did not finish within {bound} steps (canvas of {s.canvas_len} tokens)")
    timeout = s.params.timeout
    if timeout is not None and time.perf_counter() - s.start_time > timeout:
        raise GenerationTimeoutError(f"request {s.index} did not finish within its timeout of {timeout} s")


def count_saved(s: RequestState, steps_left: int) -> None:
    """A block closed by forced tokens without a forward: the rest of its step budget is saved (1 forward for a
    policy that does not spend the budget)."""
    s.forwards_saved += max(1, steps_left) if POLICIES[s.params.policy].spends_step_budget else 1


def base_allowed(special: SpecialTokens, vocab_size: int, tokenizer: Any) -> torch.Tensor:
    """Tokens any canvas position may take: never MASK, nor BOS/PAD (when distinct from EOS), nor the padded
    embedding rows past the tokenizer's vocabulary."""
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    sp = special
    for tok in (sp.mask_id, sp.bos_id, sp.pad_id):
        if tok is not None and tok != sp.eos_id and 0 <= tok < vocab_size:
            allowed[tok] = False
    tok_vocab = None
    if tokenizer is not None:
        tok_vocab = getattr(tokenizer, "vocab_size", None)
        if callable(getattr(tokenizer, "get_vocab_size", None)):
            tok_vocab = tokenizer.get_vocab_size()
    if isinstance(tok_vocab, int) and 0 < tok_vocab < vocab_size:
        allowed[tok_vocab:] = False
    return allowed
