"""The public API: `generate()` for one-liners, `LLM` for users who want result objects and counters.

    import dllm_constrain as dc
    dc.generate("Name Ada, age 36", schema={"type": "object", ...})      # -> str (bundled model)
    llm = dc.LLM("path/to/checkpoint")                                    # load once
    [res] = llm.generate(["..."], max_new_tokens=64, policy="threshold")  # -> list[GenerationResult]
    params = dc.SamplingParams(max_new_tokens=64, constraint=dc.OutputConstraint(regex="[0-9]+"))
    [res] = llm.generate(["..."], params, seed=3)                         # keywords replace its fields

Options are the fields of `SamplingParams` (with its `OutputConstraint`) and `EngineConfig`, plus `progress` and
`preset`: every entry point builds its requests with the LLM's `Processor` (dllm_constrain.processor), which routes
them by field name (dllm_constrain.options). `model=None` is the bundled checkpoint; loaded checkpoints are kept in
one small cache of `LLM`s keyed by resolved path (`clear_model_cache()`), compiled constraints in the compiler's
one bounded cache (`constraints.compiler.COMPILE_CACHE`). Threads: each `LLM` owns one engine loop thread
(dllm_constrain.engine_loop); any number of threads may call `generate` at once, their requests share one
continuous batch and each result equals the single-threaded one for its seed; `LLM.submit` queues a call without
waiting, `dllm_constrain.AsyncLLM` is the asyncio front end.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any, Literal, overload

import tokenizers

from dllm_constrain.constraints import ConstraintCompiler, TokenizerInfo
from dllm_constrain.constraints.byte_lru import parse_bytes
from dllm_constrain.constraints.compiler import COMPILE_CACHE, Compiled, compile_constraint
from dllm_constrain.constraints.json_schema import normalize_schema_input
from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import GenerationResult, LLMEngine
from dllm_constrain.engine.model_runner import model_device
from dllm_constrain.engine.placement import model_dtype
from dllm_constrain.engine.scheduler import SchedulerConfig
from dllm_constrain.engine.warmup import warm_up
from dllm_constrain.engine.state import (
    STRICT_SCHEMA_OPTIONS,
    OutputConstraint,
    PendingConstraint,
    SamplingParams,
)
from dllm_constrain.engine_loop import CallHandle, EngineLoop, StreamCallback
from dllm_constrain.errors import (  # noqa: F401 - the typed errors of the API, importable from here
    CheckpointError,
    ConstraintTooLongError,
    InvalidGrammarError,
    InvalidRegexError,
    InvalidRequestError,
    InvalidSchemaError,
)
from dllm_constrain.gc_heap import freeze_startup_heap
from dllm_constrain.options import (  # noqa: F401 - re-exported: the options' checks live in dllm_constrain.options
    CONSTRAINT_TIMEOUT_S,
    REQUEST_FIELDS,
    GenerationDefaults,
    _given,
    check_option_names,
    generate_options,
    route_options,
    validate_constraint,
    validate_prompts,
    validate_request,
)
from dllm_constrain.chat_template import ChatTemplate
from dllm_constrain.options import Prompt, is_single_prompt
from dllm_constrain.processor import Processor
from dllm_constrain.prompting import format_prompt, schema_sketch
from dllm_constrain.decisions import DecisionResult, Question, decide

__all__ = ["LLM", "GenerationResult", "OutputConstraint", "SamplingParams", "EngineConfig", "generate",
           "bundled_model_path", "clear_model_cache", "STRICT_SCHEMA_OPTIONS"]

PROMPT_FORMATS = ("auto", "request", "chat", "raw")
_CACHE_SIZE = 4
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
    """A JSON Schema as a dict (a bool schema as it is), through the constraint layer's one normaliser."""
    return schema if isinstance(schema, (dict, bool)) else normalize_schema_input(schema)


