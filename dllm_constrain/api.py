"""The public API: `generate()` for one-liners, `LLM` for users who want result objects and counters.

    import dllm_constrain as dc
    dc.generate("Name Ada, age 36", schema={"type": "object", ...})      # -> str (bundled model)
    llm = dc.LLM("path/to/checkpoint")                                    # load once
    [res] = llm.generate(["..."], max_new_tokens=64, policy="threshold")  # -> list[GenerationResult]

A list of prompts runs as one batch. `model=None` means the bundled checkpoint (dllm_constrain/bundled);
`model` may also be a checkpoint folder path, an `LLM`, or a `LoadedModel` from `engine.loader`. Loaded checkpoints are kept in one explicit,
small cache of `LLM` objects keyed by resolved path (`clear_model_cache()` empties it); compiled
constraints are cached inside each `LLM`, per constraint, for its tokenizer.

Threads: each `LLM` owns one engine loop thread (dllm_constrain.engine_loop, started by the first call): `generate`
and `dc.generate` hand their requests to it and wait, so any number of threads may call them at once; their
requests share one continuous batch and each result equals the single-threaded one for its seed. `LLM.submit`
queues a call without waiting (a CallHandle); `dllm_constrain.AsyncLLM` is the asyncio front end.
"""
from __future__ import annotations

import inspect
import json
import math
import numbers
import os
import re
import threading
from dataclasses import dataclass
from collections import OrderedDict
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import tokenizers

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import GenerationResult, LLMEngine, ProgressCallback
from dllm_constrain.engine.model_runner import model_device
from dllm_constrain.engine.placement import model_dtype
from dllm_constrain.engine_loop import CallHandle, EngineLoop, StreamCallback
from dllm_constrain.engine.state import POLICY_NAMES, Request, SamplingParams
from dllm_constrain.errors import (
    CheckpointError,
    ConstraintTooLongError,
    InvalidGrammarError,
    InvalidRegexError,
    InvalidRequestError,
    InvalidSchemaError,
)
from dllm_constrain.prompting import format_prompt, schema_sketch

__all__ = ["LLM", "GenerationResult", "generate", "bundled_model_path", "clear_model_cache"]

GRAMMAR_ISSUE = "Context-free grammars (Lark) at commit steps"
CONSTRAINT_ISSUE = "The constraint layer: JSON Schema and regex compiled to per-position token masks at commit steps"
PROMPT_FORMATS = ("auto", "request", "raw")
_CACHE_SIZE = 4
# JSON Schema options for generation (like xgrammar's strict_mode): an object schema that does not say
# `additionalProperties` gets no undeclared properties, a schema without `type` produces the types its
# keywords imply, undeclared property names (where the schema allows them) are never empty, properties come in
# their declared order (what a model asked for the schema writes; any-order member sets make the canvas
# explore many more states: docs/constraints.md, Figures), integers are written without ".0" and free-form
# values nest at most 3 levels (6 for the spec semantics: deeper free-form values cost the canvas states).
# All are sound narrowings; `strict=False` compiles with the specification's defaults.
STRICT_SCHEMA_OPTIONS: dict[str, Any] = {"additional_properties": "forbid", "untyped_types": "inferred",
                                         "additional_names": "nonempty", "property_order": "declared",
                                         "integer_zero_fraction": "never", "any_json_depth": 3}
_LLM_CACHE: "OrderedDict[str, LLM]" = OrderedDict()
_CACHE_LOCK = threading.Lock()  # generate(model=None | path) from many threads loads a checkpoint once
_LOOP_LOCK = threading.Lock()


def bundled_model_path() -> Path:
    """The checkpoint folder shipped inside the package."""
    return Path(str(resources.files("dllm_constrain") / "bundled"))


def clear_model_cache() -> None:
    """Forget every LLM that `generate(model=None | path)` loaded."""
    with _CACHE_LOCK:
        _LLM_CACHE.clear()


