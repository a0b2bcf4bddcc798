"""Generation options: every keyword of `generate` checked by one function, then routed by field name onto the
objects it belongs to, so each default is defined once, as a dataclass field default.

    SamplingParams   per request: max_new_tokens, steps, block_length, policy, threshold, temperature, seed,
                     entropy_bound, timeout, constraint_timeout, forced_tokens and `constraint` (engine.state)
    OutputConstraint the request's constraint: schema | regex | grammar, strict, schema_options, whitespace,
                     compile_timeout (engine.state)
    EngineConfig     engine settings for one call: kv_cache, refresh, refresh_steps, refresh_threshold,
                     keep_ratio, logits_budget_bytes, max_logit_rows, budgeted_logits, backend, mask_workers,
                     gil_free_forward, core_split, scheduler, step_tokens, kv_budget_bytes (engine.config; the ones
                     not given keep the LLM's engine's)
    CALL_OPTIONS     the call itself: progress

`route_options(options, defaults, sampling_params)` does the routing: keywords replace fields of
`sampling_params` (when given) or of the checkpoint's defaults (`GenerationDefaults`: generation_config.json over
the SamplingParams field defaults). An unknown keyword raises InvalidRequestError naming it.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from dllm_constrain.chat_template import is_conversation, normalize_messages
from dllm_constrain.engine.config import ENGINE_CHECKS, EngineConfig
from dllm_constrain.engine.outputs import ProgressCallback
from dllm_constrain.engine.state import SAMPLING_CHECKS, OutputConstraint, SamplingParams
from dllm_constrain.option_checks import Check, bool_check, choice_check, given, instance_check, real_check
from dllm_constrain.errors import (
    InvalidGrammarError,
    InvalidRegexError,
    InvalidRequestError,
    InvalidSchemaError,
)

__all__ = ["CALL_OPTIONS", "CONSTRAINT_TIMEOUT_S", "GenerationDefaults", "OPTION_NAMES", "REQUEST_FIELDS",
           "RoutedOptions", "check_option_names", "generate_options", "route_constraint", "route_options",
           "validate_constraint", "validate_prompts", "validate_request"]

# ---------------------------------------------------------------------------------- request validation
# Every request field has one check (dllm_constrain.option_checks): SamplingParams' are engine.state's
# SAMPLING_CHECKS, EngineConfig's its fields' metadata, the constraint and call fields' below (REQUEST_FIELDS, made
# once the checkpoint fields are known). Bad values raise InvalidRequestError naming the field, the expected type
# and what was given, before defaults are applied and before anything is compiled or run.
_given = given  # the API's messages show values the same way

# seconds per constraint call of a request (the SamplingParams field default; see "Time bounds" in
# docs/constraints.md); None: unbounded
CONSTRAINT_TIMEOUT_S = SamplingParams.constraint_timeout


def validate_request(**values: Any) -> dict[str, Any]:
    """The request fields checked (REQUEST_FIELDS, one check per field) and normalised (numpy integers to int,
    sequences of ids to tuples, ...); a name without a check passes unchanged."""
    return {k: REQUEST_FIELDS[k](v) if k in REQUEST_FIELDS else v for k, v in values.items()}


Prompt = str | tuple[dict[str, Any], ...]  # text, or one conversation (messages with role and text content)


def is_single_prompt(prompts: Any) -> bool:
    """Whether `prompts` is one prompt (a string or one conversation) rather than a list of them."""
    return isinstance(prompts, str) or is_conversation(prompts)


def validate_prompts(prompts: Any) -> list[Prompt]:
    """A prompt or a list of prompts as a non-empty list of non-empty, encodable strings and conversations (a
    list of message dicts is one conversation; its messages are checked by `normalize_messages`)."""
    single = is_single_prompt(prompts)
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
        if not isinstance(p, str) and is_conversation(p):
            prompts[i] = normalize_messages(p, which)
            for m in prompts[i]:
                _check_text(m["content"], which)
            continue
        if isinstance(p, (bytes, bytearray)):
            raise InvalidRequestError(f"{which} is bytes, not a string: decode it first (e.g. .decode('utf-8'))")
        if not isinstance(p, str):
            raise InvalidRequestError(f"{which} is {_given(p)}, not a string or a list of messages")
        _check_text(p, which)
        if not p.strip():
            raise InvalidRequestError(f"{which} is empty")
    return prompts


def _check_text(p: str, which: str) -> None:
    try:
        p.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(
            f"{which} is not valid Unicode text: lone surrogate {p[exc.start]!r} at index {exc.start} "
            "(text decoded from non-UTF-8 bytes with surrogateescape, or a broken surrogate pair?)") from None


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
        return None, _given_as("regex", regex, (str,), InvalidRegexError,
                               "a pattern string, a compiled re.Pattern or an outlines Regex/String term"), None
    if grammar is not None:
        return None, None, _given_as("grammar", grammar, (str, os.PathLike), InvalidGrammarError,
                                     "a shipped grammar name, a .lark path, Lark grammar text or an outlines CFG")
    return None, None, None


def _given_as(kind: str, x: Any, plain: tuple[type, ...], error: type[Exception], accepted: str) -> Any:
    """`x` passed as `kind`= (regex or grammar): as is when of a `plain` type, else the source of an outlines
    term of that kind; anything else is `error` saying what `kind`= accepts (and, for an outlines term of
    another kind, which argument it belongs to), so both arguments refuse in the same words."""
    if isinstance(x, plain):
        return x
    found = _output_type(x)
    if found is None or found[0] != kind:
        raise error(f"{kind} must be {accepted}, got {type(x).__name__}"
                    + (f" (pass it as {found[0]}=)" if found is not None else ""))
    return found[1]


# each family's own decoding when its generation_config.json does not say otherwise: LLaDA's generate()
# (low-confidence remasking, semi-autoregressive blocks of 32, the uniform per-block schedule) and Dream's
# diffusion_generate (its documented alg="entropy" on the linspace schedule over the whole answer)
FAMILY_DECODING: dict[str, dict[str, Any]] = {
    "llada": {"policy": "quota", "schedule": "uniform"},
    "dream": {"policy": "entropy", "schedule": "linspace", "block_length": None},  # None: the whole answer
}
# Dream's generation_config `alg` -> our policy of the same ranking ("origin", a random order, has none: the
# family's entropy order stays)
DREAM_ALGS = {"entropy": "entropy", "maskgit_plus": "quota", "topk_margin": "margin"}
QUOTA_POLICIES = ("quota", "entropy", "margin")
PRESETS = ("fast", "reference")


@dataclass(frozen=True)
class GenerationDefaults:
    """Defaults for options the caller leaves as None: the checkpoint's generation_config.json over its family's
    decoding (FAMILY_DECODING) over these.

    A checkpoint knows its own sensible canvas (the bundled model was trained on canvases up to 96
    positions), the way Hugging Face checkpoints carry their generation defaults. generation_config.json may set
    the fields below by name, and Dream's `alg` (DREAM_ALGS) and `eps` (schedule_eps); its `eos_token_id` list
    reaches stop_token_ids through the tokenizer (engine.tokenizer).
    """

    max_new_tokens: int = SamplingParams.max_new_tokens
    block_length: int = SamplingParams.block_length
    steps: int | None = SamplingParams.steps
    policy: str = SamplingParams.policy  # the commit policy (the bundled model: "threshold", Fast-dLLM parallel decoding)
    threshold: float = SamplingParams.threshold  # its confidence threshold
    schedule: str = SamplingParams.schedule  # the quota policies' per-step count (LLaDA "uniform", Dream "linspace")
    schedule_eps: float = SamplingParams.schedule_eps
    stop_token_ids: tuple[int, ...] = SamplingParams.stop_token_ids  # besides the model's EOS

    @classmethod
    def from_folder(cls, path: Path | None, family: str | None = None, *, context: int | None = None,
                    stop_token_ids: Sequence[int] = ()) -> "GenerationDefaults":
        """The defaults of a checkpoint folder (None: the engine's own) of `family`; `context` (the model's
        context length) is the block length of a family that decodes the whole answer as one block."""
        known: dict[str, Any] = {}
        for name, value in FAMILY_DECODING.get(family or "", {}).items():
            known[name] = value if value is not None or name != "block_length" else (context or 1 << 20)
        file = path / "generation_config.json" if path is not None else None
        if file is not None and file.is_file():
            raw = json.loads(file.read_text())
            if family == "dream" and raw.get("alg") in DREAM_ALGS:
                known["policy"] = DREAM_ALGS[raw["alg"]]
            if family == "dream" and isinstance(raw.get("eps"), float) and 0 < raw["eps"] < 1:
                known["schedule_eps"] = raw["eps"]
            known.update({f.name: raw[f.name] for f in fields(cls) if f.name in raw and f.name != "stop_token_ids"})
        if stop_token_ids:
            known["stop_token_ids"] = tuple(stop_token_ids)
        return cls(**known)

    def sampling_params(self, preset: str | None = None) -> SamplingParams:
        """SamplingParams with these defaults (the other fields keep the SamplingParams field defaults), under
        `preset` (`preset_sampling`)."""
        base = {f.name: getattr(self, f.name) for f in fields(self)}
        return SamplingParams(**{**base, **self.preset_sampling(preset)})

    def preset_sampling(self, preset: str | None) -> dict[str, Any]:
        """The SamplingParams fields a preset sets: "reference" ranks with the family's own order (a quota policy:
        the checkpoint's if it names one, else low confidence on the uniform schedule, entropy on Dream's);
        None / "fast": nothing (these defaults)."""
        if preset != "reference":
            return {}
        if self.policy in QUOTA_POLICIES:
            return {"policy": self.policy}
        return {"policy": "entropy" if self.schedule == "linspace" else "quota"}

    @staticmethod
    def preset_engine(preset: str | None) -> dict[str, Any]:
        """The EngineConfig fields a preset sets: "reference" recomputes the whole sequence every step, as the
        authors' generate() / diffusion_generate() do."""
        return {"kv_cache": "none"} if preset == "reference" else {}


