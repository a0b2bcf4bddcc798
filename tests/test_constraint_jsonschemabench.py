"""JSONSchemaBench schemas with their valid and invalid instances, walked through the canvas masks.

* The fixture `tests/fixtures/jsonschemabench_sample.jsonl` (always present, CI) holds a seeded random
  sample of schemas from every subset of ../shared/data/jsonschemabench that our compiler accepts, with
  their instances. Valid instances are kept when our (documented, sound) narrowings produce them -- the
  main one being that object keys follow the declared order; the count of dropped ones is in each line's
  `dropped_valid`. Every kept valid instance must walk through the masks token by token and end
  completable; every invalid instance must be rejected.
* With ../shared present, a larger seeded sample runs on the real 32K tokenizer: no invalid instance may
  be accepted, and the per-subset acceptance counts are printed (benchmarks/bench_masks.py reports them
  on 200 schemas with the 128K tokenizer).

Regenerate the fixture: python tests/test_constraint_jsonschemabench.py --make-fixture
"""
from __future__ import annotations

import json
import os
import random
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.errors import ConstraintError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from constraint_support import greedy_tokenize, json_test_vocabulary  # noqa: E402

FIXTURE = HERE / "fixtures" / "jsonschemabench_sample.jsonl"
SHARED = HERE.parent.parent / "shared" / "data"
DATA = SHARED / "jsonschemabench"
TOK32 = SHARED / "tokenizers" / "bpe32k"


def compact(v) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def fixture_info() -> TokenizerInfo:
    toks = json_test_vocabulary()
    return TokenizerInfo(toks + [None, None], eos_id=len(toks), mask_id=len(toks) + 1)


def walk_left_to_right(cc, ids: list[int], eos: int, mask: int) -> bool:
    """Commit ids left to right on a canvas of len(ids) + 2, checking each against its mask; then the
    EOS tail. True iff every token was allowed and the final canvas is completable."""
    n = len(ids) + 2
    st = cc.new_canvas_state(n, timeout_s=None)  # acceptance, not timing: no time allowance may cut the frontier
    canvas = [mask] * n
    for i, t in enumerate(ids + [eos, eos]):
        m = st.allowed_tokens(canvas, [i])
        if not bool(m[0, t]):
            return False
        canvas[i] = t
    return st.is_completable(canvas)


def load_fixture() -> list[dict]:
    with open(FIXTURE) as f:
        return [json.loads(ln) for ln in f]


@pytest.fixture(scope="module")
def fixture_compiler():
    return ConstraintCompiler(fixture_info())


ROWS = load_fixture() if FIXTURE.exists() else []
# Rows whose first walk explores large any-order member automata (10-35 s each on 2 cores): walked only by
# the slow test below, which walks every row.
HEAVY_ROWS = {"Github_hard---o41383", "Github_ultra---o41389", "Glaiveai2K---calculate_area_eb045105",
              "Glaiveai2K---calculate_area_0ff86767", "JME_54", "Github_easy---o47038"}
QUICK_ROWS = [r for r in ROWS if r["id"] not in HEAVY_ROWS]


def check_row(row: dict, compiler: ConstraintCompiler, walk_all_valid: bool) -> None:
    """Every invalid instance is rejected; valid ones walk through the masks (all of them, or the shortest)."""
    info = compiler.tokenizer_info
    cc = compiler.compile_json_schema(row["schema"])
    valid = []
    for t in row["tests"]:
        ids = greedy_tokenize(compact(t["data"]).encode(), info.token_bytes)
        if len(ids) + 2 > 4096:
            continue
        if t["valid"]:
            valid.append((ids, t["data"]))
        else:
            assert not cc.accepts_tokens(ids), compact(t["data"])[:200]
    if not walk_all_valid:
        valid = sorted(valid, key=lambda v: len(v[0]))[:1]
    for ids, data in valid:
        assert walk_left_to_right(cc, ids, info.eos_id, info.mask_id), compact(data)[:200]


@pytest.mark.parametrize("row", QUICK_ROWS, ids=lambda r: r["id"])
def test_fixture_invalid_instances_are_rejected_and_the_shortest_valid_one_walks(row, fixture_compiler):
    check_row(row, fixture_compiler, walk_all_valid=False)


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["id"])
def test_fixture_valid_instances_walk_through_the_masks_and_invalid_ones_are_rejected(row, fixture_compiler):
    check_row(row, fixture_compiler, walk_all_valid=True)


