"""The term algebra behind the derivative DFA: normal forms are what make equal languages share one term, and the
memo tables are what keep a derivative from redoing the work of an earlier one."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.constraints.deriv_terms import SEQ_K, T_EMPTY, T_NOTHING, Terms


def _chain(terms: Terms, n: int) -> int:
    """A right-nested sequence of n distinct single-byte-range items (no literal merging): a[0] (a[1] (...))."""
    return terms.seq_list([terms.bytes_(((65 + i, 65 + i), (97 + i, 97 + i))) for i in range(n)])


def _items(terms: Terms, t: int) -> list[int]:
    out = []
    while terms.kind[t] == SEQ_K:
        out.append(terms.a[t])
        t = terms.b[t]
    return out + [t]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(1, 12))
def test_a_sequence_head_is_re_nested_to_the_right_nested_normal_form(n: int, m: int) -> None:
    """seq(chain1, chain2) is the chain of both item lists, whatever the nesting it was built from."""
    terms = Terms()
    a, b = _chain(terms, n), terms.seq_list([terms.bytes_(((48 + i, 48 + i),)) for i in range(m)])
    joined = terms.seq(a, b)
    assert _items(terms, joined) == _items(terms, a) + _items(terms, b)
    assert joined == terms.seq_list(_items(terms, a) + _items(terms, b))
    assert terms.seq(a, T_EMPTY) == a and terms.seq(T_EMPTY, b) == b and terms.seq(a, T_NOTHING) == T_NOTHING


def test_re_nesting_the_same_head_under_the_same_tail_walks_its_chain_once() -> None:
    """Derivatives of a repeated sequence rebuild the same (chain, tail) pairs: the second time is one lookup."""
    terms = Terms()
    head, tail = _chain(terms, 40), terms.lit(b"xyz")
    calls = {"n": 0}
    seq = Terms.seq

    def counted(self: Terms, h: int, t: int) -> int:
        calls["n"] += 1
        return seq(self, h, t)

    terms.seq = counted.__get__(terms)  # the instance's recursive calls go through the counter too
    first = terms.seq(head, tail)
    walked = calls["n"]
    calls["n"] = 0
    assert terms.seq(head, tail) == first
    assert walked >= 40 and calls["n"] == 1


def _wide_alternation(n: int):
    from dllm_constrain.constraints import regex_ast as A

    return A.Alt(tuple(A.Seq((A.Lit(f"k{i}".encode()), A.Lit(b":"), A.Lit(f"{i}".encode()))) for i in range(n)))


def test_converting_a_big_ast_checks_the_compilation_deadline() -> None:
    """Thousands of AST nodes take tens of milliseconds to convert: the compilation's time limit holds inside."""
    import pytest

    from dllm_constrain.constraints.deadline import Deadline
    from dllm_constrain.constraints.deriv_terms import AST_CHECK_EVERY
    from dllm_constrain.constraints.native_terms import new_terms
    from dllm_constrain.errors import CompilationTimeoutError

    expired = Deadline(0.0)
    with pytest.raises(CompilationTimeoutError):
        new_terms(expired).from_ast(_wide_alternation(AST_CHECK_EVERY))
    assert new_terms(expired).from_ast(_wide_alternation(2)) != T_NOTHING  # a few nodes: no check falls due


def test_a_compilation_pauses_while_it_converts_a_big_ast() -> None:
    """The conversion's checks are where a compilation beside the request loop pauses (deadline.pausing)."""
    from dllm_constrain.constraints.deadline import Deadline, pausing
    from dllm_constrain.constraints.deriv_terms import AST_CHECK_EVERY
    from dllm_constrain.constraints.native_terms import new_terms

    pauses: list[int] = []
    with pausing(lambda: pauses.append(1) or 0.0):
        new_terms(Deadline(None)).from_ast(_wide_alternation(4 * AST_CHECK_EVERY))
    assert len(pauses) >= 4
