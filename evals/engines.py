"""Engine adapters: one small protocol so every engine is walked by the same code.

    adapter = make_adapter(spec, tokenizer_dir, timeout_s)
    adapter.name, adapter.version, adapter.vocab_size, adapter.eos_id
    compiled = adapter.compile(schema)          # schema: a Python object (dict / bool); raises when refused
    m = adapter.new_matcher(compiled)
    m.fill_mask()                               # the full next-token mask (timed by the caller)
    m.is_allowed(token_id) -> bool              # reads the last mask
    m.advance(token_id) -> bool                 # consume; False = rejected
    adapter.error_kind(exc) -> (kind, keyword)  # how a refusal is reported
    adapter.extra_checks(compiled, text, ids, walk_accepted) -> dict   # optional engine-specific checks

Built in: "ours" (this package's constraint layer, left-to-right over the same token automaton the canvas masks
use), "llguidance", "xgrammar", "outlines" (outlines-core): benchmark-only extras, imported only when asked for
(`pip install llguidance xgrammar`). A custom adapter is "package.module:factory" or "path/to/file.py:factory",
factory(tokenizer_dir, timeout_s). The other engines are configured as ../shared/tools/anchors_mask_bench.py
does (xgrammar strict_mode=False / any_whitespace=True, llguidance defaults, outlines-core
build_regex_from_schema + Index over the byte-level vocabulary); compilation is never cached across schemas.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

BUILTIN = ("ours", "llguidance", "xgrammar", "outlines")
ALIASES = {"outlines_core": "outlines", "outlines-core": "outlines", "dllm_constrain": "ours", "dllm-constrain": "ours"}


def canonical_name(spec: str) -> str:
    return ALIASES.get(spec, spec)


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "?"


def _bit(words: np.ndarray, tid: int) -> bool:
    return (int(words[tid >> 5]) >> (tid & 31)) & 1 == 1


def _type_name(e: BaseException) -> str:
    return type(e).__name__


# ------------------------------------------------------------------------------------------------ ours
class OursAdapter:
    name = "ours"

    def __init__(self, tokdir: str, timeout_s: float | None):
        import torch

        from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo

        torch.set_num_threads(1)
        from .tok import special_ids

        self.info = TokenizerInfo.from_tokenizer(tokdir, **special_ids(tokdir))
        self.info.trie()  # once per tokenizer: setup, not compile
        self.vocab_size = self.info.vocab_size
        self.eos_id = self.info.eos_id
        # cache=False: cold compile times, and memory does not grow over thousands of schemas
        self.compiler = ConstraintCompiler(self.info, timeout_s=timeout_s, cache=False)
        self.version = f"dllm-constrain {_version('dllm-constrain')} (whitespace=compact, left-to-right walk)"

    def compile(self, schema: Any):
        return self.compiler.compile_json_schema(schema)

    def new_matcher(self, compiled):
        from dllm_constrain.constraints.bench_adapter import MaskMatcher

        return MaskMatcher(compiled.matcher())

    @staticmethod
    def error_kind(e: BaseException) -> tuple[str, str | None]:
        return _type_name(e), getattr(e, "keyword", None)

    def extra_checks(self, compiled, text: str, ids: list[int], walk_accepted: bool) -> dict[str, Any]:
        """Cross-checks of the same compiled constraint: the byte automaton on the text, and a canvas of
        exactly len(ids)+1 positions fully committed (ids + EOS) being completable (the dLLM path)."""
        out: dict[str, Any] = {}
        try:
            out["bytes_ok"] = bool(compiled.accepts_text(text))
        except Exception as e:  # pragma: no cover - reported, not fatal
            out["bytes_ok"] = None
            out["bytes_error"] = _type_name(e)
        try:
            st = compiled.new_canvas_state(len(ids) + 1)
            out["canvas_ok"] = bool(st.is_completable(list(ids) + [self.eos_id]))
        except Exception as e:
            if _type_name(e) == "ConstraintTooLongError":
                out["canvas_ok"] = False
            else:
                out["canvas_ok"] = None
                out["canvas_error"] = _type_name(e)
        return out


# ------------------------------------------------------------------------------------------ llguidance
def _hf_tokenizer(tokdir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokdir)


class LLGuidanceAdapter:
    name = "llguidance"

    def __init__(self, tokdir: str, timeout_s: float | None):
        import llguidance
        import llguidance.hf

        self.llg = llguidance
        tok = _hf_tokenizer(tokdir)
        self.eos_id = tok.eos_token_id
        self.lltok = llguidance.hf.from_tokenizer(tok)
        self.vocab_size = self.lltok.vocab_size
        self.words = np.zeros((self.vocab_size + 31) // 32, dtype=np.int32)
        self.version = f"llguidance {_version('llguidance')}"

    def compile(self, schema: Any):
        g = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        m = self.llg.LLMatcher(self.lltok, g, log_level=0)
        if m.is_error():
            raise RuntimeError(m.get_error())
        return m

    def new_matcher(self, compiled):
        a = self

        class M:
            def __init__(self):
                self.m = compiled.deep_copy()

            def fill_mask(self):
                self.m.unsafe_compute_mask_ptr(a.words.ctypes.data, a.words.nbytes)

            def is_allowed(self, tid):
                return _bit(a.words, tid)

            def advance(self, tid):
                return bool(self.m.consume_token(tid)) and not self.m.is_error()

        return M()

    @staticmethod
    def error_kind(e: BaseException) -> tuple[str, str | None]:
        return _type_name(e), None


# -------------------------------------------------------------------------------------------- xgrammar
class XGrammarAdapter:
    name = "xgrammar"

    def __init__(self, tokdir: str, timeout_s: float | None):
        import xgrammar as xgr

        self.xgr = xgr
        tok = _hf_tokenizer(tokdir)
        self.vocab_size = len(tok)
        self.eos_id = tok.eos_token_id
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=self.vocab_size)
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
        self.words = self.bitmask.numpy()[0]
        self.version = f"xgrammar {_version('xgrammar')} (strict_mode=False, any_whitespace=True)"

    def compile(self, schema: Any):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=True, strict_mode=False)

    def new_matcher(self, compiled):
        a = self

        class M:
            def __init__(self):
                self.m = a.xgr.GrammarMatcher(compiled)

            def fill_mask(self):
                self.m.fill_next_token_bitmask(a.bitmask)

            def is_allowed(self, tid):
                return _bit(a.words, tid)

            def advance(self, tid):
                return bool(self.m.accept_token(tid))

        return M()

    @staticmethod
    def error_kind(e: BaseException) -> tuple[str, str | None]:
        return _type_name(e), None


# -------------------------------------------------------------------------------------- outlines-core
class OutlinesAdapter:
    name = "outlines"

    def __init__(self, tokdir: str, timeout_s: float | None):
        import outlines_core as oc

        from dllm_constrain.constraints import TokenizerInfo

        self.oc = oc
        from .tok import special_ids

        info = TokenizerInfo.from_tokenizer(tokdir, **special_ids(tokdir))  # token bytes, specials, EOS only
        self.eos_id = info.eos_id
        vocab: dict[bytes, list[int]] = {}
        for i, b in enumerate(info.token_bytes):
            if b is not None and i not in info.special_ids:
                vocab.setdefault(b, []).append(i)
        self.vocab = oc.Vocabulary(self.eos_id, vocab)
        self.vocab_size = info.vocab_size
        self.words = np.zeros((self.vocab_size + 31) // 32, dtype=np.int32)
        self.version = f"outlines-core {_version('outlines_core')} (build_regex_from_schema + Index)"

    def compile(self, schema: Any):
        rx = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Index(rx, self.vocab)

    def new_matcher(self, compiled):
        a = self

        class M:
            def __init__(self):
                self.g = a.oc.Guide(compiled)

            def fill_mask(self):
                self.g.write_mask_into(a.words.ctypes.data, a.words.size, 4)

            def is_allowed(self, tid):
                return _bit(a.words, tid)

            def advance(self, tid):
                try:
                    self.g.advance(tid, return_tokens=False)
                    return True
                except Exception:
                    return False

        return M()

    @staticmethod
    def error_kind(e: BaseException) -> tuple[str, str | None]:
        return _type_name(e), None


# ---------------------------------------------------------------------------------------------- factory
def make_adapter(spec: str, tokdir: str, timeout_s: float | None = None):
    spec = canonical_name(spec)
    if spec == "ours":
        return OursAdapter(tokdir, timeout_s)
    if spec == "llguidance":
        return LLGuidanceAdapter(tokdir, timeout_s)
    if spec == "xgrammar":
        return XGrammarAdapter(tokdir, timeout_s)
    if spec == "outlines":
        return OutlinesAdapter(tokdir, timeout_s)
    target, _, fn = spec.rpartition(":")
    if not target:
        raise ValueError(f"unknown engine {spec!r}: one of {', '.join(BUILTIN)} or 'module:factory' / 'file.py:factory'")
    if target.endswith(".py"):
        path = Path(target)
        mod_spec = importlib.util.spec_from_file_location(f"_evals_engine_{path.stem}", path)
        if mod_spec is None or mod_spec.loader is None:
            raise ValueError(f"cannot load engine file {target}")
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(target)
    return getattr(mod, fn or "make")(tokdir, timeout_s)


def engine_label(spec: str) -> str:
    """Short name for tables: builtin names as is, custom specs by their factory's module/file stem."""
    spec = canonical_name(spec)
    if spec in BUILTIN:
        return spec
    target, _, fn = spec.rpartition(":")
    return (Path(target).stem if target.endswith(".py") else target.rsplit(".", 1)[-1]) + (f":{fn}" if fn else "")


def installed(spec: str) -> tuple[bool, str]:
    """Whether a builtin engine's package is importable (custom specs are assumed to be)."""
    spec = canonical_name(spec)
    mod = {"llguidance": "llguidance", "xgrammar": "xgrammar", "outlines": "outlines_core"}.get(spec)
    if mod is None:
        return True, ""
    if importlib.util.find_spec(mod) is None:
        return False, f"{spec} is not installed (pip install {'outlines-core' if spec == 'outlines' else spec})"
    return True, ""


def thread_env(threads: int = 1) -> dict[str, str]:
    t = str(int(threads))
    env = dict(os.environ)
    env.update(RAYON_NUM_THREADS=t, OMP_NUM_THREADS=t, MKL_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t,
               TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error", PYTHONWARNINGS="ignore")
    return env
