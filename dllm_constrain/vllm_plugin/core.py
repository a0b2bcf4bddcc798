"""The vLLM-independent half of the plugin: request specs, the compiled-constraint cache, and the
per-request canvas state that answers "which tokens may the next position take".

Nothing here imports vLLM, so it is tested in the project's own environment; `routing.py` and
`logits_processor.py` bind it to vLLM's objects.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..constraints import CompiledConstraint, ConstraintCompiler, TokenizerInfo
from ..constraints.matcher import LeftToRightMatcher
from ..constraints.compiler import COMPILE_CACHE, CompileCache
from ..engine.state import STRICT_SCHEMA_OPTIONS
from ..kernels.bitmask import packed_width, write_row
from ..errors import ConstraintError
from ..serve.constraint_fields import JSON_OBJECT_SCHEMA, choice_regex

# vLLM configures handlers on its "vllm" logger; a child of it prints with vLLM's own format and level.
logger = logging.getLogger("vllm.dllm_constrain")

# SamplingParams.extra_args key that carries a claimed constraint from the frontend to the sampler.
EXTRA_KEY = "dllm_constrain"
KINDS = ("json_schema", "regex")
# How a server compiles response_format json_schema: "strict" (default) or "spec" (docs/vllm.md, "Using the plugin")
SEMANTICS_ENV = "DLLM_CONSTRAIN_VLLM_SCHEMA_SEMANTICS"


class SpecError(ValueError):
    """A malformed `extra_args["dllm_constrain"]` entry."""


def default_strict() -> bool:
    """Whether a json_schema request without its own "strict" compiles with the generation narrowings
    (STRICT_SCHEMA_OPTIONS: no undeclared properties unless the schema allows them, properties in declared
    order), as vLLM's default backend does (xgrammar's compile_json_schema: strict_mode=True, any_order=False);
    `DLLM_CONSTRAIN_VLLM_SCHEMA_SEMANTICS=spec` gives the JSON Schema specification's semantics instead."""
    value = os.environ.get(SEMANTICS_ENV, "strict")
    if value not in ("strict", "spec"):
        raise ValueError(f'{SEMANTICS_ENV} must be "strict" or "spec", got {value!r}')
    return value == "strict"


def spec_from_structured_outputs(so: Any) -> dict | None:
    """vLLM's StructuredOutputsParams (duck-typed) -> {"kind", "source"[, "strict"]}, or None for the kinds
    this plugin leaves to vLLM (grammar, structural_tag).

    response_format json_schema arrives as `so.json` (a dict or a JSON string; compiled strictly unless the
    server says otherwise, `default_strict`), json_object as `so.json_object` (any JSON object: the
    specification's semantics), guided regex as `so.regex`, guided choice as `so.choice`."""
    if so is None:
        return None
    js = getattr(so, "json", None)
    if js is not None:
        text = js if isinstance(js, str) else json.dumps(js, separators=(",", ":"), ensure_ascii=False)
        return {"kind": "json_schema", "source": text, "strict": default_strict()}
    if getattr(so, "json_object", None):
        return {"kind": "json_schema", "source": json.dumps(JSON_OBJECT_SCHEMA, separators=(",", ":")),
                "strict": False}
    rx = getattr(so, "regex", None)
    if rx is not None:
        return {"kind": "regex", "source": rx}
    choice = getattr(so, "choice", None)
    if choice:
        return {"kind": "regex", "source": choice_regex([str(c) for c in choice])}
    return None


def check_spec(spec: Any) -> dict:
    """Validate an extra_args entry; returns it."""
    if not isinstance(spec, dict):
        raise SpecError(f'extra_args["{EXTRA_KEY}"] must be an object with "kind" and "source", '
                        f"got {type(spec).__name__}")
    kind, source = spec.get("kind"), spec.get("source")
    if kind not in KINDS:
        raise SpecError(f'extra_args["{EXTRA_KEY}"]["kind"] must be one of {list(KINDS)}, got {kind!r}')
    if not isinstance(source, str):
        raise SpecError(f'extra_args["{EXTRA_KEY}"]["source"] must be a string, got {type(source).__name__}')
    if not isinstance(spec.get("strict", False), bool):
        raise SpecError(f'extra_args["{EXTRA_KEY}"]["strict"] must be true or false, '
                        f"got {type(spec['strict']).__name__}")
    return spec


def spec_strict(spec: dict) -> bool:
    """Whether a json_schema spec compiles with the generation narrowings (absent: the server's default)."""
    return bool(spec.get("strict", default_strict()))