def _schema_to_dict(schema: Any) -> dict[str, Any] | bool:
    """A JSON Schema as a dict, from a dict, a JSON string, a Pydantic model class (or, through the
    constraint layer's normaliser when present, an outlines output type)."""
    try:
        from dllm_constrain.constraints import normalize_schema_input  # type: ignore[attr-defined]
    except ImportError:  # the JSON Schema front end is not there yet
        normalize_schema_input = None
    if normalize_schema_input is not None and not isinstance(schema, (dict, bool, str)):
        return normalize_schema_input(schema)
    if isinstance(schema, (dict, bool)):
        return schema
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidSchemaError(f"schema is not valid JSON: {exc}") from exc
    to_schema = getattr(schema, "model_json_schema", None)
    if callable(to_schema):
        return to_schema()
    raise InvalidSchemaError(f"schema must be a dict, a JSON string or a Pydantic model class, got {type(schema).__name__}")


# ---------------------------------------------------------------------------------- request validation
# Every request field is checked by one function here (bad values raise InvalidRequestError naming the field,
# the expected type and what was given), before defaults are applied and before anything is compiled or run.
def _given(x: Any) -> str:
    return f"{x!r} (a {type(x).__name__})" if not isinstance(x, (int, float)) or isinstance(x, bool) else repr(x)


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)  # True is an int to Python, not here


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _int_field(name: str, lo: int, *, optional: bool = True) -> Callable[[Any], int | None]:
    want = "a positive integer" if lo == 1 else f"an integer >= {lo}"

    def check(x: Any) -> int | None:
        if x is None and optional:
            return None
        if not _is_int(x) or x < lo:
            raise InvalidRequestError(f"{name} must be {want}{' (or None)' if optional else ''}, got {_given(x)}")
        return int(x)
    return check


def _real_field(name: str, lo: float, hi: float = math.inf, *, lo_open: bool = False, hi_open: bool = False,
                optional: bool = True) -> Callable[[Any], float | None]:
    lo_s, hi_s = ("(" if lo_open else "[") + f"{lo:g}", f"{hi:g}" + (")" if hi_open or hi == math.inf else "]")
    if hi == math.inf:
        want = f"a finite number {'>' if lo_open else '>='} {lo:g}"
    else:
        want = f"a number in {lo_s}, {hi_s}"

    def check(x: Any) -> float | None:
        if x is None and optional:
            return None
        ok = _is_real(x) and math.isfinite(x) and (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)
        if not ok:
            raise InvalidRequestError(f"{name} must be {want}{' (or None)' if optional else ''}, got {_given(x)}")
        return float(x)
    return check


def _choice_field(name: str, choices: Sequence[str]) -> Callable[[Any], str | None]:
    def check(x: Any) -> str | None:
        if x is not None and (not isinstance(x, str) or x not in choices):
            raise InvalidRequestError(f"{name} must be one of {', '.join(map(repr, choices))} (or None), got {_given(x)}")
        return x
    return check


def _bool_field(name: str) -> Callable[[Any], bool]:
    def check(x: Any) -> bool:
        if not isinstance(x, bool):
            raise InvalidRequestError(f"{name} must be True or False, got {_given(x)}")
        return x
    return check


def _seed(x: Any) -> int | None:
    if x is not None and (not _is_int(x) or not -(1 << 63) <= x < (1 << 64)):
        raise InvalidRequestError(f"seed must be an integer in [-2**63, 2**64) (or None), got {_given(x)}")
    return None if x is None else int(x)


def _schema_options(x: Any) -> dict[str, Any] | None:
    if x is not None and not isinstance(x, dict):
        raise InvalidRequestError(f"schema_options must be a dict of SchemaOptions fields (or None), got {_given(x)}")
    return x


def _progress(x: Any) -> Any:
    if x is not None and not callable(x):
        raise InvalidRequestError(f"progress must be a callable taking a StepEvent (or None), got {_given(x)}")
    return x


