"""Loading JSONSchemaBench (two layouts) and the JSON-Schema-Test-Suite into one record shape.

A record is a dict: {"id", "subset", "schema", "tests": [{"data", "valid", "description"?}], "has_tests"}.

JSONSchemaBench layouts accepted by `load_jsonschemabench(DIR)`:
* per-subset JSONL (the development copy in ../shared/data/jsonschemabench): `DIR/<Subset>.jsonl`, one
  MaskBench record a line: {"id", "subset", "schema", "tests": [{"data", "valid"}, ...], ...};
  a JSONL line may instead carry the schema as a JSON string under "json_schema" (the Hugging Face export).
* folder per subset (the Hugging Face / GitHub `data/` layout): `DIR/<Subset>/<name>.json`, each file either
  a bare JSON Schema (no instances: walks are skipped, only compilation and generation are measured) or a
  MaskBench record {"schema", "tests"}.

The JSON-Schema-Test-Suite (`load_test_suite(DIR)`): DIR is the suite root (holding tests/draft2020-12),
or the draft2020-12 folder itself. One record per test case; the category is the file name.
"""
from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .reference import remote_refs


class DataError(ValueError):
    """The data folder does not look like any layout we read."""


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


# Names the JSONSchemaBench paper uses -> the dataset's subset names.
SUBSET_ALIASES = {
    "glaiveai": "Glaiveai2K",
    "githubtrivial": "Github_trivial",
    "githubeasy": "Github_easy",
    "githubmedium": "Github_medium",
    "githubhard": "Github_hard",
    "githubultra": "Github_ultra",
    "kubernetes": "Kubernetes",
    "snowplow": "Snowplow",
    "washingtonpost": "WashingtonPost",
    "jsonschemastore": "JsonSchemaStore",
}


def available_subsets(data_dir: str | os.PathLike) -> dict[str, Path]:
    """Subset name -> its JSONL file or its folder of .json files."""
    d = Path(data_dir)
    if not d.is_dir():
        raise DataError(f"{d} is not a folder")
    out: dict[str, Path] = {}
    for p in sorted(d.iterdir()):
        if p.is_file() and p.suffix == ".jsonl":
            out[p.stem] = p
        elif p.is_dir() and any(q.suffix == ".json" for q in p.iterdir()):
            out[p.name] = p
    if not out:
        raise DataError(f"{d} holds neither <Subset>.jsonl files nor <Subset>/ folders of .json schemas")
    return out


def resolve_subsets(requested: Iterable[str] | None, available: dict[str, Path]) -> list[str]:
    """Match user subset names (exact, case/punctuation-insensitive, or the paper's names) to the data's."""
    if not requested:
        return list(available)
    by_norm = {_norm(k): k for k in available}
    out = []
    for r in requested:
        r = r.strip()
        if not r:
            continue
        if r in available:
            out.append(r)
            continue
        n = _norm(r)
        if n in by_norm:
            out.append(by_norm[n])
            continue
        alias = SUBSET_ALIASES.get(n)
        if alias and alias in available:
            out.append(alias)
            continue
        cands = [k for kn, k in by_norm.items() if kn.startswith(n)]
        if len(cands) == 1:
            out.append(cands[0])
            continue
        raise DataError(f"unknown subset {r!r}; available: {', '.join(available)}"
                        + (f" (ambiguous: {', '.join(cands)})" if cands else ""))
    return list(dict.fromkeys(out))


def _record_from_obj(obj: Any, subset: str, rid: str) -> dict[str, Any]:
    if isinstance(obj, dict) and "schema" in obj and isinstance(obj.get("tests"), list):
        schema, tests, has = obj["schema"], obj["tests"], True
    elif isinstance(obj, dict) and isinstance(obj.get("json_schema"), str):
        schema, tests, has = json.loads(obj["json_schema"]), [], False
    else:
        schema, tests, has = obj, [], False
    tests = [{"data": t.get("data"), "valid": bool(t.get("valid")), "description": t.get("description", "")}
             for t in tests if isinstance(t, dict) and "data" in t]
    return {"id": rid, "subset": subset, "schema": schema, "tests": tests, "has_tests": has}


