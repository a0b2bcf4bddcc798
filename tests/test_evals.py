"""The eval commands on small fixtures (tests/fixtures/evals), checked against known answers.

Everything here runs without ../shared: the walks use the built-in byte-level tokenizer ("bytes"), the fake
engines live in tests/fixtures/evals/fake_engines.py, generation uses a tiny random LLaDA checkpoint.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dllm_constrain.evals import data as D
from dllm_constrain.evals.cli import main
from dllm_constrain.evals.reference import compact_json, remote_refs, schema_order
from dllm_constrain.evals.report import read_rows, row_stats, summarize_jsb
from dllm_constrain.evals.runner import run
from dllm_constrain.evals.tok import resolve_tokenizer

FIX = Path(__file__).parent / "fixtures" / "evals"
FAKE = FIX / "fake_engines.py"
ACCEPT, REJECT, FAULTY = f"{FAKE}:accept_all", f"{FAKE}:reject_all", f"{FAKE}:faulty"


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())["summary"]


@pytest.fixture(scope="module")
def jsb_run(tmp_path_factory):
    """One run of the jsonschemabench command over the fixture: ours + the two fake engines."""
    out = tmp_path_factory.mktemp("jsb")
    code = main(["jsonschemabench", "--data", str(FIX / "jsonschemabench"), "--subsets", "glaiveai,GitHub-Easy",
                 "--tokenizer", "bytes", "--out", str(out), "--all-schemas", "--timeout", "20", "--no-progress",
                 "--quiet", "--in-process", "--engines", f"ours,{ACCEPT},{REJECT}"])
    assert code == 0
    return out


def test_jsonschemabench_counts_for_ours(jsb_run):
    s = _summary(jsb_run)
    assert s["engines"] == ["ours", "fake_engines:accept_all", "fake_engines:reject_all"]
    g, e = s["by_subset"]["Glaiveai2K"]["ours"], s["by_subset"]["Github_easy"]["ours"]
    # Glaiveai2K: person, color, remote_ref (unsupported), no_valid_instance (vacuously covered)
    assert (g["n"], g["compiled"], g["covered"]) == (4, 3, 3)
    # Github_easy: bad_type (invalid schema), empty_range (unsatisfiable), pattern
    assert (e["n"], e["compiled"], e["covered"]) == (3, 1, 1)
    assert s["errors"]["ours"] == {"UnsupportedSchemaError:$ref": 1, "InvalidSchemaError": 1, "UnsatisfiableSchemaError": 1}
    t = s["total"]["ours"]
    assert (t["over"], t["under"], t["timeouts"]) == (0, 0, 0)
    # every invalid instance of a compiled schema was blocked: missing required, below minimum, not in enum,
    # a string for an integer, pattern too long, additional property
    rows = [r for r in read_rows(jsb_run / "results.jsonl") if r["engine"] == "ours"]
    assert sum(row_stats(r)["invalid_rejected"] for r in rows) == 6
    # the token walk, the byte automaton and a fully committed canvas agree on every instance
    assert (t["bytes_mismatch"], t["canvas_mismatch"]) == (0, 0)
    assert t["label_disagree"] == 0
    assert t["compile_ms_p50"] is not None and t["n_masks"] > 0
    # repeated-key probes ({"name":"Ada","age":36,"name":"Ada"}, {"id":"abc","id":"abc"}): blocked
    assert (t["probes"], t["probe_repeated_key"]) == (2, 0)


def test_jsonschemabench_counts_for_fake_engines(jsb_run):
    s = _summary(jsb_run)
    acc, rej = s["total"]["fake_engines:accept_all"], s["total"]["fake_engines:reject_all"]
    # 7 schemas: 6 valid instances, 7 invalid ones
    assert (acc["valid_instances"], acc["invalid_instances"]) == (6, 7)
    assert (acc["compiled"], acc["covered"], acc["over"], acc["under"], acc["under_schemas"]) == (7, 7, 0, 7, 5)
    # the reference validator agrees that all 7 are invalid
    assert acc["under_confirmed"] == 7
    # reject_all: only the two schemas without a valid instance are (vacuously) covered
    assert (rej["compiled"], rej["covered"], rej["over"], rej["over_schemas"], rej["under"]) == (7, 2, 6, 5, 0)
    assert s["under_ids"]["fake_engines:accept_all"][0] == "Github_easy---empty_range"
    assert (acc["probes"], acc["probe_repeated_key"], rej["probe_repeated_key"]) == (3, 3, 0)


def test_jsonschemabench_writes_reports_and_resumes(jsb_run, capsys):
    for name in ("results.jsonl", "summary.md", "summary.json", "coverage_per_subset.png", "compile_time.png",
                 "mask_time.png"):
        assert (jsb_run / name).is_file(), name
    md = (jsb_run / "summary.md").read_text()
    assert "| Glaiveai2K | ours | 4 | 4/4" not in md and "| Glaiveai2K | ours | 4 | 3/4 (0.75) | 3/4 (0.75) | 0.96 |" in md
    n_before = len(read_rows(jsb_run / "results.jsonl"))
    assert n_before == 21  # 7 schemas x 3 engines
    # the same command again: nothing is recomputed (no worker starts), the summary is rebuilt
    code = main(["jsonschemabench", "--data", str(FIX / "jsonschemabench"), "--subsets", "Glaiveai2K,Github_easy",
                 "--tokenizer", "bytes", "--out", str(jsb_run), "--all-schemas", "--no-progress", "--no-plots",
                 "--engines", f"ours,{ACCEPT},{REJECT}"])
    assert code == 0
    assert len(read_rows(jsb_run / "results.jsonl")) == n_before
    assert "resuming: 21" in capsys.readouterr().out


def test_fail_on_under_constraint_exit_code(jsb_run):
    args = ["jsonschemabench", "--data", str(FIX / "jsonschemabench"), "--tokenizer", "bytes", "--out", str(jsb_run),
            "--all-schemas", "--no-progress", "--no-plots", "--quiet", "--fail-on-under-constraint"]
    assert main(args + ["--engines", "ours"]) == 0
    assert main(args + ["--engines", ACCEPT]) == 1


def test_a_hanging_or_crashing_schema_costs_only_itself(tmp_path, monkeypatch):
    """The real subprocess path: a worker per engine, killed and restarted when a schema hangs or crashes it."""
    from dllm_constrain.evals.worker import WorkerProcess

    monkeypatch.setattr(WorkerProcess, "COMPILE_GRACE_S", 0.1)
    monkeypatch.setattr(WorkerProcess, "COMPILE_GRACE_FRAC", 0.0)
    tokdir, tokname = resolve_tokenizer("bytes")
    recs = D.load_jsonschemabench(FIX / "faults")
    res = run("jsonschemabench", recs, [FAULTY], tokdir, tokname, tmp_path, timeout=1.0, progress=False, plots=False)
    by_id = {r["id"]: r for r in res["rows"]}
    assert by_id["Faults---a_hang"]["outcome"] == "timeout" and by_id["Faults---a_hang"]["phase"] == "compile"
    assert by_id["Faults---b_crash"]["outcome"] == "crash"
    fine = row_stats(by_id["Faults---c_fine"])
    assert fine["covered"] and fine["under"] == 1
    assert res["summary"]["errors"]["fake_engines:faulty"] == {"Timeout(compile)": 1, "Crash(compile)": 1}


def test_hugging_face_layout_has_no_instances(tmp_path):
    recs = D.load_jsonschemabench(FIX / "jsonschemabench_hf")
    assert [r["id"] for r in recs] == ["Github_easy---remote_ref", "Glaiveai2K---color", "Glaiveai2K---person"]
    assert all(r["tests"] == [] and not r["has_tests"] for r in recs)
    tokdir, tokname = resolve_tokenizer("bytes")
    res = run("jsonschemabench", recs, ["ours"], tokdir, tokname, tmp_path, progress=False, plots=False,
              isolate=False)
    t = res["summary"]["total"]["ours"]
    assert (t["n"], t["compiled"], t["has_instances"]) == (3, 2, False)
    assert "n/a (no instances)" in res["markdown"]


def test_generation_under_the_schema(tmp_path, tiny_llada, tiny_tokenizer):
    from dllm_constrain.engine.loader import save_checkpoint

    ckpt = save_checkpoint(tiny_llada, tiny_tokenizer, tmp_path / "ckpt")
    recs = [r for r in D.load_jsonschemabench(FIX / "jsonschemabench", ["Glaiveai2K"]) if r["id"] == "Glaiveai2K---color"]
    tokdir, tokname = resolve_tokenizer("bytes")
    params = {"max_new_tokens": 12, "policy": "quota", "block_length": 12, "temperature": 0.0, "seed": 0}
    res = run("jsonschemabench", recs, ["ours"], tokdir, tokname, tmp_path / "out", generate=True, model=str(ckpt),
              gen_params=params, progress=False, plots=False, isolate=False)
    g = res["summary"]["total"]["ours"]["gen"]
    assert (g["attempted"], g["schema_valid"], g["compliance"]) == (1, 1, 1.0)
    assert g["nfe_mean"] >= 1
    assert res["rows"][0]["gen"]["text"] in ('"red"', '"green"')


def test_test_suite_known_answers(tmp_path):
    cases, left_out = D.load_test_suite(FIX / "test_suite")
    assert sorted(c["id"] for c in cases) == ["boolean_schema#0", "boolean_schema#1", "enum#0", "ref#0", "required#0"]
    assert sorted(x["id"] for x in left_out) == ["format#0", "ref#1", "refRemote#0"]
    out = tmp_path / "suite"
    code = main(["test-suite", "--data", str(FIX / "test_suite"), "--tokenizer", "bytes", "--out", str(out),
                 "--no-progress", "--quiet", "--in-process", "--engines", f"ours,{ACCEPT},{REJECT}"])
    assert code == 0
    b = _summary(out)["by_engine"]
    # ours: every case passes (the `false` schema does not compile and has no valid instance: it passes)
    assert (b["ours"]["passed"], b["ours"]["cases"], b["ours"]["categories_full"], b["ours"]["n_categories"]) == (5, 5, 4, 4)
    assert (b["ours"]["over"], b["ours"]["under"]) == (0, 0)
    acc = b["fake_engines:accept_all"]
    assert (acc["passed"], acc["under"], acc["categories_full"]) == (0, 6, 0)
    assert acc["categories_under"] == ["boolean_schema", "enum", "ref", "required"]
    rej = b["fake_engines:reject_all"]
    assert (rej["passed"], rej["over"], rej["categories"]["boolean_schema"]) == (1, 5, 0.5)
    assert (out / "test_suite_categories.png").is_file()


def test_subset_names_and_sampling():
    avail = D.available_subsets(FIX / "jsonschemabench")
    assert D.resolve_subsets(["GlaiveAI", "github-easy"], avail) == ["Glaiveai2K", "Github_easy"]
    with pytest.raises(D.DataError):
        D.resolve_subsets(["Kubernetes"], avail)
    # by default only schemas with a valid instance are sampled (as MaskBench does)
    ids = [r["id"] for r in D.load_jsonschemabench(FIX / "jsonschemabench", ["Glaiveai2K"])]
    assert ids == ["Glaiveai2K---color", "Glaiveai2K---person", "Glaiveai2K---remote_ref"]
    a = [r["id"] for r in D.load_jsonschemabench(FIX / "jsonschemabench", None, n=2, seed=1)]
    assert a == [r["id"] for r in D.load_jsonschemabench(FIX / "jsonschemabench", None, n=2, seed=1)]
    assert len(a) == 4 and {i.split("---")[0] for i in a} == {"Glaiveai2K", "Github_easy"}  # 2 per subset


def test_reference_helpers():
    assert remote_refs({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "http://x.org/s.json"}}}) == {"http://x.org/s.json"}
    assert remote_refs({"$id": "http://x.org/root.json", "$defs": {"a": {"$id": "b.json"}}, "$ref": "b.json"}) == set()
    assert remote_refs({"properties": {"$ref": {"type": "string"}}}) == set()
    s = {"properties": {"b": {"properties": {"y": {}, "x": {}}}, "a": {}}, "required": ["z"]}
    assert compact_json(schema_order(s, {"z": 0, "a": 1, "q": 2, "b": {"x": 1, "y": 2}})) == \
        '{"b":{"y":2,"x":1},"a":1,"z":0,"q":2}'


def test_key_order_diagnostic_in_the_summary():
    rows = [{"suite": "jsonschemabench", "engine": "e", "tokenizer": "t", "id": "S---1", "subset": "S", "n_valid": 2,
             "n_invalid": 0, "compile_ok": True, "compile_s": 0.001, "mask_us": [1.0],
             "walks": [{"valid": True, "status": "mask_rejects", "status_schema_order": "accepted"},
                       {"valid": True, "status": "accepted"}]}]
    t = summarize_jsb(rows)["total"]["e"]
    assert (t["covered"], t["over"], t["over_key_order"], t["covered_schema_order"]) == (0, 1, 1, 1)
