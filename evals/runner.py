"""Drive the engines over the records: one worker subprocess per engine, one result row per (engine, schema)
appended to OUT/results.jsonl as soon as it is known, so an interrupted run resumes where it stopped
(rows already there for the same engine, tokenizer and schema id are skipped)."""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .engines import canonical_name, engine_label, installed
from .reference import compact_json, is_valid, reference_validator, repeated_key_probe, schema_order
from .report import read_rows, write_reports
from .worker import InProcessWorker, WorkerError, WorkerProcess

GEN_PROMPT = "Give one example JSON value that is valid against the schema."


def machine_info() -> dict[str, Any]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    info = {"machine": f"{os.cpu_count()} cores ({cpu}), {platform.platform()}, one thread per engine",
            "python": sys.version.split()[0]}
    try:
        import torch

        info["torch"] = torch.__version__
    except Exception:  # pragma: no cover
        pass
    return info


def code_info() -> dict[str, Any]:
    """Which constraint-layer code produced the figures: git HEAD, uncommitted files under it, a content hash."""
    import hashlib
    import subprocess

    import dllm_constrain.constraints as C

    cdir = Path(C.__file__).parent
    h = hashlib.sha256()
    for p in sorted(cdir.rglob("*.py")):
        h.update(p.relative_to(cdir).as_posix().encode() + b"\0" + p.read_bytes())
    info = {"constraints_sha256": h.hexdigest()[:16]}
    try:
        root = subprocess.run(["git", "-C", str(cdir), "rev-parse", "--show-toplevel"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        if root:
            head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                  timeout=10).stdout.strip()
            dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", str(cdir)], capture_output=True,
                                   text=True, timeout=10).stdout.split("\n")
            dirty = [ln[3:] for ln in dirty if ln.strip()]
            info["code"] = head + (f" + uncommitted: {', '.join(dirty)}" if dirty else " (clean)")
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def _labels(rec: dict[str, Any]) -> list[bool | None]:
    """The reference validator's verdict on each instance (None when it cannot decide)."""
    try:
        v = reference_validator(rec["schema"])
    except Exception:
        return [None] * len(rec["tests"])
    return [is_valid(v, t["data"]) for t in rec["tests"]]


