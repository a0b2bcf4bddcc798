"""Per-schema rows -> per-subset summaries (JSON + Markdown) and PNG plots.

Definitions (JSONSchemaBench, per subset and engine; n = schemas in the sample):
* declared coverage  = compiled / n (the engine accepted the schema within the time limit);
* empirical coverage = covered / n, covered = compiled and every valid instance walked to the end
  and accepted (EOS allowed after its last token) within the time limit;
* over-constraint    = valid instances rejected (some token or the final EOS disallowed);
* under-constraint   = invalid instances accepted (every token and the final EOS allowed): the engine
  would let an invalid output through. `confirmed` = the reference validator agrees the instance is invalid;
* compliance         = generated outputs valid against the schema (reference validator) / generations
  attempted on compiled schemas (--generate, ours only).
Test suite (per category = file): a case passes iff every valid instance is accepted and every invalid one
blocked; a schema that does not compile blocks everything, so it passes iff the case has no valid instance.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

# JSONSchemaBench paper, Guidance (llguidance), empirical coverage on the full subsets (the coverage anchors).
PAPER_ANCHORS = {
    "Glaiveai2K": 0.96, "Github_easy": 0.86, "Snowplow": 0.82, "Github_medium": 0.69, "Kubernetes": 0.91,
    "WashingtonPost": 0.86, "Github_hard": 0.41, "JsonSchemaStore": 0.30,
}
PAPER_SUITE_ANCHOR = {"categories_full": 13, "categories_under": 1}


# ------------------------------------------------------------------------------------------------- rows
def row_stats(row: dict[str, Any]) -> dict[str, Any]:
    """Counts derived from one per-schema row."""
    walks = row.get("walks") or []
    valid = [w for w in walks if w["valid"]]
    invalid = [w for w in walks if not w["valid"]]
    ok_statuses = ("accepted",)
    rejected = ("mask_rejects", "advance_rejects", "eos_not_allowed")
    s = {
        "compiled": bool(row.get("compile_ok")),
        "timeout": row.get("outcome") == "timeout",
        "valid_accepted": sum(w["status"] in ok_statuses for w in valid),
        "over": sum(w["status"] in rejected for w in valid),
        "under": sum(w["status"] in ok_statuses for w in invalid),
        "under_confirmed": sum(w["status"] in ok_statuses and w.get("label_ref") is False for w in invalid),
        "invalid_rejected": sum(w["status"] in rejected for w in invalid),
        "truncated": sum(w["status"] == "truncated" for w in walks),
        "walk_errors": sum(w["status"] in ("walk_error", "unencodable") for w in walks),
        "n_valid": row.get("n_valid", len(valid)),
        "n_invalid": row.get("n_invalid", len(invalid)),
        "label_disagree": sum(w.get("label_ref") is not None and w["label_ref"] != w["valid"] for w in walks),
        "probe_repeated_key": sum(p["status"] in ok_statuses for p in row.get("probes") or []),
        "probes": len(row.get("probes") or []),
    }
    walked_all = row.get("outcome") is None and len(walks) == s["n_valid"] + s["n_invalid"]
    s["covered"] = s["compiled"] and walked_all and s["valid_accepted"] == s["n_valid"]
    # diagnostic: rejected valid instances accepted once their keys are put in the schema's order
    s["over_key_order"] = sum(w["status"] in rejected and w.get("status_schema_order") == "accepted" for w in valid)
    s["covered_schema_order"] = s["compiled"] and walked_all and s["valid_accepted"] + s["over_key_order"] == s["n_valid"]
    # consistency of ours: token walk vs byte automaton vs fully committed canvas
    s["bytes_mismatch"] = sum(w.get("bytes_ok") is not None and w["status"] in ok_statuses + rejected
                              and w["bytes_ok"] != (w["status"] == "accepted") for w in walks)
    s["canvas_mismatch"] = sum(w.get("canvas_ok") is not None and w["status"] in ok_statuses + rejected
                               and w["canvas_ok"] != (w["status"] == "accepted") for w in walks)
    if row.get("suite") == "test-suite":
        if s["compiled"]:
            s["passed"] = walked_all and s["valid_accepted"] == s["n_valid"] and s["invalid_rejected"] == s["n_invalid"]
        else:
            s["passed"] = row.get("outcome") is None and s["n_valid"] == 0
    return s


def error_label(row: dict[str, Any]) -> str | None:
    if row.get("outcome"):
        return f"{row['outcome'].capitalize()}({row.get('phase')})"
    if row.get("compile_ok"):
        return None
    k = row.get("error_kind") or "Error"
    return f"{k}:{row['error_keyword']}" if row.get("error_keyword") else k


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# ------------------------------------------------------------------------------------------- summaries
def _group_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    st = [row_stats(r) for r in rows]
    n = len(rows)
    comp = [r["compile_s"] * 1e3 for r, s in zip(rows, st) if s["compiled"] and r.get("compile_s") is not None]
    masks = [x for r in rows for x in (r.get("mask_us") or [])]
    g: dict[str, Any] = {
        "n": n,
        "compiled": sum(s["compiled"] for s in st),
        "covered": sum(s["covered"] for s in st),
        "declared_coverage": (sum(s["compiled"] for s in st) / n) if n else None,
        "empirical_coverage": (sum(s["covered"] for s in st) / n) if n else None,
        "timeouts": sum(s["timeout"] for s in st),
        "crashes": sum(r.get("outcome") in ("crash", "oom") for r in rows),
        "valid_instances": sum(s["n_valid"] for s in st),
        "invalid_instances": sum(s["n_invalid"] for s in st),
        "over": sum(s["over"] for s in st),
        "over_schemas": sum(s["over"] > 0 for s in st),
        "over_key_order": sum(s["over_key_order"] for s in st),
        "covered_schema_order": sum(s["covered_schema_order"] for s in st),
        "under": sum(s["under"] for s in st),
        "under_confirmed": sum(s["under_confirmed"] for s in st),
        "under_schemas": sum(s["under"] > 0 for s in st),
        "truncated": sum(s["truncated"] for s in st),
        "walk_errors": sum(s["walk_errors"] for s in st),
        "label_disagree": sum(s["label_disagree"] for s in st),
        "bytes_mismatch": sum(s["bytes_mismatch"] for s in st),
        "canvas_mismatch": sum(s["canvas_mismatch"] for s in st),
        "probes": sum(s["probes"] for s in st),
        "probe_repeated_key": sum(s["probe_repeated_key"] for s in st),
        "compile_ms_p50": pct(comp, .5), "compile_ms_p90": pct(comp, .9), "compile_ms_p99": pct(comp, .99),
        "compile_ms_max": max(comp) if comp else None,
        "n_masks": len(masks), "mask_us_p50": pct(masks, .5), "mask_us_p95": pct(masks, .95),
        "mask_us_p99": pct(masks, .99), "mask_us_mean": (sum(masks) / len(masks)) if masks else None,
        "has_instances": any(r.get("n_valid", 0) + r.get("n_invalid", 0) > 0 for r in rows),
    }
    gens = [r["gen"] for r, s in zip(rows, st) if s["compiled"] and r.get("gen") is not None]
    if gens:
        ok = [x for x in gens if "error_kind" not in x]
        g["gen"] = {
            "attempted": len(gens),
            "schema_valid": sum(bool(x.get("schema_valid")) for x in gens),
            "compliance": sum(bool(x.get("schema_valid")) for x in gens) / len(gens),
            "json_ok": sum(bool(x.get("json_ok")) for x in gens),
            "duplicate_keys": sum(bool(x.get("duplicate_keys")) for x in gens),
            "errors": dict(Counter(x["error_kind"] for x in gens if "error_kind" in x)),
            "nfe_mean": statistics.fmean([x["nfe"] for x in ok]) if ok else None,
            "remasks_mean": statistics.fmean([x["remasks"] for x in ok]) if ok else None,
            "forced_mean": statistics.fmean([x.get("forced", 0) for x in ok]) if ok else None,
            "wall_s_p50": pct([x["wall_s"] for x in ok], .5),
            "wall_s_p90": pct([x["wall_s"] for x in ok], .9),
        }
    return g


def summarize_jsb(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by = defaultdict(list)
    engines, subsets = [], []
    for r in rows:
        by[(r["engine"], r["subset"])].append(r)
        if r["engine"] not in engines:
            engines.append(r["engine"])
        if r["subset"] not in subsets:
            subsets.append(r["subset"])
    out: dict[str, Any] = {"engines": engines, "subsets": subsets, "by_subset": {}, "total": {}, "errors": {},
                           "over_ids": {}, "under_ids": {}}
    for e in engines:
        erows = [r for r in rows if r["engine"] == e]
        out["total"][e] = _group_summary(erows)
        for s in subsets:
            if by[(e, s)]:
                out["by_subset"].setdefault(s, {})[e] = _group_summary(by[(e, s)])
        out["errors"][e] = dict(Counter(x for x in (error_label(r) for r in erows) if x).most_common())
        out["over_ids"][e] = sorted(r["id"] for r in erows if row_stats(r)["over"])
        out["under_ids"][e] = sorted(r["id"] for r in erows if row_stats(r)["under"])
    return out


def summarize_suite(rows: list[dict[str, Any]]) -> dict[str, Any]:
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    out: dict[str, Any] = {"engines": engines, "categories": sorted({r["subset"] for r in rows}), "by_engine": {}}
    for e in engines:
        cats: dict[str, list[bool]] = defaultdict(list)
        under_cats: Counter = Counter()
        over = under = 0
        for r in rows:
            if r["engine"] != e:
                continue
            s = row_stats(r)
            cats[r["subset"]].append(s["passed"])
            under_cats[r["subset"]] += s["under"]
            over += s["over"]
            under += s["under"]
        frac = {c: sum(v) / len(v) for c, v in sorted(cats.items())}
        out["by_engine"][e] = {
            "cases": sum(len(v) for v in cats.values()),
            "passed": sum(sum(v) for v in cats.values()),
            "categories": frac,
            "cases_per_category": {c: len(v) for c, v in sorted(cats.items())},
            "categories_full": sum(1 for v in frac.values() if v == 1.0),
            "n_categories": len(frac),
            "over": over,
            "under": under,
            "categories_under": sorted(c for c, k in under_cats.items() if k),
            "errors": dict(Counter(x for x in (error_label(r) for r in rows if r["engine"] == e) if x).most_common()),
            "failed_cases": sorted(r["id"] for r in rows if r["engine"] == e and not row_stats(r)["passed"]),
        }
    return out


# ---------------------------------------------------------------------------------------------- markdown
def _f(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        return f"{x:.{nd}f}"
    return str(x)


def _ratio(num: int, den: int) -> str:
    return f"{num}/{den} ({num / den:.2f})" if den else "-"


def jsb_markdown(summ: dict[str, Any], meta: dict[str, Any], plots: list[str]) -> str:
    L = ["# JSONSchemaBench: coverage and mask soundness", ""]
    L += _meta_lines(meta)
    L += ["", "## Per subset", "",
          "Coverage = schemas / n. Over = valid instances rejected (schemas). Under = invalid instances accepted "
          "(confirmed by the reference validator) (schemas). Compile in ms, mask in µs per token (valid-instance walks).",
          "", "| subset | engine | n | declared cov. | empirical cov. | paper anchor (Guidance) | over | under | "
          "timeouts | compile p50 / p90 / max ms | mask p50 / p95 / p99 µs |",
          "|" + "---|" * 11]
    for s in summ["subsets"] + ["TOTAL"]:
        groups = summ["total"] if s == "TOTAL" else summ["by_subset"].get(s, {})
        for e in summ["engines"]:
            g = groups.get(e)
            if not g:
                continue
            emp = _ratio(g["covered"], g["n"]) if g["has_instances"] else "n/a (no instances)"
            anchor = _f(PAPER_ANCHORS.get(s), 2) if s != "TOTAL" else ""
            L.append(f"| {s} | {e} | {g['n']} | {_ratio(g['compiled'], g['n'])} | {emp} | {anchor} | "
                     f"{g['over']} ({g['over_schemas']}) | {g['under']} ({g['under_confirmed']}) ({g['under_schemas']}) | "
                     f"{g['timeouts']} | {_f(g['compile_ms_p50'])} / {_f(g['compile_ms_p90'])} / {_f(g['compile_ms_max'])} | "
                     f"{_f(g['mask_us_p50'])} / {_f(g['mask_us_p95'])} / {_f(g['mask_us_p99'])} |")
    L += ["", "## Instances", "",
          "`over, key order only` = rejected valid instances accepted once their object keys are put in the order "
          "the schema declares them (a diagnostic; the coverage columns above use the instances as given).", "",
          "| engine | valid inst. | invalid inst. | over | over, key order only | empirical cov. with keys in schema order | "
          "under | under confirmed | truncated walks | walk errors | dataset label ≠ reference validator |",
          "|" + "---|" * 11]
    for e in summ["engines"]:
        g = summ["total"][e]
        L.append(f"| {e} | {g['valid_instances']} | {g['invalid_instances']} | {g['over']} | {g['over_key_order']} | "
                 f"{_ratio(g['covered_schema_order'], g['n'])} | {g['under']} | "
                 f"{g['under_confirmed']} | {g['truncated']} | {g['walk_errors']} | {g['label_disagree']} |")
    if any(summ["total"][e]["probes"] for e in summ["engines"]):
        L += ["", "Repeated-key probe: the first valid object instance of each schema spelled with its first member "
                  "written again at the end (`{\"a\":1,\"b\":2,\"a\":1}`). Not counted as under-constraint (json.loads "
                  "gives the same value), but no engine should emit it: "
              + ", ".join(f"{e} accepted {summ['total'][e]['probe_repeated_key']}/{summ['total'][e]['probes']}"
                          for e in summ["engines"]) + "."]
    if "ours" in summ["total"]:
        g = summ["total"]["ours"]
        L += ["", f"Cross-checks of ours (walks whose verdict differs): byte automaton on the text {g['bytes_mismatch']}, "
                  f"fully committed canvas of len+1 positions {g['canvas_mismatch']}."]
    L += ["", "## Refusals (error kind: schemas)", ""]
    for e in summ["engines"]:
        errs = summ["errors"].get(e) or {}
        L.append(f"- **{e}**: " + (", ".join(f"{k} {v}" for k, v in errs.items()) if errs else "none"))
    gens = {e: summ["total"][e]["gen"] for e in summ["engines"] if "gen" in summ["total"][e]}
    if gens:
        L += ["", "## Generation (model under the schema)", "",
              "Schema-valid = parses, validates (reference validator) and repeats no key within an object.", "",
              "| subset | engine | attempted | schema-valid (compliance) | JSON ok | repeated keys | errors | NFE mean | "
              "remasks mean | forced mean | wall p50 / p90 s |", "|" + "---|" * 11]
        for s in summ["subsets"] + ["TOTAL"]:
            groups = summ["total"] if s == "TOTAL" else summ["by_subset"].get(s, {})
            for e in summ["engines"]:
                gg = (groups.get(e) or {}).get("gen")
                if not gg:
                    continue
                L.append(f"| {s} | {e} | {gg['attempted']} | {_ratio(gg['schema_valid'], gg['attempted'])} | "
                         f"{gg['json_ok']} | {gg['duplicate_keys']} | {json.dumps(gg['errors']) if gg['errors'] else '-'} | "
                         f"{_f(gg['nfe_mean'])} | "
                         f"{_f(gg['remasks_mean'])} | {_f(gg['forced_mean'])} | {_f(gg['wall_s_p50'], 2)} / {_f(gg['wall_s_p90'], 2)} |")
    for kind in ("over", "under"):
        ids = {e: v for e, v in summ[f"{kind}_ids"].items() if v}
        if ids:
            L += ["", f"## Schemas with {kind}-constraint", ""]
            for e, v in ids.items():
                L.append(f"- **{e}** ({len(v)}): " + ", ".join(f"`{i}`" for i in v[:40]) + (" ..." if len(v) > 40 else ""))
    if plots:
        L += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(L) + "\n"


def suite_markdown(summ: dict[str, Any], meta: dict[str, Any], plots: list[str]) -> str:
    L = ["# JSON-Schema-Test-Suite (draft 2020-12)", ""]
    L += _meta_lines(meta)
    L += ["", "| engine | cases passed | categories at 100% | paper anchor (Guidance) | over (valid rejected) | "
              "under (invalid accepted) | categories with under-constraint |", "|---|---|---|---|---|---|---|"]
    for e in summ["engines"]:
        b = summ["by_engine"][e]
        L.append(f"| {e} | {_ratio(b['passed'], b['cases'])} | {b['categories_full']}/{b['n_categories']} | "
                 f"{PAPER_SUITE_ANCHOR['categories_full']} at 100%, {PAPER_SUITE_ANCHOR['categories_under']} under | "
                 f"{b['over']} | {b['under']} | {', '.join(b['categories_under']) or '0'} |")
    L += ["", "Pass fraction per category (cases):", "",
          "| category | cases | " + " | ".join(summ["engines"]) + " |", "|---|---|" + "---|" * len(summ["engines"])]
    first = summ["by_engine"][summ["engines"][0]] if summ["engines"] else {"cases_per_category": {}}
    for c in summ["categories"]:
        L.append(f"| {c} | {first['cases_per_category'].get(c, '-')} | " + " | ".join(
            _f(summ["by_engine"][e]["categories"].get(c), 2) for e in summ["engines"]) + " |")
    L += ["", "## Refusals (error kind: cases)", ""]
    for e in summ["engines"]:
        errs = summ["by_engine"][e]["errors"]
        L.append(f"- **{e}**: " + (", ".join(f"{k} {v}" for k, v in errs.items()) if errs else "none"))
    L += ["", "## Failed cases", ""]
    for e in summ["engines"]:
        v = summ["by_engine"][e]["failed_cases"]
        L.append(f"- **{e}** ({len(v)}): " + (", ".join(f"`{i}`" for i in v) if v else "none"))
    if plots:
        L += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(L) + "\n"


def _meta_lines(meta: dict[str, Any]) -> list[str]:
    L = ["```", f"command:   {meta.get('command', '?')}"]
    for k in ("data", "tokenizer", "n_records", "timeout_s", "max_tokens", "machine", "python", "torch", "left_out"):
        if k in meta:
            L.append(f"{k + ':':<10} {meta[k]}")
    for e, v in (meta.get("engines") or {}).items():
        L.append(f"engine:    {e}: {v}")
    for r in meta.get("runs") or []:
        code = f"; constraint layer {r['code']} sha {r.get('constraints_sha256')}" if r.get("code") else ""
        note = f" ({r['note']})" if r.get("note") else ""
        L.append(f"run:       {r.get('started')} .. {r.get('finished')} ({r.get('wall_s')} s) computed "
                 f"{json.dumps(r.get('computed'))}{code}{note}")
    codes = meta.get("row_code_versions")
    if codes:
        L.append(f"ours rows by constraint-layer version: {json.dumps(codes)}")
    L.append("```")
    return L


# ---------------------------------------------------------------------------------------------- plots
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ecdf(ax, xs: list[float], label: str) -> None:
    if not xs:
        return
    s = sorted(max(x, 1e-3) for x in xs)
    ys = [(i + 1) / len(s) for i in range(len(s))]
    ax.step(s, ys, where="post", label=f"{label} (n={len(s)})")


def jsb_plots(rows: list[dict[str, Any]], summ: dict[str, Any], out_dir: Path, timeout_s: float) -> list[str]:
    plt = _plt()
    paths = []
    engines, subsets = summ["engines"], summ["subsets"]
    # coverage per subset
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(subsets) + 3.5), 4.2))
    w = 0.8 / max(1, len(engines))
    for k, e in enumerate(engines):
        xs = [i - 0.4 + w * (k + 0.5) for i in range(len(subsets))]
        dec = [(summ["by_subset"].get(s, {}).get(e) or {}).get("declared_coverage") or 0 for s in subsets]
        emp = [(summ["by_subset"].get(s, {}).get(e) or {}).get("empirical_coverage") or 0 for s in subsets]
        bars = ax.bar(xs, dec, w * 0.95, alpha=0.35)
        ax.bar(xs, emp, w * 0.95, color=bars.patches[0].get_facecolor()[:3], label=e)
    anchors = [(i, PAPER_ANCHORS[s]) for i, s in enumerate(subsets) if s in PAPER_ANCHORS]
    if anchors:
        ax.scatter([a[0] for a in anchors], [a[1] for a in anchors], marker="_", s=900, c="k", zorder=5,
                   label="paper: Guidance empirical")
    ax.set_xticks(range(len(subsets)))
    ax.set_xticklabels(subsets, rotation=30, ha="right")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("coverage (solid: empirical, light: declared)")
    ax.set_title("JSONSchemaBench coverage per subset")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    p = out_dir / "coverage_per_subset.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(str(p))
    # compile-time distribution
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for e in engines:
        xs = []
        for r in rows:
            if r["engine"] != e:
                continue
            if r.get("compile_ok") and r.get("compile_s") is not None:
                xs.append(r["compile_s"] * 1e3)
            elif r.get("outcome") == "timeout" and r.get("phase") == "compile":
                xs.append(timeout_s * 1e3)
        _ecdf(ax, xs, e)
    ax.set_xscale("log")
    ax.set_xlabel("compile time (ms, log; compile timeouts at the limit)")
    ax.set_ylabel("fraction of schemas (compiled or timed out)")
    ax.set_title("Compile-time distribution (ECDF)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out_dir / "compile_time.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(str(p))
    # mask-time distribution
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for e in engines:
        _ecdf(ax, [x for r in rows if r["engine"] == e for x in (r.get("mask_us") or [])], e)
    ax.set_xscale("log")
    ax.set_xlabel("per-token mask time (µs, log)")
    ax.set_ylabel("fraction of masks")
    ax.set_title("Mask-time distribution over valid-instance walks (ECDF)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out_dir / "mask_time.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(str(p))
    return paths


def suite_plots(summ: dict[str, Any], out_dir: Path) -> list[str]:
    plt = _plt()
    cats, engines = summ["categories"], summ["engines"]
    fig, ax = plt.subplots(figsize=(7, max(4, 0.22 * len(cats) + 1.5)))
    h = 0.8 / max(1, len(engines))
    for k, e in enumerate(engines):
        ys = [i - 0.4 + h * (k + 0.5) for i in range(len(cats))]
        ax.barh(ys, [summ["by_engine"][e]["categories"].get(c, 0) for c in cats], h * 0.95, label=e)
    ax.set_yticks(range(len(cats)))
    ax.set_yticklabels(cats, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of test cases passed")
    ax.set_title("JSON-Schema-Test-Suite draft 2020-12, per category")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    p = out_dir / "test_suite_categories.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return [str(p)]


# ---------------------------------------------------------------------------------------------- files
def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    rows = []
    p = Path(path)
    if not p.is_file():
        return rows
    with open(p, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by an interrupted run
                continue
    return rows


def write_reports(suite: str, rows: list[dict[str, Any]], meta: dict[str, Any], out_dir: Path,
                  plots: bool = True) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    codes = Counter(r.get("code", "unrecorded") for r in rows if r["engine"] == "ours")
    meta = {**meta, "row_code_versions": dict(codes)} if codes else meta
    if suite == "jsonschemabench":
        summ = summarize_jsb(rows)
        pngs = jsb_plots(rows, summ, out_dir, float(meta.get("timeout_s") or 0)) if plots and rows else []
        md = jsb_markdown(summ, meta, pngs)
    else:
        summ = summarize_suite(rows)
        pngs = suite_plots(summ, out_dir) if plots and rows else []
        md = suite_markdown(summ, meta, pngs)
    (out_dir / "summary.json").write_text(json.dumps({"meta": meta, "summary": summ}, indent=1, default=str))
    (out_dir / "summary.md").write_text(md)
    return {"summary": summ, "markdown": md, "plots": pngs}
