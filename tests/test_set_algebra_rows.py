"""The mask-row cache of a compiled constraint holds rows by a byte budget (`ROW_CACHE_BYTES`), not a fixed count:
many requests of one schema each find their rows again instead of evicting each other's."""
from __future__ import annotations

from constraint_support import tiny_info

from dllm_constrain.constraints import ConstraintCompiler, clear_cache, set_algebra
from dllm_constrain.constraints.set_algebra import START_BIT


def _fill_rows(n_rows: int):
    """A fresh compiled constraint whose algebra has been asked n_rows distinct rows (one per reachable depth)."""
    clear_cache()  # a compiled constraint (and its algebra) built under the current budget
    info = tiny_info([b"0", b"1", b"a"])  # 5 tokens with EOS and mask: one byte per packed row
    alg = ConstraintCompiler(info).compile_regex("[01]{1,150}").algebra
    F = START_BIT
    for _ in range(n_rows):
        after = alg.step_open(F)
        alg.row(F, after, info.vocab_size)
        F = after
    return alg


def test_the_row_cache_keeps_more_rows_than_the_former_fixed_count_when_they_fit_its_bytes() -> None:
    alg = _fill_rows(100)
    assert len(alg.rows) == 100  # a fixed 64-row cache kept 64


def test_the_row_cache_is_bounded_by_its_byte_budget(monkeypatch) -> None:
    monkeypatch.setattr(set_algebra, "ROW_CACHE_BYTES", 80)  # 80 one-byte rows
    alg = _fill_rows(100)
    assert alg.max_rows == 80 and len(alg.rows) == 80


def test_a_state_that_allows_no_token_is_known_with_no_successor() -> None:
    # after "ab" nothing but EOS may follow: the state's transitions are computed (none), so sets holding it are
    # exact; left unknown, every backward step over such a set was cut and sent the frontier to its exact fallback
    from dllm_constrain.constraints.set_algebra import Budget

    clear_cache()
    info = tiny_info([b"a", b"b"])
    cc = ConstraintCompiler(info).compile_regex("ab")
    alg = cc.algebra
    after_a = alg.step_open(START_BIT)
    end = alg.step_open(after_a)
    [q] = [x for x in alg.members(end) if x != 0]
    assert alg.ta.trans(q).n_allowed == 0 and alg.ta.succ_bits[q] == 0
    budget = Budget(0, known=end)  # explored by the request: its (empty) transitions are followed
    alg.back_open(end, alg.step_open(end), budget)
    assert budget.cuts == 0