# ---------------------------------------------------------------------------------- routing
SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams) if f.name != "constraint")
CONSTRAINT_FIELDS = tuple(f.name for f in fields(OutputConstraint))
ENGINE_FIELDS = tuple(f.name for f in fields(EngineConfig))
CALL_OPTIONS = ("progress", "preset")
OPTION_NAMES = SAMPLING_FIELDS + CONSTRAINT_FIELDS + ENGINE_FIELDS + CALL_OPTIONS
# fields a checkpoint's generation_config.json may set: None given for them means "the checkpoint's default"
CHECKPOINT_FIELDS = tuple(f.name for f in fields(GenerationDefaults))

# each keyword's one check; as a keyword, None keeps the checkpoint's value (its fields) or the engine's (its fields)
REQUEST_FIELDS: dict[str, Check] = {
    **{k: c.allowing_none() if k in CHECKPOINT_FIELDS else c for k, c in SAMPLING_CHECKS.items()},
    **{name: check.named(name) for name, check in {
        "strict": bool_check(), "schema_options": instance_check("a dict of SchemaOptions fields", dict),
        "compile_timeout": real_check(0.0, lo_open=True, optional=True),
        "progress": Check("a callable taking a StepEvent", callable, optional=True),
        "preset": choice_check(PRESETS, optional=True), "return_result": bool_check()}.items()},
    **{k: c.allowing_none() for k, c in ENGINE_CHECKS.items()},
}