def _schema_ordered(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The task's instances; a valid one also in the schema's key order when that spelling differs; then
    the probes (instances that are not in the data, walked after them): a repeated-key spelling of the
    first valid object instance."""
    out = []
    for t in rec["tests"]:
        inst = {"valid": t["valid"], "data": t["data"]}
        if t["valid"]:
            try:
                alt = schema_order(rec["schema"], t["data"])
                if compact_json(alt) != compact_json(t["data"]):
                    inst["data_schema_order"] = alt
            except Exception:
                pass
        out.append(inst)
    first = next((t["data"] for t in rec["tests"] if t["valid"] and isinstance(t["data"], dict) and t["data"]), None)
    if first is not None:
        out.append({"valid": False, "text": repeated_key_probe(first), "probe": "repeated_key"})
    return out


def _row(suite: str, engine: str, tokname: str, rec: dict[str, Any], msg: dict[str, Any],
         labels: list[bool | None]) -> dict[str, Any]:
    tests = rec["tests"]
    row: dict[str, Any] = {"suite": suite, "engine": engine, "tokenizer": tokname, "id": rec["id"],
                           "subset": rec["subset"], "n_valid": sum(t["valid"] for t in tests),
                           "n_invalid": sum(not t["valid"] for t in tests)}
    if "outcome" in msg:  # killed: timeout / oom / crash
        row.update(outcome=msg["outcome"], phase=msg.get("phase"),
                   compile_ok=True if msg.get("phase") == "walk" else None, compile_s=msg.get("compile_s"),
                   error_kind=msg["outcome"].capitalize())
        row["walks"] = []
        return row
    row.update(compile_ok=msg["compile_ok"], compile_s=msg["compile_s"])
    for k in ("error_kind", "error_keyword", "error"):
        if k in msg:
            row[k] = msg[k]
    walks, mask_us = [], []
    got = msg.get("walks") or []
    probes = got[len(tests):]
    if probes:
        row["probes"] = [{"kind": "repeated_key", "status": p["status"], "n_tokens": p.get("n_tokens")} for p in probes]
    for t, lab, w in zip(tests, labels, got[:len(tests)]):
        masks = w.pop("mask_us", [])
        if t["valid"]:
            mask_us += masks
        w["valid"] = t["valid"]
        w["label_ref"] = lab
        w["n_masks"] = len(masks)
        walks.append(w)
    row["walks"] = walks
    row["mask_us"] = mask_us
    if "gen" in msg:
        row["gen"] = msg["gen"]
    return row


@dataclass
class _Walk:
    """What one run is walking: the planned (engine spec, label, records to do), caches shared across engines,
    and the run's record in meta.json."""
    suite: str
    tokname: str
    plan: list[tuple[str, str, list[dict[str, Any]]]]
    code: dict[str, Any]
    this_run: dict[str, Any]
    bar: Any = None
    failed: list[str] = field(default_factory=list)
    label_cache: dict[str, list[bool | None]] = field(default_factory=dict)
    alt_cache: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def run(suite: str, records: list[dict[str, Any]], engines: list[str], tokdir: Path, tokname: str,
        out_dir: Path, *, timeout: float = 30.0, max_tokens: int = 10000, mem_limit_gb: float = 6.0,
        generate: bool = False, model: str | None = None, gen_params: dict[str, Any] | None = None,
        gen_timeout: float = 600.0, progress: bool = True, meta_extra: dict[str, Any] | None = None,
        plots: bool = True, isolate: bool = True, log=print) -> dict[str, Any]:
    """isolate=False runs the engines in this process (no time/memory limit beyond the compiler's deadline)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    res_path = out_dir / "results.jsonl"
    meta_path = out_dir / "meta.json"
    code = code_info()
    meta = _read_meta(meta_path, meta_extra, tokname, tokdir, len(records), timeout, max_tokens)
    this_run: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), **code, "computed": {}}
    t_start = time.time()
    walk = _Walk(suite, tokname, _plan(records, engines, tokname, read_rows(res_path), meta, res_path, log),
                 code, this_run)
    total = sum(len(t) for _, _, t in walk.plan)
    if progress and total:
        from tqdm import tqdm

        walk.bar = tqdm(total=total, unit="case" if suite == "test-suite" else "schema", dynamic_ncols=True,
                        file=sys.stderr, mininterval=0.5)
    worker_cls = WorkerProcess if isolate else InProcessWorker
    worker_args = dict(timeout=timeout, max_tokens=max_tokens, mem_limit_gb=mem_limit_gb, model=model,
                       gen_params=gen_params, gen_timeout=gen_timeout, generate=generate)
    with open(res_path, "a", encoding="utf-8") as f:
        for spec, name, todo in walk.plan:
            if todo:
                _walk_engine(walk, spec, name, todo, worker_cls, str(tokdir), worker_args, meta, f, log)
    if walk.bar is not None:
        walk.bar.close()
    this_run["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    this_run["wall_s"] = round(time.time() - t_start, 1)
    if this_run["computed"]:
        meta.setdefault("runs", []).append(this_run)
    meta_path.write_text(json.dumps(meta, indent=1))
    rows = _latest_rows(read_rows(res_path), records, engines, tokname)
    return write_reports(suite, rows, meta, out_dir, plots=plots) | {"rows": rows, "meta": meta,
                                                                     "failed_engines": walk.failed}


def _read_meta(meta_path: Path, meta_extra: dict[str, Any] | None, tokname: str, tokdir: Path, n_records: int,
               timeout: float, max_tokens: int) -> dict[str, Any]:
    """meta.json as this run starts: what was there, this machine, this run's settings."""
    meta: dict[str, Any] = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    meta.update(meta_extra or {})
    meta.update(machine_info())
    for k in ("code", "constraints_sha256", "started", "finished", "wall_s"):  # per run now, see meta["runs"]
        meta.pop(k, None)
    meta.update(tokenizer=f"{tokname} ({tokdir})", n_records=n_records, timeout_s=timeout, max_tokens=max_tokens)
    meta.setdefault("engines", {})
    return meta


def _plan(records: list[dict[str, Any]], engines: list[str], tokname: str, old: list[dict[str, Any]],
          meta: dict[str, Any], res_path: Path, log) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """Per installed engine, the records without a row yet (an engine that is not installed is noted in meta)."""
    done = {(r["engine"], r["tokenizer"], r["id"]) for r in old}
    plan = []
    for spec in engines:
        name = engine_label(spec)
        ok, why = installed(spec)
        if not ok:
            log(f"[evals] skipping engine {name}: {why}")
            meta["engines"][name] = f"skipped: {why}"
            continue
        plan.append((spec, name, [r for r in records if (name, tokname, r["id"]) not in done]))
    skipped = len(records) * len(plan) - sum(len(t) for _, _, t in plan)
    if skipped:
        log(f"[evals] resuming: {skipped} (engine, schema) results already in {res_path}")
    return plan


def _walk_engine(walk: _Walk, spec: str, name: str, todo: list[dict[str, Any]], worker_cls, tokdir: str,
                 worker_args: dict[str, Any], meta: dict[str, Any], f, log) -> None:
    """One engine over its records in one worker: a row per record appended to `f` as soon as it is known."""
    args = dict(worker_args)
    do_gen = args.pop("generate") and canonical_name(spec) == "ours"
    if not do_gen:
        args["model"] = None
    w = worker_cls(spec, tokdir, args.pop("timeout"), **args)
    try:
        info = w.start()
    except WorkerError as e:
        log(f"[evals] engine {name} cannot start: {e}")
        meta["engines"][name] = f"failed to start: {e}"
        walk.failed.append(name)
        if walk.bar is not None:
            walk.bar.update(len(todo))
        return
    meta["engines"][name] = info["version"]
    if walk.bar is not None:
        walk.bar.set_description(name)
    try:
        for rec in todo:
            f.write(json.dumps(_walk_record(walk, w, spec, name, rec, do_gen, log), ensure_ascii=False) + "\n")
            f.flush()
            if walk.bar is not None:
                walk.bar.update(1)
    finally:
        w.close()
        if w.restarts:
            meta.setdefault("worker_restarts", {})[name] = w.restarts


def _walk_record(walk: _Walk, w, spec: str, name: str, rec: dict[str, Any], do_gen: bool, log) -> dict[str, Any]:
    if rec["id"] not in walk.alt_cache:
        walk.alt_cache[rec["id"]] = _schema_ordered(rec)
    task = {"id": rec["id"], "schema": rec["schema"], "instances": walk.alt_cache[rec["id"]],
            "generate": do_gen, "prompt": GEN_PROMPT}
    try:
        msg = w.run(task)
    except WorkerError as e:  # could not restart after a kill
        msg = {"outcome": "crash", "phase": "start", "compile_s": None}
        log(f"[evals] {name}: {e}")
    if rec["id"] not in walk.label_cache:
        walk.label_cache[rec["id"]] = _labels(rec)
    row = _row(walk.suite, name, walk.tokname, rec, msg, walk.label_cache[rec["id"]])
    if canonical_name(spec) == "ours":  # the constraint layer changes between runs: say which one
        row["code"] = f"{walk.code.get('code', '?')} sha {walk.code['constraints_sha256']}"
    walk.this_run["computed"][name] = walk.this_run["computed"].get(name, 0) + 1
    return row


def _latest_rows(rows: list[dict[str, Any]], records: list[dict[str, Any]], engines: list[str],
                 tokname: str) -> list[dict[str, Any]]:
    """This run's rows, one per (engine, id) (the last one written wins), in engine then record order."""
    ids = {r["id"] for r in records}
    labels = {engine_label(s) for s in engines}
    uniq: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if r["tokenizer"] == tokname and r["id"] in ids and r["engine"] in labels:
            uniq[(r["engine"], r["id"])] = r
    order = {r["id"]: k for k, r in enumerate(records)}
    eng_order = {engine_label(s): k for k, s in enumerate(engines)}
    return sorted(uniq.values(), key=lambda r: (eng_order.get(r["engine"], 99), order.get(r["id"], 0)))
