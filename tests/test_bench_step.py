"""benchmarks/bench_step.py counts a small run end to end: per-step figures by step kind and their projection."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_step.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_step", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_small_run_counts_every_step_kind_and_projects_onto_llada_8b(tmp_path, capsys) -> None:
    bench = _bench()
    report = bench.main(["--batches", "1,2", "--layers", "2", "--hidden", "32", "--heads", "2", "--vocab", "300",
                         "--prompt", "4", "--canvas", "16", "--block", "8", "--json"])
    one, two = report["results"]
    assert one["committed_tokens"] == 16 and two["committed_tokens"] == 32
    assert set(two["per_step"]) == {"all", "refresh", "reuse", "mixed"}
    for kind, s in two["per_step"].items():
        assert s["steps"] > 0 and s["head_passes"] > 0, kind
        assert s["launches_per_layer"] * 2 < s["launches"] <= s["ops"], kind
    assert one["per_step"]["all"]["head_passes"] == 1.0  # one request: one LM-head pass per step
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(report))
    capsys.readouterr()
    bench.main(["--project", str(saved)])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 |") or
            line.startswith("| 2 |")]
    assert len(rows) == 2
