"""The native core of the token-trie walk (dllm_constrain.constraints._native, built by the package's build):
it agrees with the numpy walker, releases the GIL while it works, expands lazy DFA rows through the DFA's own
expand(), refuses malformed input with typed errors, and steps aside under DLLM_CONSTRAIN_NO_C=1."""
from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo, _cwalk
from dllm_constrain.constraints.token_automaton import TokenAutomaton

from constraint_support import LazyTableDFA, grouping_thresholds, needs_native, table_automaton, trans_fields

try:
    from dllm_constrain.constraints import _native
except ImportError:  # built without a C compiler: only the fallback tests apply
    _native = None

@st.composite
def vocabularies(draw) -> list[bytes | None]:
    """Token byte strings over a small alphabet (shared prefixes, duplicates), with a few ids spelling nothing."""
    alphabet = draw(st.sampled_from([b"ab", b"abc\xc3", b"a0-.\xe0\x80\xff"]))
    word = st.lists(st.sampled_from(list(alphabet)), min_size=1, max_size=6).map(bytes)
    toks: list[bytes | None] = draw(st.lists(st.one_of(word, st.none()), min_size=1, max_size=120))
    return toks + [None, None]  # EOS, mask


@st.composite
def byte_tables(draw, max_states: int = 12) -> np.ndarray:
    """A complete transition table: each state maps byte ranges to random states, DEAD (0) often."""
    n = draw(st.integers(2, max_states))
    full = np.zeros((n, 256), dtype=np.int32)
    for s in range(1, n):
        cuts = sorted(set(draw(st.lists(st.integers(1, 255), max_size=6))) | {0, 256})
        for lo, hi in zip(cuts, cuts[1:]):
            full[s, lo:hi] = draw(st.one_of(st.just(0), st.integers(0, n - 1)))
    return full




def pairs(tok: np.ndarray, tgt: np.ndarray) -> list[tuple[int, int]]:
    return sorted(zip(tok.tolist(), tgt.tolist()))


@needs_native
@settings(max_examples=150, deadline=None)
@given(byte_tables(), vocabularies(), st.integers(0, 3))
def test_native_walk_equals_the_numpy_walk_from_every_state(full, toks, replace_every):
    native = table_automaton(full, toks, use_c=True, replace_every=replace_every)
    fallback = table_automaton(full, toks, use_c=False)
    assert native._cwalker is not None and fallback._cwalker is None
    for s in range(1, full.shape[0]):
        assert pairs(*native.walk_tokens(s)) == pairs(*fallback._walk_tokens_numpy(s))


@needs_native
@settings(max_examples=60, deadline=None)
@given(byte_tables(), vocabularies())
def test_native_walk_expands_only_the_states_the_walk_reaches(full, toks):
    # a row is computed when a live trie node needs it, never for a state the walk does not reach
    ta = table_automaton(full, toks, use_c=True)
    ta.walk_tokens(1)
    lazy = table_automaton(full, toks, use_c=False)
    lazy._walk_tokens_numpy(1)
    assert set(np.flatnonzero(ta.dfa.expanded)) - {1} == set(np.flatnonzero(lazy.dfa.expanded)) - {1}


@needs_native
def test_compiled_regex_masks_are_the_same_with_and_without_the_native_core():
    toks = [b"a", b"ab", b"abc", b"b", b"c", b"{", b'"', b"1", b"11", b"}", b"a", None, None]
    info = TokenizerInfo(toks, eos_id=11, mask_id=12)
    masks = []
    for use_c in (True, False):
        cc = ConstraintCompiler(info, cache=False).compile_regex(r'(ab|c)*\{"1+"\}')
        cc.ta._cwalker = cc.ta._cwalker if use_c else None
        exact = cc.new_canvas_state(8, expand_budget=None, timeout_s=None)  # no budget, no time limit: every row
        masks.append(exact.allowed_tokens([12] * 8, list(range(8))))
    assert (masks[0] == masks[1]).all()


@needs_native
@settings(max_examples=150, deadline=None)
@given(byte_tables(), vocabularies(), st.integers(0, 40), st.integers(0, 40))
def test_native_grouping_gives_the_numpy_transitions_from_every_state(full, toks, dense_min, small):
    with grouping_thresholds(dense_min, small):
        native = table_automaton(full, toks, use_c=True)
        fallback = table_automaton(full, toks, use_c=False)
        assert native._cwalker.groups
        for s in range(1, full.shape[0]):
            assert trans_fields(native, s) == trans_fields(fallback, s)


