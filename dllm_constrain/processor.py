"""The request builder: one call's prompts and options -> an `EngineCall`, what the engine loop takes.

    call = llm.processor.build("Name Ada, age 36", schema={...}, max_new_tokens=32)   # checked, routed
    requests = call.make_requests()       # compiled constraint + encoded prompts (the engine loop's builder thread)
    llm.processor.output_constraint(schema='{"type": "integer"}')                      # -> OutputConstraint

Every entry point builds its requests here: `LLM.generate` / `LLM.submit`, `dc.generate`, `AsyncLLM`, the CLI,
the HTTP server (which builds its `OutputConstraint` with `output_constraint` and hands it over as the
`constraint=` argument), tests and benchmarks. `build` checks the input and routes the options on the caller's
thread (a bad value raises before anything is queued); `EngineCall.make_requests` compiles the constraint and
encodes the prompts, once, and keeps the requests it made, so a caller counts prompt tokens from the ids the
engine got (`EngineCall.prompt_tokens`) instead of encoding the prompt again.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.outputs import ProgressCallback
from dllm_constrain.engine.state import OutputConstraint, Request, SamplingParams
from dllm_constrain.errors import InvalidRequestError
from dllm_constrain.options import CONSTRAINT_FIELDS, Prompt, route_constraint, route_options, validate_prompts
from dllm_constrain.templates import apply_template

if TYPE_CHECKING:  # the LLM owns its Processor; only for annotations
    from dllm_constrain.api import LLM

__all__ = ["EngineCall", "Processor"]


@dataclass(eq=False)
class EngineCall:
    """One call's requests as the engine loop takes them: checked prompts, the routed `SamplingParams` (its
    `OutputConstraint` normalised), the engine settings for the call and its progress callback. `make_requests`
    compiles and encodes; it runs once, on the engine loop's builder thread (or the caller's, in tests)."""

    prompts: list[Prompt]
    params: SamplingParams
    config: EngineConfig
    progress: ProgressCallback | None
    _make: Callable[[], list[Request]] = field(repr=False)
    requests: list[Request] | None = None  # what make_requests made

    def make_requests(self) -> list[Request]:
        """The requests, one per prompt: its constraint compiled (or compiling beside the first forward, for a
        call built with compile_beside) and its prompt encoded. Raises the constraint's typed error."""
        self.requests = self._make()
        return self.requests

    def prompt_tokens(self, index: int = 0) -> int:
        """Prompt tokens of request `index`, from the ids the engine got (after `make_requests`)."""
        if self.requests is None:
            raise RuntimeError("the call's requests are not made yet (make_requests)")
        return len(self.requests[index].prompt_ids)


class Processor:
    """Builds `EngineCall`s for one `LLM` (its checkpoint defaults, prompt format, tokenizer and compiler)."""

    def __init__(self, llm: "LLM") -> None:
        self.llm = llm

    def build(self, prompts: Prompt | Sequence[Prompt], sampling_params: SamplingParams | None = None, *,
              constraint: OutputConstraint | None = None, compile_beside: bool = False,
              **options: Any) -> EngineCall:
        """Check `prompts` (`options.validate_prompts`) and route `options` by field name onto SamplingParams,
        OutputConstraint and EngineConfig (`options.route_options`: each field checked by its one validator), on
        the caller's thread; a text template becomes the canvas's pinned ids here. `constraint`: an
        `OutputConstraint` built beforehand (`output_constraint`; the server's way), taken as it is in place of
        the base's (not with constraint keywords; the compiler reads a schema given as text). With `compile_beside`, a
        constraint the compile cache lacks compiles on the LLM's compile thread beside the requests' first
        forward (`LLM.constraint_for_engine`) instead of inside `make_requests`.

        Raises InvalidRequestError (or a subclass) for bad input."""
        llm = self.llm
        prompts = validate_prompts(prompts)
        if constraint is not None:
            if not isinstance(constraint, OutputConstraint):
                raise InvalidRequestError(f"constraint must be an OutputConstraint, got {type(constraint).__name__}")
            given = sorted(set(options) & set(CONSTRAINT_FIELDS))
            if given:
                raise InvalidRequestError(f"give constraint= or the constraint fields ({', '.join(given)}), not both")
        routed = route_options(options, llm.defaults.sampling_params(), sampling_params,
                               preset_sampling=llm.defaults.preset_sampling)
        if routed.preset == "reference" and llm.family not in ("llada", "dream"):
            raise InvalidRequestError(f"preset='reference' reproduces LLaDA's generate() and Dream's "
                                      f"diffusion_generate(); this model's family is {llm.family!r}")
        engine = {**llm.defaults.preset_engine(routed.preset),
                  **{k: v for k, v in routed.engine.items() if v is not None}}
        config = llm.engine.config.with_overrides(**engine)
        params = routed.sampling  # a text template's pins: checked against the constraint at admission
        if constraint is not None:  # built (checked, normalised) by output_constraint or the caller: taken as is
            params = replace(params, constraint=None if constraint.empty else constraint)
        if params.template is not None:
            params = apply_template(params, llm.encode_text, llm.model.special.mask_id)
        constraint = params.constraint

        def make() -> list[Request]:
            compiled: Any = None
            if constraint is not None:
                compiled = (llm.constraint_for_engine(constraint) if compile_beside
                            else llm.compile_constraint(constraint))
            schema = constraint.schema if constraint is not None else None
            return [Request(llm.prompt_ids(p, schema), params, compiled) for p in prompts]

        return EngineCall(prompts, params, config, routed.progress, make)

    @staticmethod
    def output_constraint(**fields: Any) -> OutputConstraint | None:
        """The `OutputConstraint` of constraint fields (schema | regex | grammar, strict, schema_options,
        whitespace, compile_timeout), checked and normalised as `build` does (None: no constraint given).
        Raises the typed error of a bad value (InvalidSchemaError, InvalidRegexError, InvalidGrammarError,
        InvalidRequestError)."""
        return route_constraint(fields)