class LLM:
    """A loaded checkpoint with its engine. `LLM()` loads the bundled model; `LLM(path)` any checkpoint folder.

    prompt_format: "request" wraps prompts in the bundled model's training format (`format_prompt`), "chat"
    renders them through the checkpoint's chat template with the generation prompt (dllm_constrain.chat_template:
    a string becomes one user message; what the authors' demos of LLaDA-8B-Instruct and Dream-v0-Instruct-7B do),
    "raw" feeds them as given; "auto" picks "request" for checkpoints whose tokenizer has this project's
    specials (`<|bos|>` and `<|mask|>`, i.e. trained by `python -m dllm_constrain.train`), else "chat" when the
    checkpoint's tokenizer_config.json has a chat_template, else "raw". A prompt is a string or a conversation
    (a list of {"role", "content"} messages), in every format but "raw".

    Decoding defaults come from the checkpoint (`GenerationDefaults.from_folder`): its family's schedule and
    ranking (LLaDA: low confidence on the uniform per-block schedule, blocks of 32; Dream: entropy on the linspace
    schedule over the whole answer) under its generation_config.json, and stop ids from its eos_token_id lists and
    its chat template's end-of-turn token. `preset="reference"` on a call reproduces the authors' greedy outputs
    (docs/checkpoints.md).
    """

    def __init__(self, model_path: str | Path | None = None, *, device: Any = None, dtype: Any = None,
                 prompt_format: str = "auto", max_logit_rows: int = 32, freeze_gc_heap: bool = True,
                 compile_cache_memory: int | str | None = None, max_num_seqs: int | None = None,
                 kv_cache_memory: int | str | None = None) -> None:
        """device: None (CUDA when available, else the CPU: `engine.placement.default_device`), "cpu", "cuda",
        "cuda:N" or a torch.device. dtype: None (the checkpoint's stored dtype; on CUDA bfloat16 for a float32
        checkpoint when the GPU supports it), "bfloat16"/"bf16", "float16"/"fp16", "float32"/"fp32" or a
        torch.dtype. Bad values raise InvalidRequestError naming the field. Sampling noise is drawn on the model's
        device, so a seed reproduces its results on the same device (not across devices, as in vLLM).
        freeze_gc_heap: once the model is loaded, move the process's heap out of the garbage collector's reach
        (`dllm_constrain.gc_heap`, once per process, as vLLM does after its engine's startup), so that a full
        collection does not walk torch, the model and the tokenizer inside a step.
        compile_cache_memory: the memory budget of the process's compile cache (bytes, or a size such as "1GiB";
        None: leave it as it is, by default `constraints.compiler.DEFAULT_CACHE_BYTES`); see "Memory" in
        docs/constraints.md.
        max_num_seqs: the engine scheduler's limit on running requests (None: `SchedulerConfig`'s default); the
        one admission limit of every call on this LLM, the server's --max-batch-size.
        kv_cache_memory: bytes of KV cache the engine may hold (or a size such as "4GiB"; `EngineConfig`'s field;
        None: no bound)."""
        from dllm_constrain.engine.loader import load_checkpoint
        from dllm_constrain.engine.placement import parse_dtype, resolve_device, resolve_dtype, stored_dtype

        if model_path is not None and not isinstance(model_path, (str, os.PathLike)):
            raise InvalidRequestError(f"model_path must be a checkpoint folder path (or None for the bundled "
                                      f"model), got {_given(model_path)}")
        if compile_cache_memory is not None:  # checked (and set) before the checkpoint loads
            COMPILE_CACHE.set_max_bytes(compile_cache_memory)
        config = EngineConfig(kv_cache_memory=None if kv_cache_memory is None else
                              parse_bytes(kv_cache_memory, "kv_cache_memory")).validate()
        where = resolve_device(device)
        wanted = parse_dtype(dtype)
        path = Path(model_path) if model_path is not None else bundled_model_path()
        if model_path is None and not (path / "config.json").is_file():
            raise CheckpointError(f"the bundled model is missing from {path} (config.json not found); "
                                  "train it with `python -m dllm_constrain.train` or pass model=<checkpoint folder>")
        if wanted is None and where.type == "cuda":  # the stored dtype decides whether bfloat16 replaces it
            wanted = resolve_dtype(None, where, stored_dtype(path))
        loaded = load_checkpoint(path, dtype=wanted, device=where)
        self._setup(loaded.model, loaded.tokenizer, path, prompt_format, max_logit_rows, freeze_gc_heap,
                    max_num_seqs, config)

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, *, prompt_format: str = "auto",
                   max_logit_rows: int = 32, path: str | Path | None = None,
                   freeze_gc_heap: bool = True) -> "LLM":
        """Wrap an already built DiffusionLM and tokenizer (our Tokenizer or a `tokenizers.Tokenizer`). `path`: the
        checkpoint folder they were loaded from, whose generation_config.json gives the decoding defaults (without
        it, the engine's own defaults)."""
        self = cls.__new__(cls)
        self._setup(model, tokenizer, Path(path) if path is not None else None, prompt_format, max_logit_rows,
                    freeze_gc_heap)
        return self

    def _setup(self, model: Any, tokenizer: Any, path: Path | None, prompt_format: str, max_logit_rows: int,
               freeze_gc_heap: bool = True, max_num_seqs: int | None = None,
               config: EngineConfig | None = None) -> None:
        if prompt_format not in PROMPT_FORMATS:
            raise InvalidRequestError(f"prompt_format must be one of {PROMPT_FORMATS}, got {prompt_format!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.path = path
        self.device = model_device(model)  # where the model's weights are (LLM(device=...) or from_model's model)
        self.dtype = model_dtype(model)
        limits = SchedulerConfig() if max_num_seqs is None else SchedulerConfig(max_num_seqs=max_num_seqs)
        self.engine = LLMEngine(model, tokenizer, max_logit_rows=max_logit_rows, config=config,
                                scheduler_config=limits)
        warm_up(self.engine)  # on CUDA, every kernel variant the steps launch compiles now, not in a request
        config = getattr(tokenizer, "tokenizer_config", None)
        self.chat_template = ChatTemplate.from_tokenizer_config(config) if isinstance(config, dict) else None
        if prompt_format == "auto":
            ours = all(self._token_id(t) is not None for t in ("<|bos|>", "<|mask|>"))
            prompt_format = "request" if ours else "chat" if self.chat_template is not None else "raw"
        if prompt_format == "chat" and self.chat_template is None:
            raise InvalidRequestError("prompt_format='chat' needs a chat_template in the checkpoint's "
                                      "tokenizer_config.json; this one has none (use 'raw' or 'request')")
        self.prompt_format = prompt_format
        self.family: str | None = getattr(model, "family", None)
        self.defaults = GenerationDefaults.from_folder(path, self.family, context=model.max_sequence_length,
                                                       stop_token_ids=self._stop_ids(model.special.eos_id))
        self._compiler: Any = None  # the ConstraintCompiler, made by the first constrained call
        self._info: TokenizerInfo | None = None
        self._compile_pool: ThreadPoolExecutor | None = None  # the compile thread, made on first use
        self.processor = Processor(self)  # the request builder of every call (dllm_constrain.processor)
        if freeze_gc_heap:
            # the loaded model, tokenizer and torch's own objects leave the collector's reach (once per process):
            # a full collection no longer walks them inside a step (dllm_constrain.gc_heap)
            freeze_startup_heap()

    # ------------------------------------------------------------------ tokenizer helpers
    def _token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def _stop_ids(self, eos_id: int) -> tuple[int, ...]:
        """Ids that end an answer besides the model's EOS: the checkpoint's eos_token_id lists (config.json,
        generation_config.json; `engine.tokenizer`) and the end-of-turn token its chat template writes."""
        listed = list(getattr(self.tokenizer, "stop_ids", ()))
        if self.chat_template is not None:
            listed += [self._token_id(t) for t in self.chat_template.end_of_turn_tokens()]
        return tuple(dict.fromkeys(t for t in listed if t is not None and t != eos_id))

    def encode(self, text: str) -> list[int]:
        """Prompt ids, with the tokenizer's own special-token post-processing (e.g. a leading BOS)."""
        if isinstance(self.tokenizer, tokenizers.Tokenizer):
            return self.tokenizer.encode(text, add_special_tokens=True).ids
        return list(self.tokenizer.encode(text, add_special=True))

    def encode_text(self, text: str) -> list[int]:
        """Ids of a piece of answer text (a template's pinned text, a label): no special tokens."""
        if isinstance(self.tokenizer, tokenizers.Tokenizer):
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special=False))

    def format(self, prompt: Prompt | Sequence[Mapping[str, Any]], schema: Any = None) -> str:
        """The text the model sees for `prompt` (a string or a conversation) under this LLM's prompt format:
        "chat" renders the chat template (a string is one user message; the schema is left to the constraint),
        "request" the bundled model's format (a conversation's user messages joined by newlines; `schema` as the
        compact field sketch it reads), "raw" the text as given (a conversation is refused)."""
        if not isinstance(prompt, str):
            prompt = validate_prompts(prompt)[0]
        if self.prompt_format == "chat":
            assert self.chat_template is not None  # _setup refuses "chat" without one
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            return self.chat_template.render(messages)
        if not isinstance(prompt, str):
            if self.prompt_format == "raw":
                raise InvalidRequestError("a conversation needs a chat template: this LLM takes raw text prompts "
                                          "(prompt_format='raw')")
            prompt = "\n".join(m["content"] for m in prompt if m.get("role") == "user" and m["content"].strip())
            if not prompt:
                raise InvalidRequestError("the conversation has no user message with text content")
        if self.prompt_format == "raw":
            return prompt
        return format_prompt(prompt, None if schema is None else schema_sketch(_schema_to_dict(schema)))

    def prompt_ids(self, prompt: Prompt | Sequence[Mapping[str, Any]], schema: Any = None) -> list[int]:
        """The prompt's token ids as the engine gets them: `format`, then encoded; a rendered chat template
        carries its own special tokens (its BOS), so it is encoded without the tokenizer's post-processing,
        as transformers' apply_chat_template(..., tokenize=True) encodes it."""
        text = self.format(prompt, schema)
        if self.prompt_format != "chat":
            return self.encode(text)
        if isinstance(self.tokenizer, tokenizers.Tokenizer):
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special=False))

    # ------------------------------------------------------------------ constraints
    def tokenizer_info(self) -> TokenizerInfo:
        """What the constraint layer knows of this LLM's tokenizer (as wide as the model's logits)."""
        if self._info is None:
            self._info = TokenizerInfo.from_tokenizer(self.tokenizer, vocab_size=self.engine.vocab_size,
                                                      eos_id=self.model.special.eos_id,
                                                      mask_id=self.model.special.mask_id)
        return self._info

    def _constraint_compiler(self) -> Any:
        if self._compiler is None:
            self._compiler = ConstraintCompiler(self.tokenizer_info())
        return self._compiler

    def compile(self, *, schema: Any = None, regex: Any = None, grammar: Any = None, whitespace: str | None = None,
                strict: bool = True, schema_options: dict[str, Any] | None = None,
                compile_timeout: float | None = None) -> Compiled:
        """The compiled constraint for a schema, a regex or a Lark grammar (a shipped name, a .lark path or
        grammar text): the OutputConstraint these fields make (see `OutputConstraint`; strict: the generation
        narrowings STRICT_SCHEMA_OPTIONS), compiled once per tokenizer (the compiler's bounded cache)."""
        constraint = Processor.output_constraint(schema=schema, regex=regex, grammar=grammar, whitespace=whitespace,
                                                 strict=strict, schema_options=schema_options,
                                                 compile_timeout=compile_timeout)
        if constraint is None:
            raise InvalidRequestError("compile takes one of schema=, regex= and grammar=")
        return self.compile_constraint(constraint)

    def compile_constraint(self, constraint: OutputConstraint) -> Compiled:
        """`constraint` compiled through `ConstraintCompiler.compile` and its one cache (per tokenizer and
        normalised constraint)."""
        return compile_constraint(self._constraint_compiler(), self.tokenizer_info().fingerprint, COMPILE_CACHE,
                                  **constraint.compile_kwargs())

    def constraint_for_engine(self, constraint: OutputConstraint) -> Compiled | PendingConstraint:
        """What a request takes as its constraint: the compiled one when the compile cache has it (a cached refusal
        is raised here), else a `PendingConstraint` to compile on this LLM's compile thread, started by the engine
        once it has started a forward (or by `result()`). The engine runs the request's first forward meanwhile (it
        reads the all-open canvas, whatever the constraint), so a schema the process has not seen costs its
        compilation only where that outlasts the forward. The input is checked and normalised here, on the caller's
        thread (a malformed schema is refused before any forward)."""
        hit = compile_constraint(self._constraint_compiler(), self.tokenizer_info().fingerprint, COMPILE_CACHE,
                                 cached_only=True, **constraint.compile_kwargs())
        if hit is not None:
            return hit
        return PendingConstraint(self._compile_executor(), lambda: self.compile_constraint(constraint))

    def _compile_executor(self) -> ThreadPoolExecutor:
        """This LLM's compile thread (one: compilations run one at a time, in submission order), made on first use."""
        with _LOOP_LOCK:
            pool = self._compile_pool
            if pool is None:
                pool = self._compile_pool = ThreadPoolExecutor(1, thread_name_prefix="dllm-compile")
            return pool

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: str | Sequence[str], sampling_params: SamplingParams | None = None,
                 **options: Any) -> list[GenerationResult]:
        """Generate for each prompt (one batch); returns one GenerationResult per prompt, in order. A prompt is a
        string or a conversation (a list of {"role", "content"} messages), rendered by this LLM's prompt format
        (`format`); `prompts` is one prompt or a list of them.

        sampling_params: the requests' SamplingParams (None: the checkpoint's defaults, its generation_config.json
        over the SamplingParams field defaults). options: keywords routed by field name (dllm_constrain.options):
        SamplingParams fields (max_new_tokens, steps, block_length, policy, threshold, temperature, seed,
        entropy_bound, timeout, constraint_timeout; None for the first five: the checkpoint's default),
        OutputConstraint fields (schema | regex | grammar, strict, schema_options, whitespace, compile_timeout;
        schema= also takes an output type object, see `validate_constraint`), EngineConfig fields (kv_cache,
        refresh, refresh_steps, refresh_threshold, keep_ratio, logits_budget_bytes, ...: engine settings for
        this call; the others keep the engine's), progress (called with a StepEvent after every step) and preset
        ("reference": the settings under which greedy answers equal the authors' generate() / diffusion_generate(),
        see `GenerationDefaults.preset_sampling`; the given keywords still win; None / "fast": the defaults).

        Raises InvalidRequestError (or its subclass PromptTooLongError) for bad input (an unknown keyword, a bad
        value: every field is checked by its function in REQUEST_FIELDS, prompts by `validate_prompts`), a
        ConstraintError subclass for a constraint that cannot be compiled or cannot fit the canvas: before any
        forward for input the compiler refuses at once or a constraint compiled before; a constraint compiled for
        this call compiles beside the requests' first forward (`constraint_for_engine`), so its refusal comes
        after that forward.
        """
        loop = self._engine_loop()
        if loop.on_loop_thread:
            raise InvalidRequestError("LLM.generate() was called from the engine loop thread (inside a progress "
                                      "or stream callback): it would wait for itself; use LLM.submit there")
        return self.submit(prompts, sampling_params, **options).result()

    def decide(self, text: str, questions: Sequence[Question | dict[str, Any]], *, joint: bool = False,
               **options: Any) -> DecisionResult:
        """Answer typed questions (predicate, choice, score; `decisions.Question` or vLLM's wire dicts) about
        `text`: each question a slot constrained to its labels, `joint=True` all of them on one canvas; per-label
        probabilities with each answer (meaning: dllm_constrain.decisions). options: generation keywords."""
        return decide(self, text, questions, joint=joint, **options)

    def submit(self, prompts: str | Sequence[str], sampling_params: SamplingParams | None = None, *,
               on_stream: StreamCallback | None = None, on_start: Callable[[], None] | None = None,
               **options: Any) -> CallHandle:
        """Queue a generation (the arguments of `generate`) on this LLM's engine loop without waiting: returns a
        CallHandle (`.result(timeout)` -> list[GenerationResult], `.future`, `.abort()`). Bad input raises here
        (InvalidRequestError); compilation and engine errors come through the handle. on_stream(index, update):
        each request's committed left prefix (`StreamUpdate`, token ids) after every step that grew it, called
        on the loop thread. on_start(): once, on the loop thread, after the first engine step that served one of
        the call's requests (the scheduler admitted it), before that step's progress event. Thread-safe: any
        number of threads may submit; all calls share one continuous batch (see dllm_constrain.engine_loop)."""
        call = self.processor.build(prompts, sampling_params, compile_beside=True, **options)
        return self._engine_loop().submit(call.make_requests, config=call.config, progress=call.progress,
                                          on_stream=on_stream, on_start=on_start)

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
        with _LOOP_LOCK:
            pool, self._compile_pool = getattr(self, "_compile_pool", None), None
        if pool is not None:
            pool.shutdown(wait=False)