def test_fixture_covers_every_subset():
    subsets = {r["subset"] for r in load_fixture()}
    assert {"Glaiveai2K", "Github_easy", "Github_medium", "Github_hard", "Kubernetes", "Snowplow",
            "JsonSchemaStore", "WashingtonPost", "Github_trivial"} <= subsets


@pytest.mark.slow
@pytest.mark.skipif(not (DATA.is_dir() and TOK32.is_dir()),
                    reason="../shared/data (JSONSchemaBench + tokenizers) is not present")
def test_jsonschemabench_sample_with_the_real_tokenizer_accepts_no_invalid_instance(capsys):
    from tokenizers import Tokenizer

    torch.set_num_threads(1)
    tk = Tokenizer.from_file(str(TOK32 / "tokenizer.json"))
    info = TokenizerInfo.from_tokenizer(str(TOK32), mask_id=tk.token_to_id("<|pad|>"))
    comp = ConstraintCompiler(info)
    rng = random.Random(1)
    counts: dict[str, Counter] = defaultdict(Counter)
    invalid_accepted = []
    for fn in sorted(os.listdir(DATA)):
        if not fn.endswith(".jsonl"):
            continue
        lines = open(DATA / fn).readlines()
        for ln in rng.sample(lines, min(3, len(lines))):
            r = json.loads(ln)
            c = counts[r["subset"]]
            c["schemas"] += 1
            try:
                cc = comp.compile_json_schema(r["schema"])
            except ConstraintError:
                continue
            c["compiled"] += 1
            for t in r["tests"]:
                ids = tk.encode(compact(t["data"]), add_special_tokens=False).ids
                if t["valid"]:
                    c["valid"] += 1
                    if len(ids) <= 400 and walk_left_to_right(cc, ids, info.eos_id, info.mask_id):
                        c["valid_accepted"] += 1
                else:
                    c["invalid"] += 1
                    if cc.accepts_tokens(ids):
                        invalid_accepted.append(r["id"])
                    else:
                        c["invalid_rejected"] += 1
    with capsys.disabled():
        print("\nJSONSchemaBench sample (bpe32k): subset schemas/compiled valid-accepted/valid invalid-rejected/invalid")
        for sub, c in sorted(counts.items()):
            print(f"  {sub:24s} {c['compiled']}/{c['schemas']}  {c['valid_accepted']}/{c['valid']}  "
                  f"{c['invalid_rejected']}/{c['invalid']}")
    assert not invalid_accepted


# ------------------------------------------------------------------------------------------ fixture maker
def make_fixture(per_subset: int = 3, seed: int = 0, max_chars: int = 2500) -> None:
    info = fixture_info()
    comp = ConstraintCompiler(info)
    rng = random.Random(seed)
    out = []
    for fn in sorted(os.listdir(DATA)):
        if not fn.endswith(".jsonl"):
            continue
        lines = open(DATA / fn).readlines()
        rng.shuffle(lines)
        taken = 0
        for ln in lines:
            if taken >= per_subset:
                break
            if len(ln) > max_chars * 4:
                continue
            r = json.loads(ln)
            try:
                cc = comp.compile_json_schema(r["schema"])
            except ConstraintError:
                continue
            kept, dropped = [], 0
            for t in r["tests"]:
                text = compact(t["data"])
                if len(text) > max_chars:
                    continue
                ids = greedy_tokenize(text.encode(), info.token_bytes)
                if t["valid"]:
                    if walk_left_to_right(cc, ids, info.eos_id, info.mask_id):
                        kept.append({"valid": True, "data": t["data"]})
                    else:
                        dropped += 1
                else:
                    assert not cc.accepts_tokens(ids), r["id"]
                    kept.append({"valid": False, "data": t["data"]})
            if not any(t["valid"] for t in kept):
                continue
            out.append({"id": r["id"], "subset": r["subset"], "schema": r["schema"], "tests": kept,
                        "dropped_valid": dropped})
            taken += 1
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    with open(FIXTURE, "w") as f:
        for r in out:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {len(out)} schemas to {FIXTURE}")


if __name__ == "__main__":
    if "--make-fixture" in sys.argv:
        torch.set_num_threads(1)
        make_fixture()