@needs_native
@settings(max_examples=150, deadline=None)
@given(byte_tables(), vocabularies(), st.integers(0, 40), st.integers(0, 40), st.data())
def test_rows_between_state_sets_built_in_c_equal_the_python_rows(full, toks, dense_min, small, data):
    # random sets (bit 0 = ENDED), some states' transitions not computed yet, random accepting states
    from dllm_constrain.constraints.set_algebra import SetAlgebra

    with grouping_thresholds(dense_min, small):
        ta = table_automaton(full, toks, use_c=True)
        n = full.shape[0]
        ta.dfa.accepting[:n] = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
        for q in data.draw(st.lists(st.integers(1, n - 1), max_size=n)):
            ta.trans(q)
        alg = SetAlgebra(ta)
        sets = st.integers(0, 2 ** n - 1)
        for _ in range(5):
            Bi, Bn = data.draw(sets), data.draw(sets)
            row, unknown = ta.set_row(Bi, Bn)
            f, p, eos_ok, partial = alg._split_step(Bi, Bn)
            assert (row.tobytes(), unknown) == (ta.packed_row(f, p, eos_ok, alg.members).tobytes(), partial)


def twin_algebras(full: np.ndarray, toks: list[bytes | None], prepare, python_path) -> list:
    """Two SetAlgebras over identical automata (`prepare(ta)` applied to each): the first with its native paths, the
    second switched to the Python loops by `python_path(alg)`."""
    from dllm_constrain.constraints.set_algebra import SetAlgebra

    algebras = []
    for native in (True, False):
        ta = table_automaton(full, toks, use_c=True)
        prepare(ta)
        alg = SetAlgebra(ta)
        if not native:
            python_path(alg)
        algebras.append(alg)
    return algebras


@needs_native
@settings(max_examples=150, deadline=None)
@given(byte_tables(), vocabularies(), st.data())
def test_open_steps_of_state_sets_in_c_equal_the_python_loops(full, toks, data):
    # forward (step_open) and backward (back_open) over an open position, from random sets with some states'
    # transitions unknown and random accepting states: the C first visit and the Python loop agree on the result
    # and on the members they leave for later (a budget of 0 new transitions keeps the unknown ones unknown)
    from dllm_constrain.constraints.set_algebra import Budget

    n = full.shape[0]
    accepting = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    known = data.draw(st.lists(st.integers(1, n - 1), max_size=n))

    def prepare(ta):
        ta.dfa.accepting[:n] = accepting
        for q in known:
            ta.trans(q)

    algebras = twin_algebras(full, toks, prepare, lambda alg: setattr(alg.ta, "row_store", None))
    assert algebras[0].ta.row_store is not None
    sets = st.integers(0, 2 ** n - 1)
    for _ in range(5):
        F, X = data.draw(sets), data.draw(sets)
        results = [(alg.step_open(F, Budget(0)), alg._open_part.get(F), alg.back_open(F, X, Budget(0)),
                    alg._back_part.get((F, X))) for alg in algebras]
        assert results[0] == results[1]


def byte_distances(full: np.ndarray, accepting: list[bool]) -> np.ndarray:
    """Bytes from each state to an accepting one over the complete table (INF where none is reachable)."""
    from dllm_constrain.constraints.bounds import INF

    n = full.shape[0]
    dist = np.full(n, INF, dtype=np.int64)
    for s in range(1, n):
        if accepting[s]:
            dist[s] = 0
    for _ in range(n):
        for s in range(1, n):
            succ = dist[full[s][full[s] != 0]]
            if succ.size:
                dist[s] = min(dist[s], int(succ.min()) + 1)
    return dist


@needs_native
@settings(max_examples=150, deadline=None)
@given(byte_tables(), vocabularies(), st.data())
def test_finishing_members_decided_in_c_equal_the_python_loop(full, toks, data):
    # which members of random sets can finish within m positions: the C first visit (table lookups and the
    # thresholds earlier searches left) and the Python loop over every member give the same sets, call after call
    n = full.shape[0]
    accepting = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    accepting[0] = False
    dist = byte_distances(full, accepting)

    def prepare(ta):
        ta.dfa.accepting[:n] = accepting
        ta.dfa.dist[:n] = dist

    algebras = twin_algebras(full, toks, prepare, lambda alg: setattr(alg, "_finish_split", None))
    assert algebras[0]._finish_split is not None
    for _ in range(8):
        F, m = data.draw(st.integers(0, 2 ** n - 1)), data.draw(st.integers(-1, 6))
        assert algebras[0].finishers(F, m) == algebras[1].finishers(F, m)


