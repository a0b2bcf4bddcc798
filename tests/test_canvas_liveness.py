"""Liveness of the canvas masks on real schemas: a valid instance that is in the compiled language, committed
into a canvas in random orders, keeps its own token allowed where the protocol promises it.

What `canvas.py` promises (see its docstring and docs/constraints.md):
  * the left frontier (the first open position) has an exact mask: every token of every valid completion
    of the canvas is allowed there, so the instance's own token always is;
  * every other open position's mask is sound (a subset of the exact one); under the per-call expansion
    budget it may miss tokens (even be empty), and with `expand_budget=None` it is exact;
  * select_commits keeps a non-empty subset of proposals that were each allowed alone.

The walk (`liveness_walk`) is the one of benchmarks/bench_masks.py (semi-autoregressive blocks, a few
random commits per step through select_commits) with those checks made at every step instead of retrying.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

import torch

from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo, clear_cache
from dllm_constrain.errors import ConstraintError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from constraint_support import greedy_tokenize, json_test_vocabulary  # noqa: E402

FIXTURE = HERE / "fixtures" / "jsonschemabench_sample.jsonl"


class LivenessFailure(AssertionError):
    def __init__(self, msg: str, canvas: list[int], position: int):
        super().__init__(msg)
        self.canvas = list(canvas)
        self.position = position


def liveness_walk(cc, ids: list[int], eos: int, mask_id: int, rng: random.Random, block: int = 32,
                  per_step: int = 4, expand_budget: int | None = 128, pad: int = 4,
                  whole_canvas: bool = False, retries: int = 0, timeout_s: float | None = -1.0) -> dict:
    """Commit `ids` (+ EOS padding) into an all-open canvas in a random order. Each step asks the masks of
    the open positions of the current block (of the whole canvas with whole_canvas=True) and checks:
    the frontier allows its instance token (when a call's deadline fired, after asking again); with
    expand_budget=None every open position does. Commits up
    to `per_step` random positions among those allowing their token, through select_commits.
    retries: ask again (up to this many times) when the frontier misses its token, counting it in
    stats["frontier_retried"] (the bench_masks behaviour; 0 = the promise holds at the first call).
    Returns counters; raises LivenessFailure (with the canvas) on a broken promise."""
    n = len(ids) + pad
    target = list(ids) + [eos] * (n - len(ids))
    kw = {} if timeout_s == -1.0 else {"timeout_s": timeout_s}  # -1: the default per-call deadline
    st = cc.new_canvas_state(n, expand_budget=expand_budget, **kw)
    canvas = [mask_id] * n
    stats = {"steps": 0, "narrowed": 0, "remasked": 0, "frontier_retried": 0, "deadline_retried": 0}
    blocks = [range(0, n)] if whole_canvas else [range(b0, min(n, b0 + block)) for b0 in range(0, n, block)]
    for blk in blocks:
        while True:
            open_pos = [p for p in blk if canvas[p] == mask_id]
            if not open_pos:
                break
            hits = getattr(st, "deadline_hits", 0)
            m = st.allowed_tokens(canvas, open_pos)
            stats["steps"] += 1
            frontier = canvas.index(mask_id)
            assert frontier == open_pos[0]
            for k in range(max(retries, 8)):
                if bool(m[0, target[frontier]]):
                    break
                fired = getattr(st, "deadline_hits", 0) > hits
                if not fired and k >= retries:
                    break
                # the call's deadline fired (exactness is promised within it only) or retries were asked: again,
                # on the transitions the interrupted call left cached
                stats["deadline_retried" if fired else "frontier_retried"] += 1
                hits = getattr(st, "deadline_hits", 0)
                m = st.allowed_tokens(canvas, open_pos)
            if not bool(m[0, target[frontier]]):
                raise LivenessFailure(
                    f"frontier {frontier} does not allow its instance token {target[frontier]} "
                    f"(mask has {int(m[0].sum())} tokens; call deadlines fired so far: "
                    f"{getattr(st, 'deadline_hits', 0)})", canvas, frontier)
            ok_pos = []
            for j, p in enumerate(open_pos):
                if bool(m[j, target[p]]):
                    ok_pos.append(p)
                elif expand_budget is None:
                    raise LivenessFailure(f"exact mask at {p} does not allow its instance token {target[p]}",
                                          canvas, p)
                else:
                    stats["narrowed"] += 1
            chosen = rng.sample(ok_pos, min(per_step, len(ok_pos)))
            props = [(p, target[p], rng.random()) for p in chosen]
            kept = st.select_commits(canvas, props)
            if not kept:
                raise LivenessFailure("select_commits kept none of the allowed proposals", canvas, chosen[0])
            stats["remasked"] += len(props) - len(kept)
            for p, t in kept:
                assert target[p] == t
                canvas[p] = t
    if not st.is_completable(canvas):
        raise LivenessFailure("the instance's own canvas is not completable", canvas, -1)
    return stats


# ------------------------------------------------------------------------------------------ fixture schemas
def compact(v) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _fixture_rows() -> list[dict]:
    if not FIXTURE.exists():
        return []
    with open(FIXTURE) as f:
        return [json.loads(ln) for ln in f]


@pytest.fixture(scope="module")
def fixture_compiler():
    toks = json_test_vocabulary()
    return ConstraintCompiler(TokenizerInfo(toks + [None, None], eos_id=len(toks), mask_id=len(toks) + 1))


@pytest.mark.slow  # 4-5 min on 2 cores: every fixture instance, both semantics, 3 orders
@pytest.mark.parametrize("strict", [False, True], ids=["spec", "strict"])
@pytest.mark.parametrize("row", _fixture_rows(), ids=lambda r: r["id"])
def test_fixture_instances_keep_their_tokens_allowed_in_random_commit_orders(row, strict, fixture_compiler):
    """Every fixture schema, under the specification's semantics and strict generation: the first valid
    instance in the compiled language (short ones under the specification's semantics, whose any-order
    objects with free-form members reach tens of thousands of states), three random commit orders."""
    from dllm_constrain.api import STRICT_SCHEMA_OPTIONS

    info = fixture_compiler.tokenizer_info
    clear_cache()
    try:
        cc = fixture_compiler.compile_json_schema(row["schema"], **(STRICT_SCHEMA_OPTIONS if strict else {}))
    except ConstraintError:
        pytest.skip("refused under these options")
    for t in row["tests"]:
        if not t["valid"]:
            continue
        ids = greedy_tokenize(compact(t["data"]).encode(), info.token_bytes)
        if len(ids) > (160 if strict else 50) or not cc.accepts_tokens(ids):
            continue  # outside the (narrowed) language, or too long for a quick test
        for seed in range(3):
            # no per-call deadline: on a loaded machine it would make the answers depend on the machine's speed
            liveness_walk(cc, ids, info.eos_id, info.mask_id, random.Random(seed), timeout_s=None)
        break
    clear_cache()


# ------------------------------------------------------------------------------------------ regressions
def _small_json_info() -> TokenizerInfo:
    toks = json_test_vocabulary()
    return TokenizerInfo(toks + [None, None], eos_id=len(toks), mask_id=len(toks) + 1)


def test_a_budget_cut_never_removes_a_valid_token_from_the_frontier():
    """The budgeted sets reach the state nearest to acceptance first (the "spine"): after `"`, only the first
    letter of the shorter enum value was allowed at the frontier, so a canvas writing "distance" had no
    position allowing its token. The frontier's mask is now decided exactly whenever the budget cut its sets."""
    info = _small_json_info()
    cc = ConstraintCompiler(info).compile_json_schema({"enum": ["distance", "length"]})
    n = 12
    canvas = [info.token_bytes.index(b'"')] + [info.mask_id] * (n - 1)
    exact = cc.new_canvas_state(n, expand_budget=None, timeout_s=None).allowed_tokens(canvas, [1])[0]
    for budget in (0, 1, 2):
        clear_cache()
        cc = ConstraintCompiler(info).compile_json_schema({"enum": ["distance", "length"]})
        got = cc.new_canvas_state(n, expand_budget=budget, timeout_s=None).allowed_tokens(canvas, list(range(1, n)))
        assert torch.equal(got[0], exact), budget
        assert bool(got[0, ord("d")]) and bool(got[0, ord("l")])


@pytest.mark.parametrize("schema,instance", [
    ({"enum": ["distance", "length"]}, "distance"),
    # a JSONSchemaBench (Github_easy) schema whose valid instance met a frontier without its token (bpe32k)
    ({"type": "object", "properties": {"type": {"enum": ["distance", "length", "angle"]},
                                       "unit": {"type": "string", "minLength": 1}, "value": {"type": "number"}},
      "required": ["type", "value", "unit"]}, {"type": "distance", "unit": "meters", "value": 10.5}),
], ids=["enum", "measure"])
@pytest.mark.parametrize("budget", [0, 1, 2, 4])
def test_random_commit_orders_keep_the_instance_token_at_the_frontier_under_tiny_budgets(schema, instance, budget):
    from dllm_constrain.api import STRICT_SCHEMA_OPTIONS

    info = _small_json_info()
    ids = greedy_tokenize(compact(instance).encode(), info.token_bytes)
    for seed in range(4):
        clear_cache()
        cc = ConstraintCompiler(info).compile_json_schema(schema, **STRICT_SCHEMA_OPTIONS)
        liveness_walk(cc, ids, info.eos_id, info.mask_id, random.Random(seed), per_step=3, expand_budget=budget,
                      timeout_s=None)


def test_exact_masks_allow_the_instance_token_everywhere():
    info = _small_json_info()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 3}},
              "required": ["a"]}
    cc = ConstraintCompiler(info).compile_json_schema(schema)
    ids = greedy_tokenize(compact({"a": 12, "b": "xy"}).encode(), info.token_bytes)
    for seed in range(3):
        liveness_walk(cc, ids, info.eos_id, info.mask_id, random.Random(seed), expand_budget=None, timeout_s=None,
                      whole_canvas=True)