def _resolve_llm(model: Any) -> LLM:
    """An LLM for `model`, loading (and caching, least recently used out) checkpoint folders once.

    `model` is None (the bundled checkpoint), a checkpoint folder, an LLM, or a loaded checkpoint
    (`engine.loader.LoadedModel`: anything with `.model` and `.tokenizer`)."""
    if isinstance(model, LLM):
        return model
    if hasattr(model, "model") and hasattr(model, "tokenizer") and hasattr(model.model, "special"):
        return LLM.from_model(model.model, model.tokenizer, path=getattr(model, "path", None))
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


@overload
def generate(prompt: str, sampling_params: SamplingParams | None = None, *, model: Any = None,
             return_result: Literal[False] = False, **options: Any) -> str: ...
@overload
def generate(prompt: str, sampling_params: SamplingParams | None = None, *, model: Any = None,
             return_result: Literal[True], **options: Any) -> GenerationResult: ...
@overload
def generate(prompt: Sequence[str], sampling_params: SamplingParams | None = None, *, model: Any = None,
             return_result: Literal[False] = False, **options: Any) -> list[str]: ...
@overload
def generate(prompt: Sequence[str], sampling_params: SamplingParams | None = None, *, model: Any = None,
             return_result: Literal[True], **options: Any) -> list[GenerationResult]: ...


def generate(prompt: str | Sequence[str], sampling_params: SamplingParams | None = None, *, model: Any = None,
             return_result: bool = False, **options: Any
             ) -> str | GenerationResult | list[str] | list[GenerationResult]:
    """Generate text for a prompt (-> str) or a list of prompts (-> list[str], one batch).

    model: None (the bundled checkpoint), a checkpoint folder, an LLM or a loaded checkpoint; return_result=True
    returns GenerationResult objects instead of strings; sampling_params and every other keyword as in
    `LLM.generate` (routed by field name onto SamplingParams / OutputConstraint / EngineConfig; an unknown name
    raises InvalidRequestError). A checkpoint loaded here (model None or a path) is on the default placement
    (`LLM(path)`: CUDA when available, see engine.placement); for another device or dtype pass
    `model=LLM(path, device=..., dtype=...)`.
    """
    return_result = REQUEST_FIELDS["return_result"](return_result)
    validate_prompts(prompt)  # before loading a model for a request that cannot run
    check_option_names(options)
    results = _resolve_llm(model).generate(prompt, sampling_params, **options)
    if is_single_prompt(prompt):
        return results[0] if return_result else results[0].text
    return results if return_result else [r.text for r in results]