REQUEST_FIELDS: dict[str, Callable[[Any], Any]] = {
    "max_new_tokens": _int_field("max_new_tokens", 1),
    "steps": _int_field("steps", 1),
    "block_length": _int_field("block_length", 1),
    "temperature": _real_field("temperature", 0.0, optional=False),
    "seed": _seed,
    "policy": _choice_field("policy", POLICY_NAMES),
    "threshold": _real_field("threshold", 0.0, 1.0),
    "entropy_bound": _real_field("entropy_bound", 0.0, lo_open=True, optional=False),
    "strict": _bool_field("strict"),
    "schema_options": _schema_options,
    "progress": _progress,
    "return_result": _bool_field("return_result"),
    "refresh_steps": _int_field("refresh_steps", 1),
    "refresh_threshold": _real_field("refresh_threshold", 0.0, 1.0, lo_open=True),
    "keep_ratio": _real_field("keep_ratio", 0.0, 1.0, lo_open=True),
    "logits_budget_bytes": _int_field("logits_budget_bytes", 1),
    "constraint_timeout": _real_field("constraint_timeout", 0.0, lo_open=True),
    "compile_timeout": _real_field("compile_timeout", 0.0, lo_open=True),
}

# seconds per constraint call of a request (constraints.canvas.DEFAULT_CALL_TIMEOUT_S; see "Time bounds" in
# docs/constraints.md); None: unbounded
CONSTRAINT_TIMEOUT_S = 0.5


def validate_request(**fields: Any) -> dict[str, Any]:
    """The request fields checked (REQUEST_FIELDS, one function per field) and normalised (numpy integers to
    int, ...); fields without a checker here (kv_cache, refresh: EngineConfig checks them) pass unchanged."""
    return {k: REQUEST_FIELDS[k](v) if k in REQUEST_FIELDS else v for k, v in fields.items()}


def validate_prompts(prompts: Any) -> list[str]:
    """A prompt or a list of prompts as a non-empty list of non-empty, encodable strings."""
    single = isinstance(prompts, str)
    if single:
        prompts = [prompts]
    elif isinstance(prompts, (bytes, bytearray, memoryview)):
        raise InvalidRequestError("the prompt is bytes, not a string: decode it first (e.g. prompt.decode('utf-8'))")
    elif isinstance(prompts, Sequence):
        prompts = list(prompts)
        if not prompts:
            raise InvalidRequestError("no prompts given")
    else:
        raise InvalidRequestError(f"prompt must be a string or a list of strings, got {_given(prompts)}")
    for i, p in enumerate(prompts):
        which = "the prompt" if single else f"prompt {i}"
        if isinstance(p, (bytes, bytearray)):
            raise InvalidRequestError(f"{which} is bytes, not a string: decode it first (e.g. .decode('utf-8'))")
        if not isinstance(p, str):
            raise InvalidRequestError(f"{which} is {_given(p)}, not a string")
        try:
            p.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidRequestError(
                f"{which} is not valid Unicode text: lone surrogate {p[exc.start]!r} at index {exc.start} "
                "(text decoded from non-UTF-8 bytes with surrogateescape, or a broken surrogate pair?)") from None
        if not p.strip():
            raise InvalidRequestError(f"{which} is empty")
    return prompts


def _output_type(x: Any) -> tuple[str, Any] | None:
    """("regex" | "grammar" | "schema", value) for an output type given as an object: a compiled `re.Pattern`,
    or an outlines type (`outlines.types`: Regex and the DSL terms -> their regex, String -> the escaped
    literal, CFG -> its Lark grammar, JsonSchema -> its schema). Duck-typed, so outlines need not be
    installed: an object with a string `.pattern` is a regex. None: not an output type."""
    if isinstance(x, re.Pattern):
        if not isinstance(x.pattern, str):
            raise InvalidRegexError("a compiled bytes regex is not supported: compile a str pattern")
        if x.flags & ~re.UNICODE:
            raise InvalidRegexError(f"compiled regex flags ({re.RegexFlag(x.flags & ~re.UNICODE)!r}) are not "
                                    "supported: pass the pattern alone")
        return ("regex", x.pattern)
    if isinstance(x, (str, bytes, dict, bool, type)) or x is None:
        return None
    pattern = getattr(x, "pattern", None)
    if isinstance(pattern, str):
        return ("regex", pattern)
    if type(x).__module__.split(".")[0] not in ("outlines", "outlines_core"):
        return None
    name = type(x).__name__
    if name == "String" and isinstance(getattr(x, "value", None), str):
        return ("regex", re.escape(x.value))
    if isinstance(getattr(x, "definition", None), str):
        return ("grammar", x.definition)
    if isinstance(getattr(x, "schema", None), (str, dict)):
        return ("schema", x)
    try:
        from outlines.types.dsl import to_regex  # type: ignore[import-not-found]

        return ("regex", to_regex(x))
    except Exception:
        raise InvalidRequestError(f"the outlines output type {name} is not supported: pass an outlines Regex, "
                                  "String or DSL term (as regex= or schema=), JsonSchema (schema=) or CFG "
                                  "(grammar=)") from None