def spec_digest(spec: dict) -> str:
    strict = "strict" if spec["kind"] == "json_schema" and spec_strict(spec) else ""
    return hashlib.sha256(f"{spec['kind']}\x00{strict}\x00{spec['source']}".encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------- caches
_INFO_LOCK = threading.Lock()
_INFOS: dict[tuple, TokenizerInfo] = {}


def tokenizer_info_for(tokenizer: Any, vocab_size: int, key: Any = None) -> TokenizerInfo:
    """TokenizerInfo of a tokenizer (a transformers fast tokenizer, a tokenizers.Tokenizer or a
    tokenizer.json path), as wide as the model's logits; one per (key, vocab_size) in this process."""
    k = (id(tokenizer) if key is None else key, int(vocab_size))
    with _INFO_LOCK:
        hit = _INFOS.get(k)
    if hit is not None:
        return hit
    info = TokenizerInfo.from_tokenizer(tokenizer, vocab_size=int(vocab_size))
    with _INFO_LOCK:
        _INFOS[k] = info
    return info


class ConstraintCache:
    """The plugin's door to the compiler's cache: compiled constraints (and refusals) per (tokenizer
    fingerprint, normalised schema or regex), in the process's one bounded LRU (`compiler.COMPILE_CACHE`), so
    a schema vLLM compiles at admission (frontend) and again in the sampler's process costs one compilation
    per process, and a bad schema sent twice is refused twice without a second one. `maxsize` gives this
    door a store of its own (tests)."""

    def __init__(self, maxsize: int | None = None) -> None:
        self.store = COMPILE_CACHE if maxsize is None else CompileCache(maxsize)

    def __len__(self) -> int:
        return len(self.store)

    @property
    def hits(self) -> int:
        return self.store.hits

    @property
    def misses(self) -> int:
        return self.store.misses

    def get(self, info: TokenizerInfo, spec: dict, where: str = "") -> CompiledConstraint:
        check_spec(spec)
        compiler = ConstraintCompiler(info, cache=self.store)
        t0, misses = time.perf_counter(), self.store.misses
        status = "ok"
        try:
            if spec["kind"] == "json_schema":
                options = STRICT_SCHEMA_OPTIONS if spec_strict(spec) else {}
                return compiler.compile(schema=spec["source"], **options)  # type: ignore[return-value]
            return compiler.compile(regex=spec["source"])  # type: ignore[return-value]
        except ConstraintError as e:
            status = "refused: " + str(e)
            raise
        finally:
            if self.store.misses != misses:
                logger.info("dllm_constrain: compiled %s %s (%d chars) in %.3fs%s: %s", spec["kind"],
                            spec_digest(spec), len(spec["source"]), time.perf_counter() - t0,
                            f" [{where}]" if where else "", status)


CACHE = ConstraintCache()


# ------------------------------------------------------------------------------- request state
class RequestConstraint:
    """One request's canvas constraint, seen from an autoregressive sampler.

    The canvas is the answer region: `max_tokens` positions, the tokens generated so far committed on
    its left and every later position open. The mask for the next position is the constraint's
    per-position mask there (`allowed_tokens(canvas, [k])`), so the answer is valid *and* fits in
    max_tokens: the layer only offers a token when a valid completion of the remaining length exists.

    The state's calls run without the layer's per-call deadline (`timeout_s=None`) by default: when a call
    hits it, the layer answers the frontier from its left-to-right prefix check, an over-approximation that
    our own engine verifies before committing (select_commits) but that vLLM's sampler would draw from
    directly, and a drawn token with no completion in the positions left ends the answer unfinished (seen
    near the end of 128-token answers with the random tiny Llama's long strings). Exact rows cost the
    occasional slow step instead (docs/vllm.md, "Figures").
    """

    def __init__(self, compiled: CompiledConstraint, max_tokens: int, logits_width: int,
                 timeout_s: float | None = None):
        self.compiled = compiled
        self.n = int(max_tokens)
        self.width = int(logits_width)
        # ConstraintTooLongError when nothing fits
        self.state = compiled.new_canvas_state(self.n, timeout_s=timeout_s)
        self.mask_id = compiled.mask_id
        self.steps = 0
        # exact rows without a deadline: the layer's bounded left-to-right matcher (matcher.py), its forward set
        # carried token by token (docs/vllm.md, "Figures")
        self.left_to_right = compiled.matcher(self.n) if timeout_s is None else None

    def next_row(self, output_ids: Sequence[int]) -> torch.Tensor | None:
        """Bool [width]: the tokens allowed at the next position, or None when the canvas is full."""
        dst = np.zeros(packed_width(self.width) * 4, dtype=np.uint8)
        if self.fill_row(output_ids, dst) is None:
            return None
        return torch.from_numpy(np.unpackbits(dst, count=self.width, bitorder="little").view(np.bool_))

    def fill_row(self, output_ids: Sequence[int], dst: np.ndarray) -> bool | None:
        """Write the next position's mask row into `dst` (the uint8 bytes of one token-bitmask row,
        kernels.bitmask's layout; tokens past the constraint's vocabulary are not allowed) and tell whether it
        allows some token; None, and `dst` untouched, when the canvas is full."""
        k = len(output_ids)
        if k >= self.n:
            return None
        if self.left_to_right is not None:
            row = self._follow(output_ids).packed_row()
            write_row(dst, row)
            nonempty = row is not None  # the algebra's rows hold a token of a valid completion, or are None
        else:
            canvas = list(output_ids) + [self.mask_id] * (self.n - k)
            row = self.state.allowed_tokens(canvas, [k])[0].numpy()
            write_row(dst, row)
            nonempty = bool(row.any())
        self.steps += 1
        return nonempty

    def _follow(self, output_ids: Sequence[int]) -> LeftToRightMatcher:
        """The matcher advanced over `output_ids` (usually the one token sampled since the last step)."""
        m = self.left_to_right
        if len(output_ids) < m.consumed:  # not expected (outputs only grow); start over
            m.reset()
        for i in range(m.consumed, len(output_ids)):
            m.advance(int(output_ids[i]))
        return m

    def accepts(self, output_ids: Sequence[int]) -> bool:
        return self.compiled.accepts_tokens(output_ids)