@needs_native
@settings(max_examples=150, deadline=None)
@given(byte_tables(), vocabularies(), st.data())
def test_committed_token_backward_steps_in_c_equal_the_python_loop(full, toks, data):
    # {q in F : token t takes q into X} from random sets, some DFA rows expanded and some not: the C walk over the
    # expanded rows (the Python walk finishing the members it leaves) and the Python walk over every member agree
    n = full.shape[0]
    expanded = data.draw(st.lists(st.integers(1, n - 1), max_size=n))

    def prepare(ta):
        for q in expanded:
            ta.dfa.expand(q)

    algebras = twin_algebras(full, toks, prepare, lambda alg: setattr(alg, "_back_tok_walk", None))
    assert algebras[0]._back_tok_walk is not None
    for _ in range(8):
        F, X = data.draw(st.integers(0, 2 ** n - 1)), data.draw(st.integers(0, 2 ** n - 1))
        t = data.draw(st.integers(0, len(toks) - 1))
        assert algebras[0].back_tok(F, t, X) == algebras[1].back_tok(F, t, X)


@needs_native
def test_finish_split_reads_thresholds_and_treats_states_past_the_arrays_as_unknown():
    # states 1..4 in f; 1 accepting; 2 known to finish within 2; 3 known not to within 5; 4 past the threshold arrays
    f = bytes([0b11110])
    dist = np.array([0, 0, 3, 3, 3], dtype=np.int64)
    acc = np.array([0, 1, 0, 0, 0], dtype=bool)
    ft = np.array([9, 9, 2], dtype=np.int32)
    ff = np.array([-1, -1, -1, 5], dtype=np.int32)
    fin, todo = _native.finish_split(f, 3, dist, acc, ft, ff, False, 4)
    assert fin == bytes([0b00110]) and todo == [4]
    fin, todo = _native.finish_split(f, 1, dist, acc, ft, ff, False, 4)  # below 2's threshold: searched again
    assert fin == bytes([0b00010]) and todo == [2, 4]
    fin, todo = _native.finish_split(f, 5, dist, acc, ft, ff, False, 4)  # at 3's largest known failure
    assert fin == bytes([0b00110]) and todo == [4]
    fin, todo = _native.finish_split(f, 6, dist, acc, ft, ff, False, 4)  # above it
    assert fin == bytes([0b00110]) and todo == [3, 4]
    fin, todo = _native.finish_split(f, 3, dist, acc, ft, ff, False, 2)  # 3 bytes need 2 tokens of at most 2 bytes
    assert fin == bytes([0b00110]) and todo == [4]
    fin, todo = _native.finish_split(f, 1, dist, acc, ft, ff, False, 2)  # ... so 1 position is too few
    assert fin == bytes([0b00010]) and todo == []
    fin, todo = _native.finish_split(f, 0, dist, acc, ft, ff, False, 4)  # no position left: only acceptance
    assert fin == bytes([0b00010]) and todo == []
    fin, todo = _native.finish_split(f, 3, dist, acc, ft, ff, True, 4)  # every byte a token: 3 bytes in 3 tokens
    assert fin == bytes([0b11110]) and todo == []


@needs_native
def test_the_row_store_refuses_malformed_input():
    store = _native.RowStore(8)
    assert store.add_row(bytes(8)) == 0
    with pytest.raises(ValueError, match="8 bytes"):
        store.add_row(bytes(16))
    with pytest.raises(ValueError, match="not an added row"):
        store.add_state(1, [(2, 5, b"")], -1, None)
    with pytest.raises(ValueError, match="outside"):
        store.add_state(1, [(2, -1, np.array([64], dtype=np.int64))], -1, None)
    store.add_state(1, [(2, -1, np.array([3], dtype=np.int64))], -1, np.array([3], dtype=np.int64))
    with pytest.raises(ValueError, match="added before"):
        store.add_state(1, [], -1, None)
    with pytest.raises(ValueError, match="positive multiple of 8"):
        _native.RowStore(12)
    row, unknown = store.row(b"\x06", b"\x04", bytes(3), 0)  # states 1 (known) and 2 (not) into {2}
    assert row == bytes([8]) + bytes(7) and unknown