def validate_constraint(schema: Any, regex: Any, grammar: Any) -> tuple[Any, str | None, str | None]:
    """(schema, regex, grammar) with at most one set, output-type objects moved to the argument they mean:
    schema= takes any output type (a JSON Schema, or an outlines Regex / DSL term, which becomes regex=, or
    an outlines CFG, which becomes grammar=); regex= a pattern string, a compiled re.Pattern or an outlines
    Regex / String / DSL term; grammar= a shipped name, a .lark path, Lark text or an outlines CFG."""
    if sum(x is not None for x in (schema, regex, grammar)) > 1:
        raise InvalidRequestError("pass at most one of schema=, regex= and grammar=")
    if schema is not None:
        kind = _output_type(schema)
        if kind is not None and kind[0] == "regex":
            return None, kind[1], None
        if kind is not None and kind[0] == "grammar":
            return None, None, kind[1]
        if kind is not None:
            return kind[1], None, None
        if isinstance(schema, (bytes, bytearray)):
            raise InvalidSchemaError("schema is bytes: pass a dict, a JSON string or a Pydantic model class")
        return schema, None, None
    if regex is not None:
        if isinstance(regex, str):
            return None, regex, None
        kind = _output_type(regex)
        if kind is None or kind[0] != "regex":
            raise InvalidRegexError(f"regex must be a pattern string, a compiled re.Pattern or an outlines Regex/"
                                    f"String term, got {type(regex).__name__}"
                                    + (f" (pass it as {kind[0]}=)" if kind is not None else ""))
        return None, kind[1], None
    if grammar is not None:
        if isinstance(grammar, (str, os.PathLike)):
            return None, None, grammar
        kind = _output_type(grammar)
        if kind is None or kind[0] != "grammar":
            raise InvalidGrammarError(f"grammar must be a shipped grammar name, a .lark path, Lark grammar text or "
                                      f"an outlines CFG, got {type(grammar).__name__}"
                                      + (f" (pass it as {kind[0]}=)" if kind is not None else ""))
        return None, None, kind[1]
    return None, None, None


@dataclass(frozen=True)
class GenerationDefaults:
    """Defaults for options the caller leaves as None: the checkpoint's generation_config.json, else these.

    A checkpoint knows its own sensible canvas (the bundled model was trained on canvases up to 96
    positions), the way Hugging Face checkpoints carry their generation defaults.
    """

    max_new_tokens: int = 128
    block_length: int = 32
    steps: int | None = None
    policy: str = "quota"  # the commit policy (the bundled model: "threshold", Fast-dLLM parallel decoding)
    threshold: float = 0.9  # its confidence threshold

    @classmethod
    def from_folder(cls, path: Path | None) -> "GenerationDefaults":
        file = path / "generation_config.json" if path is not None else None
        if file is None or not file.is_file():
            return cls()
        raw = json.loads(file.read_text())
        known = {f: raw[f] for f in ("max_new_tokens", "block_length", "steps", "policy", "threshold") if f in raw}
        return cls(**known)