def load_subset(subset: str, path: Path) -> list[dict[str, Any]]:
    recs = []
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            for k, line in enumerate(f):
                line = line.strip()
                if not line:
                    continue
                obj = json.loads(line)
                rid = obj.get("id") or obj.get("unique_id") or f"{subset}---{k}"
                recs.append(_record_from_obj(obj, subset, str(rid)))
    else:
        for p in sorted(path.iterdir()):
            if p.suffix != ".json":
                continue
            with open(p, encoding="utf-8") as f:
                obj = json.load(f)
            rid = p.stem if p.stem.startswith(subset) else f"{subset}---{p.stem}"
            recs.append(_record_from_obj(obj, subset, rid))
    recs.sort(key=lambda r: r["id"])
    return recs


def sample(recs: list[dict[str, Any]], n: int, seed: int = 0, require_valid: bool = True) -> list[dict[str, Any]]:
    """n records drawn at random (seeded) from those with at least one valid instance (when the layout has
    instances and require_valid); n <= 0 means all of them. The returned order is by id."""
    pool = recs
    if require_valid and any(r["has_tests"] for r in recs):
        pool = [r for r in recs if any(t["valid"] for t in r["tests"])]
    if n <= 0 or n >= len(pool):
        return list(pool)
    rng = random.Random(f"{seed}:{pool[0]['subset'] if pool else ''}")
    picked = rng.sample(pool, n)
    return sorted(picked, key=lambda r: r["id"])


def load_jsonschemabench(data_dir: str | os.PathLike, subsets: Iterable[str] | None = None, n: int = 0,
                         seed: int = 0, require_valid: bool = True) -> list[dict[str, Any]]:
    avail = available_subsets(data_dir)
    out = []
    for s in resolve_subsets(subsets, avail):
        out += sample(load_subset(s, avail[s]), n, seed, require_valid)
    return out


# ------------------------------------------------------------------------------------ test suite
# Files left out as the JSONSchemaBench paper does: `format` (format assertion is optional in 2020-12) and
# `refRemote` (needs documents outside the schema). optional/ is not part of the required suite.
SUITE_EXCLUDED_FILES = ("format.json", "refRemote.json")


def suite_dir(data_dir: str | os.PathLike) -> Path:
    d = Path(data_dir)
    for cand in (d / "tests" / "draft2020-12", d / "draft2020-12", d):
        if cand.is_dir() and any(p.suffix == ".json" for p in cand.iterdir()):
            return cand
    raise DataError(f"no draft2020-12 test files under {d} (expected DIR/tests/draft2020-12/*.json)")


def load_test_suite(data_dir: str | os.PathLike) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(cases, left_out): one record per test case of the required draft 2020-12 files, minus the excluded
    files and minus cases whose schema references a document outside itself (remote refs)."""
    d = suite_dir(data_dir)
    cases, left_out = [], []
    for p in sorted(d.iterdir()):
        if p.suffix != ".json" or not p.is_file():
            continue
        cat = p.stem
        with open(p, encoding="utf-8") as f:
            groups = json.load(f)
        for k, g in enumerate(groups):
            rec = {"id": f"{cat}#{k}", "subset": cat, "schema": g["schema"], "description": g.get("description", ""),
                   "tests": [{"data": t["data"], "valid": bool(t["valid"]), "description": t.get("description", "")}
                             for t in g["tests"]], "has_tests": True}
            if p.name in SUITE_EXCLUDED_FILES:
                left_out.append({"id": rec["id"], "reason": f"{p.name} left out"})
                continue
            remote = remote_refs(g["schema"])
            if remote:
                left_out.append({"id": rec["id"], "reason": "remote $ref " + ", ".join(sorted(remote))[:200]})
                continue
            cases.append(rec)
    return cases, left_out