def reference_grouping(tok: np.ndarray, tgt: np.ndarray, nbytes: int, dense_min: int, small: int):
    def packed(ids):
        bits = np.zeros(nbytes * 8, dtype=bool)
        bits[ids] = True
        return np.packbits(bits, bitorder="little").tobytes()

    groups = []
    for u in sorted(set(tgt.tolist())):
        ids = np.sort(tok[tgt == u]).astype(np.int64)
        groups.append((u, True, packed(ids)) if ids.size > dense_min else (u, False, ids.tobytes()))
    return (groups, packed(tok) if tok.size > small else None,
            np.sort(tok).astype(np.int64).tobytes() if tok.size <= dense_min else None)


@needs_native
@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.data())
def test_group_by_target_equals_its_numpy_reference(nbytes, data):
    # up to every id of the vocabulary: the dense path (a pass over the vocabulary) and the sparse one (sorts)
    V = nbytes * 8
    n = data.draw(st.integers(0, V))
    tok = np.array(data.draw(st.permutations(range(V)))[:n], dtype=np.int32)
    tgt = np.array(data.draw(st.lists(st.integers(1, 6), min_size=n, max_size=n)), dtype=np.int32)
    dense_min, small = data.draw(st.integers(0, 60)), data.draw(st.integers(0, 60))
    assert _native.group_by_target(tok, tgt, nbytes, dense_min, small) == reference_grouping(
        tok, tgt, nbytes, dense_min, small)


@needs_native
@pytest.mark.parametrize("tok, tgt, nbytes, match", [
    ([1, 2], [1], 1, "differ in length"),
    ([8], [1], 1, "outside"),
    ([-1], [1], 1, "outside"),
    ([1], [0], 1, "not a live state"),
    ([3, 3, 1, 2], [1, 1, 1, 1], 1, "twice"),
])
def test_group_by_target_refuses_malformed_input(tok, tgt, nbytes, match):
    with pytest.raises(ValueError, match=match):
        _native.group_by_target(np.array(tok, dtype=np.int32), np.array(tgt, dtype=np.int32), nbytes, 4, 4)


@needs_native
def test_group_by_target_refuses_other_item_types():
    with pytest.raises(TypeError):
        _native.group_by_target(np.array([1], dtype=np.int64), np.array([1], dtype=np.int32), 1, 4, 4)


def chain_walk(n: int):
    """A trie that is one path of n - 1 nodes, each a token, and a DFA whose state 1 loops on every byte: a walk
    from 1 visits every node (the longest walk a trie of n nodes has)."""
    idx = np.arange(n, dtype=np.int32)
    trie = _native.Trie(np.maximum(idx - 1, 0), np.full(n, 97, dtype=np.uint8), n - idx, idx - 1)
    dfa = LazyTableDFA(np.ones((2, 256), dtype=np.int32))
    dfa.expand(1)
    scratch = (np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32))
    return trie, dfa, scratch


@needs_native
def test_a_long_native_walk_lets_other_python_threads_run():
    # With a long switch interval a thread holding the GIL is never preempted between two bytecodes taken a few
    # microseconds apart: a counter thread can advance between them only if the call in between released the GIL.
    # a walk of ~10 ms: long enough for the OS to run the counter thread beside it even when the test is pinned
    # to one core (a 3 ms walk there sometimes ended before the scheduler switched)
    trie, dfa, (st_, out_tok, out_tgt) = chain_walk(4_000_000)
    count = [0]
    stop = threading.Event()

    def counter() -> None:
        while not stop.is_set():
            count[0] += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.05)
    th = threading.Thread(target=counter)
    th.start()
    try:
        advanced = []
        for _ in range(50):
            time.sleep(0.001)  # hand the GIL over, then take it back fresh (the counter thread waits again)
            c0 = count[0]
            n = trie.walk(dfa, 1, st_, out_tok, out_tgt)
            advanced.append(count[0] - c0)
            assert n == 3_999_999
            if advanced[-1] > 0:
                break
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(old)
    assert advanced[-1] > 0, f"the counter thread never ran during a native walk: {advanced}"


@needs_native
def test_threads_walking_one_shared_trie_at_once_get_the_sequential_results():
    rng = np.random.default_rng(0)
    toks = list({bytes(rng.choice(list(b"abc\xc3"), size=rng.integers(1, 7)).tolist()) for _ in range(3000)})
    toks += [None, None]
    full = np.zeros((6, 256), dtype=np.int32)
    for s in range(1, 6):
        full[s, [97, 98, 99, 0xC3]] = rng.integers(0, 6, size=4)
    want = {s: pairs(*table_automaton(full, toks, use_c=False)._walk_tokens_numpy(s)) for s in range(1, 6)}
    got: dict[tuple[int, int], list] = {}

    def worker(k: int) -> None:
        ta = table_automaton(full, toks, use_c=True)  # own DFA and scratch; the native trie is the tokenizer's
        for _ in range(20):
            for s in range(1, 6):
                got[(k, s)] = pairs(*ta._cwalker.walk(ta.dfa, s))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(got[(k, s)] == want[s] for k in range(4) for s in range(1, 6))