@dataclass(frozen=True)
class RoutedOptions:
    """One call's keywords on the objects they belong to."""

    sampling: SamplingParams
    engine: dict[str, Any]  # the EngineConfig fields given for this call (None values: keep the engine's)
    progress: ProgressCallback | None = None
    preset: str | None = None  # "fast" | "reference" (see GenerationDefaults.preset_sampling), None: the defaults


def check_option_names(names: Any, extra: Sequence[str] = ()) -> None:
    """Raise InvalidRequestError naming every keyword that is no option (nor one of `extra`)."""
    unknown = sorted(set(names) - set(OPTION_NAMES) - set(extra))
    if unknown:
        raise InvalidRequestError(f"unknown generation option(s) {', '.join(map(repr, unknown))}; the options are "
                                  f"{', '.join(OPTION_NAMES + tuple(extra))}")


def generate_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The given options over every per-request option's default (the SamplingParams and OutputConstraint field
    defaults; None for the fields the checkpoint sets, meaning "the checkpoint's"), plus the given engine
    settings; an unknown name raises InvalidRequestError naming it."""
    check_option_names(options)
    defaults = {f.name: None if f.name in CHECKPOINT_FIELDS else getattr(SamplingParams, f.name)
                for f in fields(SamplingParams) if f.name != "constraint"}
    defaults.update({f.name: getattr(OutputConstraint, f.name) for f in fields(OutputConstraint)})
    defaults["progress"] = None
    defaults["preset"] = None
    return {**defaults, **options}


def route_options(options: Mapping[str, Any], defaults: SamplingParams,
                  sampling_params: SamplingParams | None = None,
                  preset_sampling: Callable[[str | None], Mapping[str, Any]] | None = None) -> RoutedOptions:
    """Check every keyword (REQUEST_FIELDS) and put it on its object by field name: per-request fields replace
    those of `sampling_params` (given) or `defaults` (the checkpoint's), constraint fields those of its
    OutputConstraint, engine fields go to `engine`. None for a checkpoint field keeps the base value. A `preset`
    keyword sets the fields `preset_sampling(preset)` names on the base first (the given keywords still win)."""
    check_option_names(options)
    if sampling_params is not None and not isinstance(sampling_params, SamplingParams):
        raise InvalidRequestError(f"sampling_params must be a SamplingParams, got {_given(sampling_params)}")
    v = validate_request(**options)
    base = sampling_params if sampling_params is not None else defaults
    if preset_sampling is not None and v.get("preset") is not None:
        base = replace(base, **preset_sampling(v["preset"]))
    changes = {k: v[k] for k in SAMPLING_FIELDS if k in v and not (v[k] is None and k in CHECKPOINT_FIELDS)}
    constraint = _route_constraint(v, base.constraint)
    params = replace(base, **changes, constraint=constraint)
    params.validate()
    engine = {k: v[k] for k in ENGINE_FIELDS if k in v}
    return RoutedOptions(params, engine, v.get("progress"), v.get("preset"))


def route_constraint(given: Mapping[str, Any]) -> OutputConstraint | None:
    """The OutputConstraint of constraint fields alone (CONSTRAINT_FIELDS; another name is an InvalidRequestError),
    checked and normalised as `route_options` does; None when no schema, regex or grammar is given."""
    unknown = sorted(set(given) - set(CONSTRAINT_FIELDS))
    if unknown:
        raise InvalidRequestError(f"not a constraint field: {', '.join(map(repr, unknown))}; the constraint fields "
                                  f"are {', '.join(CONSTRAINT_FIELDS)}")
    return _route_constraint(validate_request(**given), None)


def _route_constraint(v: Mapping[str, Any], base: OutputConstraint | None) -> OutputConstraint | None:
    """The call's OutputConstraint: the given schema/regex/grammar (checked, normalised once: a schema to its
    dict, a grammar name or path to its text) replace the base's (which is checked and normalised the same
    way); the other given fields replace its fields."""
    given = {k: v[k] for k in CONSTRAINT_FIELDS if k in v}
    if not given and base is None:
        return None
    target = {k: given.pop(k, None) for k in ("schema", "regex", "grammar")}
    if all(x is None for x in target.values()) and base is not None:
        target = {"schema": base.schema, "regex": base.regex, "grammar": base.grammar}
    schema, regex, grammar = validate_constraint(target["schema"], target["regex"], target["grammar"])
    if schema is not None:
        from dllm_constrain.constraints.json_schema import normalize_schema_input

        schema = normalize_schema_input(schema)
    if grammar is not None:
        from dllm_constrain.grammars import load_grammar

        grammar = load_grammar(grammar)
    constraint = replace(base or OutputConstraint(), schema=schema, regex=regex, grammar=grammar, **given)
    return None if constraint.empty else constraint