class LLM:
    """A loaded checkpoint with its engine. `LLM()` loads the bundled model; `LLM(path)` any checkpoint folder.

    prompt_format: "request" wraps prompts in the bundled model's training format (`format_prompt`), "raw"
    feeds them as given; "auto" picks "request" for checkpoints whose tokenizer has this project's
    specials (`<|bos|>` and `<|mask|>`, i.e. trained by `python -m dllm_constrain.train`), else "raw".
    """

    def __init__(self, model_path: str | Path | None = None, *, device: Any = None, dtype: Any = None,
                 prompt_format: str = "auto", max_logit_rows: int = 32) -> None:
        """device: None (CUDA when available, else the CPU: `engine.placement.default_device`), "cpu", "cuda",
        "cuda:N" or a torch.device. dtype: None (the checkpoint's stored dtype; on CUDA bfloat16 for a float32
        checkpoint when the GPU supports it), "bfloat16"/"bf16", "float16"/"fp16", "float32"/"fp32" or a
        torch.dtype. Bad values raise InvalidRequestError naming the field. Sampling noise is drawn on the model's
        device, so a seed reproduces its results on the same device (not across devices, as in vLLM)."""
        from dllm_constrain.engine.loader import load_checkpoint
        from dllm_constrain.engine.placement import parse_dtype, resolve_device, resolve_dtype, stored_dtype

        if model_path is not None and not isinstance(model_path, (str, os.PathLike)):
            raise InvalidRequestError(f"model_path must be a checkpoint folder path (or None for the bundled "
                                      f"model), got {_given(model_path)}")
        where = resolve_device(device)
        wanted = parse_dtype(dtype)
        path = Path(model_path) if model_path is not None else bundled_model_path()
        if model_path is None and not (path / "config.json").is_file():
            raise CheckpointError(f"the bundled model is missing from {path} (config.json not found); "
                                  "train it with `python -m dllm_constrain.train` or pass model=<checkpoint folder>")
        if wanted is None and where.type == "cuda":  # the stored dtype decides whether bfloat16 replaces it
            wanted = resolve_dtype(None, where, stored_dtype(path))
        loaded = load_checkpoint(path, dtype=wanted, device=where)
        self._setup(loaded.model, loaded.tokenizer, path, prompt_format, max_logit_rows)

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, *, prompt_format: str = "auto",
                   max_logit_rows: int = 32) -> "LLM":
        """Wrap an already built DiffusionLM and tokenizer (our Tokenizer or a `tokenizers.Tokenizer`)."""
        self = cls.__new__(cls)
        self._setup(model, tokenizer, None, prompt_format, max_logit_rows)
        return self

    def _setup(self, model: Any, tokenizer: Any, path: Path | None, prompt_format: str, max_logit_rows: int) -> None:
        if prompt_format not in PROMPT_FORMATS:
            raise InvalidRequestError(f"prompt_format must be one of {PROMPT_FORMATS}, got {prompt_format!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.path = path
        self.device = model_device(model)  # where the model's weights are (LLM(device=...) or from_model's model)
        self.dtype = model_dtype(model)
        self.engine = LLMEngine(model, tokenizer, max_logit_rows=max_logit_rows)
        if prompt_format == "auto":
            ours = all(self._token_id(t) is not None for t in ("<|bos|>", "<|mask|>"))
            prompt_format = "request" if ours else "raw"
        self.prompt_format = prompt_format
        self.defaults = GenerationDefaults.from_folder(path)
        self._compiler: Any = None
        self._compiled: dict[tuple[Any, ...], Any] = {}

    # ------------------------------------------------------------------ tokenizer helpers
    def _token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """Prompt ids, with the tokenizer's own special-token post-processing (e.g. a leading BOS)."""
        if isinstance(self.tokenizer, tokenizers.Tokenizer):
            return self.tokenizer.encode(text, add_special_tokens=True).ids
        return list(self.tokenizer.encode(text, add_special=True))

    def format(self, prompt: str, schema: Any = None) -> str:
        """The text the model sees for `prompt` (and `schema`, as the compact field sketch the bundled model reads)."""
        if self.prompt_format == "raw":
            return prompt
        return format_prompt(prompt, None if schema is None else schema_sketch(_schema_to_dict(schema)))

    # ------------------------------------------------------------------ constraints
    def _constraint_compiler(self) -> Any:
        if self._compiler is None:
            try:
                from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo  # type: ignore[attr-defined]
            except ImportError as exc:
                raise NotImplementedError(
                    f"schema= and regex= constraints are implemented in the issue '{CONSTRAINT_ISSUE}'") from exc
            info = TokenizerInfo.from_tokenizer(self.tokenizer, vocab_size=self.engine.vocab_size,
                                                eos_id=self.model.special.eos_id, mask_id=self.model.special.mask_id)
            self._compiler = ConstraintCompiler(info)
        return self._compiler

    def compile(self, *, schema: Any = None, regex: Any = None, whitespace: Any = None,
                grammar: Any = None, strict: bool = True, schema_options: dict[str, Any] | None = None,
                compile_timeout: float | None = None) -> Any:
        """The compiled constraint for a schema, a regex or a Lark grammar (a shipped name, a .lark path or
        grammar text), compiled once per LLM (hence per tokenizer).

        strict: compile a JSON Schema with STRICT_SCHEMA_OPTIONS (sound narrowings for generation, see the
        comment there); False: the specification's semantics. schema_options: `json_schema.SchemaOptions`
        fields overriding either."""
        schema, regex, grammar = validate_constraint(schema, regex, grammar)
        if grammar is not None:
            from dllm_constrain.constraints.cfg import GrammarCompiler
            from dllm_constrain.grammars import load_grammar

            gkey = ("grammar", str(grammar))
            if gkey not in self._compiled:
                info = self._constraint_compiler().tokenizer_info
                self._compiled[gkey] = GrammarCompiler(info).compile(load_grammar(grammar), name=str(grammar)[:40])
            return self._compiled[gkey]
        if regex is not None:
            key: tuple[Any, ...] = ("regex", regex)
        else:
            as_dict = _schema_to_dict(schema)
            options = {**(STRICT_SCHEMA_OPTIONS if strict else {}), **(schema_options or {})}
            if whitespace is not None:
                options["whitespace"] = whitespace
            key = ("schema", json.dumps(as_dict, sort_keys=True), json.dumps(options, sort_keys=True, default=str))
        if key not in self._compiled:
            compiler = self._constraint_compiler()
            limit = {} if compile_timeout is None else {"timeout_s": compile_timeout}  # None: the compiler's 10 s
            if regex is not None:
                self._compiled[key] = compiler.compile_regex(regex, **limit)
            else:
                self._compiled[key] = compiler.compile_json_schema(schema, **options, **limit)
        return self._compiled[key]

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: str | Sequence[str],
        *,
        schema: Any = None,
        regex: Any = None,
        grammar: Any = None,
        max_new_tokens: int | None = None,
        steps: int | None = None,
        block_length: int | None = None,
        temperature: float = 0.0,
        seed: int | None = None,
        policy: str | None = None,
        threshold: float | None = None,
        entropy_bound: float = 0.1,
        whitespace: Any = None,
        strict: bool = True,
        schema_options: dict[str, Any] | None = None,
        progress: ProgressCallback | None = None,
        kv_cache: str | None = None,
        refresh: str | None = None,
        refresh_steps: int | None = None,
        refresh_threshold: float | None = None,
        keep_ratio: float | None = None,
        logits_budget_bytes: int | None = None,
        constraint_timeout: float | None = CONSTRAINT_TIMEOUT_S,
        compile_timeout: float | None = None,
    ) -> list[GenerationResult]:
        """Generate for each prompt (one batch); returns one GenerationResult per prompt, in order.

        schema, regex, grammar: at most one; schema= also takes an output type object (an outlines Regex or DSL
        term or a compiled re.Pattern becomes regex=, an outlines CFG grammar=; see `validate_constraint`).
        strict, schema_options: how a JSON Schema is compiled (see `LLM.compile`; strict by default).
        max_new_tokens, block_length, steps, policy, threshold: None takes the checkpoint's generation_config.json
        (GenerationDefaults; the bundled model decodes with the confidence-threshold policy).
        kv_cache, refresh, refresh_steps, refresh_threshold, keep_ratio, logits_budget_bytes: engine settings for
        this call (None keeps the engine's; see dllm_constrain.engine.config.EngineConfig).
        constraint_timeout: seconds each constraint call of a request may take (masks, joint verification,
        completability, the fit check; None: unbounded); past it a call answers soundly with what it has or
        the request ends with ConstraintTimeoutError (the others go on). compile_timeout: seconds for compiling
        the schema / regex (None: the compiler's default, 10 s).

        Raises InvalidRequestError (or its subclass PromptTooLongError) for bad input (every field is checked by
        its function in REQUEST_FIELDS, prompts by `validate_prompts`), a ConstraintError
        subclass for a constraint that cannot be compiled or cannot fit the canvas, all before any forward.
        """
        options = {k: v for k, v in locals().items() if k not in ("self", "prompts")}  # this signature, once
        loop = self._engine_loop()
        if loop.on_loop_thread:
            raise InvalidRequestError("LLM.generate() was called from the engine loop thread (inside a progress "
                                      "or stream callback): it would wait for itself; use LLM.submit there")
        return self.submit(prompts, **options).result()

    def submit(self, prompts: str | Sequence[str], *, on_stream: StreamCallback | None = None,
               **options: Any) -> CallHandle:
        """Queue a generation (the options of `generate`) on this LLM's engine loop without waiting: returns a
        CallHandle (`.result(timeout)` -> list[GenerationResult], `.future`, `.abort()`). Bad input raises here
        (InvalidRequestError); compilation and engine errors come through the handle. on_stream(index, update):
        each request's committed left prefix (`StreamUpdate`, token ids) after every step that grew it, called
        on the loop thread. Thread-safe: any number of threads may submit; all calls share one continuous batch
        (see dllm_constrain.engine_loop)."""
        build, config, progress = self._prepare(prompts, generate_options(options))
        return self._engine_loop().submit(build, config=config, progress=progress, on_stream=on_stream)

    def _engine_loop(self) -> EngineLoop:
        with _LOOP_LOCK:
            loop = getattr(self, "_loop", None)
            if loop is None or loop.engine is not self.engine:
                loop = self._loop = EngineLoop(self.engine)
            return loop

    def close(self) -> None:
        """Stop this LLM's engine loop thread (unfinished calls fail with GenerationAbortedError); the next
        generate starts it again."""
        loop = getattr(self, "_loop", None)
        if loop is not None:
            loop.close()

    def _prepare(self, prompts: str | Sequence[str], o: dict[str, Any]
                 ) -> tuple[Callable[[], list[Request]], EngineConfig, ProgressCallback | None]:
        """Check a call's input here (caller thread); the returned `build` compiles the constraint and makes the
        requests on the engine loop thread (the compiled constraints and the engine are used by that thread only)."""
        prompts = validate_prompts(prompts)
        schema, regex, grammar = validate_constraint(o["schema"], o["regex"], o["grammar"])
        v = validate_request(**{k: o[k] for k in REQUEST_FIELDS if k in o})
        whitespace, strict, schema_options, progress = o["whitespace"], v["strict"], v["schema_options"], v["progress"]
        d = self.defaults
        params = SamplingParams(
            max_new_tokens=d.max_new_tokens if v["max_new_tokens"] is None else v["max_new_tokens"],
            steps=d.steps if v["steps"] is None else v["steps"],
            block_length=d.block_length if v["block_length"] is None else v["block_length"],
            temperature=v["temperature"], seed=v["seed"], policy=d.policy if v["policy"] is None else v["policy"],
            threshold=d.threshold if v["threshold"] is None else v["threshold"], entropy_bound=v["entropy_bound"])
        params.validate()
        config = self.engine.config.with_overrides(
            kv_cache=o["kv_cache"], refresh=o["refresh"], refresh_steps=v["refresh_steps"],
            refresh_threshold=v["refresh_threshold"], keep_ratio=v["keep_ratio"],
            logits_budget_bytes=v["logits_budget_bytes"])

        def build() -> list[Request]:
            max_new_tokens = params.max_new_tokens
            compiled = None
            if schema is not None or regex is not None or grammar is not None:
                compiled = self.compile(schema=schema, regex=regex, whitespace=whitespace, grammar=grammar,
                                        strict=strict, schema_options=schema_options,
                                        compile_timeout=v["compile_timeout"])
                from dllm_constrain.constraints.compiler import CompiledConstraint

                # regular constraints take the per-call limit (the grammar path does not yet)
                limit = {"timeout_s": v["constraint_timeout"]} if isinstance(compiled, CompiledConstraint) else {}
                min_tokens = int(compiled.min_tokens(**limit))
                if min_tokens > max_new_tokens:
                    raise ConstraintTooLongError(min_tokens, max_new_tokens)
            requests = []
            for p in prompts:
                ids = self.encode(self.format(p, schema))
                constraint = compiled.new_canvas_state(max_new_tokens, **limit) if compiled is not None else None
                requests.append(Request(ids, params, constraint))
            return requests

        return build, config, progress