@needs_native
def test_an_exception_of_expand_propagates_out_of_the_walk():
    class Expired(Exception):
        pass

    class ExpiringDFA(LazyTableDFA):
        def expand(self, s: int) -> None:
            if s == 2:
                raise Expired(s)
            super().expand(s)

    full = np.zeros((3, 256), dtype=np.int32)
    full[1, 97], full[2, 97] = 2, 2
    ta = TokenAutomaton(ExpiringDFA(full), TokenizerInfo([b"a", b"aa", None, None], eos_id=2, mask_id=3))
    with pytest.raises(Expired):
        ta.walk_tokens(1)
    assert not ta.dfa.expanded[2]


@needs_native
def test_an_expand_that_computes_no_row_is_an_error_not_an_endless_walk():
    class Forgetful(LazyTableDFA):
        def expand(self, s: int) -> None:
            pass

    trie, _, (st_, out_tok, out_tgt) = chain_walk(8)
    with pytest.raises(RuntimeError, match="did not compute the row"):
        trie.walk(Forgetful(np.ones((2, 256), dtype=np.int32)), 1, st_, out_tok, out_tgt)


@needs_native
def test_a_malformed_trie_is_refused():
    idx = np.arange(5, dtype=np.int32)
    ok = dict(parent=np.maximum(idx - 1, 0), byte=np.zeros(5, dtype=np.uint8), size=5 - idx, node_tok=idx - 1)
    _native.Trie(**ok)
    with pytest.raises(ValueError, match="preorder"):
        _native.Trie(**{**ok, "parent": np.array([0, 0, 3, 2, 3], dtype=np.int32)})  # a parent after its child
    with pytest.raises(ValueError, match="preorder"):
        _native.Trie(**{**ok, "size": np.array([5, 4, 3, 2, 2], dtype=np.int32)})  # a subtree past the end
    with pytest.raises(TypeError, match="int32"):
        _native.Trie(**{**ok, "parent": ok["parent"].astype(np.int64)})
    with pytest.raises(TypeError, match="int32"):
        _native.Trie(**{**ok, "size": ok["size"].astype(np.float32)})


@needs_native
def test_walk_arguments_of_the_wrong_type_or_size_are_refused():
    trie, dfa, (st_, out_tok, out_tgt) = chain_walk(8)
    with pytest.raises(TypeError, match="writable"):
        trie.walk(dfa, 1, bytes(32), out_tok, out_tgt)
    with pytest.raises(ValueError, match="st: need 8"):
        trie.walk(dfa, 1, st_[:4], out_tok, out_tgt)
    with pytest.raises(ValueError, match="not a live DFA state"):
        trie.walk(dfa, 0, st_, out_tok, out_tgt)
    with pytest.raises(ValueError, match="not a live DFA state"):
        trie.walk(dfa, 5, st_, out_tok, out_tgt)  # past the tables
    dfa.T[1, 97] = -3
    with pytest.raises(ValueError, match="not a state id"):
        trie.walk(dfa, 1, st_, out_tok, out_tgt)
    dfa.T[1, 97] = 1
    dfa.T = dfa.T.astype(np.int64)
    with pytest.raises(TypeError, match="dfa.T"):
        trie.walk(dfa, 1, st_, out_tok, out_tgt)


def test_no_c_environment_variable_selects_the_numpy_walker(monkeypatch):
    monkeypatch.setenv(_cwalk.NO_C_ENV, "1")
    assert _cwalk.load() is None
    full = np.zeros((3, 256), dtype=np.int32)
    full[1, 97], full[2, 98] = 2, 1
    ta = table_automaton(full, [b"a", b"ab", b"b", None, None], use_c=True)
    assert ta._cwalker is None
    assert pairs(*ta.walk_tokens(1)) == [(0, 2), (1, 1)]


@needs_native
def test_without_the_environment_variable_the_native_core_is_used(monkeypatch):
    monkeypatch.delenv(_cwalk.NO_C_ENV, raising=False)
    assert _cwalk.load() is _native
    ta = table_automaton(np.zeros((2, 256), dtype=np.int32), [b"a", None, None], use_c=True)
    assert ta._cwalker is not None and ta._cwalker.core is ta.tok.preorder_trie().native(_native)
