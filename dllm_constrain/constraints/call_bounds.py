"""The bounds of a canvas call: the last-resort time limit, and the work allowances that decide its answers.

The allowances are counted in token-steps (a state times the vocabulary size), so one costs about the same time at
4K and at 128K tokens; `work_states` gives the states an allowance allows at a vocabulary size. Answers depend on
these counts only, never on the clock (docs/constraints.md, "Reproducibility" and "Time bounds").
"""
from __future__ import annotations

# Per-call time limit (seconds) of every canvas call of a request (allowed_tokens, select_commits,
# is_completable, forced_tokens) and of min_tokens / the fit check of new_canvas_state: the last resort. The answers
# are bounded by work (the allowances below), never by this limit: a call that reaches it raises
# ConstraintTimeoutError and its request ends (the work it finished stays cached in the shared automaton). 2 s: the
# exact decisions a call may need (the left frontier's witness search, select_commits' exact fallback) walk the
# token trie of every new state they meet, about 1 ms each at 128K tokens, and a loaded machine takes several times
# longer; 0.5 s (when the limit cut answers instead of ending requests) ended about one JSONSchemaBench walk in
# three on the shared 2-core machine (docs/measurements.md).
DEFAULT_CALL_TIMEOUT_S = 2.0
# New states a mask call may add to its request's explored set: 128 at 4K tokens, 4 at 128K (a new state's
# transitions are one walk of the token trie).
EXPAND_WORK = 128 * 4096
# States of backward sets (summed over the rows) up to which a mask call computes rows other than the left
# frontier's: 4096 at 4K tokens, 128 at 128K. Past it, the open positions left keep an empty row this call (sound: no
# token is offered there this step).
ROW_WORK = 4096 * 4096
# States one can-finish question of the left frontier's search may expand (SetAlgebra.finish_bounded): 256 at 4K
# tokens, 8 at 128K. Without any bound, refuting the states of a nearly closed canvas walked the transitions of 14,000 states (9 s at 128K tokens) in one call.
FINISH_WORK = 256 * 4096
# States the left frontier's search may expand in one mask call between the frontier and the last committed position
# (each before an open position: its token transitions are a trie walk; before a committed one a token step is not
# counted) and in its can-finish questions right of it (the states their breadth-first searches expand, memoised or
# not): 2048 at 4K tokens, 64 at 128K. Its questions (does this successor of the frontier's state complete the
# canvas?) are taken in a canonical order (SetAlgebra.succ_canonical), so what the allowance decides is the same with
# a cold or a warm automaton; a question left undecided is left out (sound) and a row left empty gets the first witness
# in the same order, unbounded. Unbounded, refuting the successors that committed tokens further right exclude walked
# 13,000-15,000 new states (2 s, the call limit, at 128K tokens) in one call; 32 states at 128K (1024 x 4096) left
# one JSONSchemaBench walk of 36 without its instance's token at 20 retries (docs/measurements.md).
FRONTIER_WORK = 2048 * 4096
# A mask call on the canvas of the previous one, whose frontier search the allowance cut, doubles that search's
# allowance, up to this factor: asked again, the row gets more complete (the proofs found before are memoised too)
FRONTIER_RETRY_MAX = 8
# expand_budget's default: EXPAND_WORK at the constraint's vocabulary size
AUTO = -1

# States a request's explored set may hold (set_algebra.Budget.known): past it, calls add no state ahead of what their
# own answer needs (the left frontier's search, the spine, verified commits), and masks come from the explored states
# (sound subsets; the left frontier's row is never empty while a completion exists). Per request, so that it does not
# depend on what other requests explored (the automaton-wide memory bound, set_algebra.EXPLORE_MAX_BYTES, only decides
# when the compile cache compiles the constraint afresh: CompiledConstraint.worn_out).
EXPLORE_MAX_STATES = 8192
# States of the frontier's forward set up to which the prefix hint (CanvasState.prefix_hint) computes their transitions
# (a few trie walks; past it only the request's explored states answer)
HINT_STATES = 8


def work_states(work: int, vocab_size: int, least: int) -> int:
    """The states a token-step allowance `work` gives at `vocab_size` tokens (at least `least`)."""
    return max(least, work // max(1, vocab_size))