def _resolve_llm(model: Any) -> LLM:
    """An LLM for `model`, loading (and caching, least recently used out) checkpoint folders once.

    `model` is None (the bundled checkpoint), a checkpoint folder, an LLM, or a loaded checkpoint
    (`engine.loader.LoadedModel`: anything with `.model` and `.tokenizer`)."""
    if isinstance(model, LLM):
        return model
    if hasattr(model, "model") and hasattr(model, "tokenizer") and hasattr(model.model, "special"):
        return LLM.from_model(model.model, model.tokenizer)
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise InvalidRequestError(f"model must be None, a checkpoint folder path, an LLM or a loaded checkpoint, "
                                  f"got {type(model).__name__}")
    key = str(Path(model).resolve()) if model is not None else str(bundled_model_path().resolve())
    with _CACHE_LOCK:
        if key in _LLM_CACHE:
            _LLM_CACHE.move_to_end(key)
            return _LLM_CACHE[key]
        llm = LLM(model)
        _LLM_CACHE[key] = llm
        while len(_LLM_CACHE) > _CACHE_SIZE:
            _LLM_CACHE.popitem(last=False)
        return llm


def generate(prompt: str | Sequence[str], *, model: Any = None, return_result: bool = False, **options: Any) -> Any:
    """Generate text for a prompt (-> str) or a list of prompts (-> list[str], one batch).

    model: None (the bundled checkpoint), a checkpoint folder, an LLM or a loaded checkpoint; return_result=True
    returns GenerationResult objects instead of strings; every other keyword is an option of `LLM.generate`
    (its signature holds the defaults; an unknown name raises InvalidRequestError). A checkpoint loaded here (model
    None or a path) is on the default placement (`LLM(path)`: CUDA when available, see engine.placement); for
    another device or dtype pass `model=LLM(path, device=..., dtype=...)`.
    """
    return_result = REQUEST_FIELDS["return_result"](return_result)
    validate_prompts(prompt)  # before loading a model for a request that cannot run
    generate_options(options)
    results = _resolve_llm(model).generate(prompt, **options)
    out: list[Any] = results if return_result else [r.text for r in results]
    return out[0] if isinstance(prompt, str) else out


def generate_options(options: dict[str, Any]) -> dict[str, Any]:
    """Every option of `LLM.generate`, the given ones over its signature's defaults (the one place defaults
    live); an unknown name raises InvalidRequestError naming it."""
    unknown = sorted(set(options) - set(_GENERATE_DEFAULTS))
    if unknown:
        raise InvalidRequestError(f"unknown generation option(s) {', '.join(map(repr, unknown))}; the options are "
                                  f"{', '.join(_GENERATE_DEFAULTS)}")
    return {**_GENERATE_DEFAULTS, **options}


_GENERATE_DEFAULTS: dict[str, Any] = {
    name: p.default for name, p in inspect.signature(LLM.generate).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY}
