"""Command line: `python -m dllm_constrain "prompt" [--schema FILE_or_JSON] [--regex R] [--model PATH]
[--device D] [--dtype T] ...`.

Prints the answer on stdout. When stderr is a terminal (and --no-progress is not given) the denoising is
shown live on stderr: committed text, with open canvas positions drawn as ░, redrawn after every step.
Errors print one line `error: ...` on stderr and exit with status 2. Parsing imports no torch (the package's names
load on first use; SamplingParams, which lives beside the engine's torch state, is described by SAMPLING_FLAGS), so
`--help` and argument errors answer at once; the model's modules load after the arguments are read.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import typing
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, TextIO

from typing import TYPE_CHECKING

from dllm_constrain.engine.config import KV_CACHE_MODES, REFRESH_MODES, EngineConfig
from dllm_constrain.errors import DllmConstrainError, InvalidSchemaError

if TYPE_CHECKING:
    from dllm_constrain.engine.outputs import StepEvent

OPEN = "░"


def _json_error(exc: json.JSONDecodeError) -> str:
    return f"{exc.msg} at line {exc.lineno} column {exc.colno}"


def load_schema_arg(value: str) -> Any:
    """--schema takes a file path or inline JSON; a file that is not valid JSON is reported with the decode
    error's line and column (and so is inline text that is not JSON)."""
    path = Path(value)
    try:
        is_file = path.is_file()
    except (OSError, ValueError):  # a long inline schema is no valid path
        is_file = False
    if is_file:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidSchemaError(f"--schema {value}: cannot read the file: {exc}") from None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidSchemaError(f"--schema {value}: the file is not valid JSON: {_json_error(exc)}") from None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        looks_like_path = not value.lstrip().startswith(("{", "[", '"')) and value.strip() not in ("true", "false")
        what = (f"no file {value!r} exists, and the text is not inline JSON either" if looks_like_path
                else "the inline schema is not valid JSON")
        raise InvalidSchemaError(f"--schema: {what}: {_json_error(exc)}") from None


# Flags named after the fields they set (--max-new-tokens -> SamplingParams.max_new_tokens): the help text says
# what the field is, and an unset flag leaves the field's default. EngineConfig's flags take type and default from
# the dataclass; SamplingParams' from this table (its module imports torch; tests/test_cli.py holds the table to the
# dataclass): field -> (help, type, default).
CHECKPOINT_DEFAULT = "the checkpoint's generation_config.json, else {}"
SAMPLING_FLAGS: dict[str, tuple[str, type, Any]] = {
    "max_new_tokens": ("canvas length", int, 128),
    "steps": ("denoising steps (none: one per token)", int, None),
    "block_length": ("semi-autoregressive block length", int, 32),
    "policy": ("commit policy", str, "quota"),
    "threshold": ("confidence threshold for --policy threshold", float, 0.9),
    "entropy_bound": ("gamma for --policy entropy_bound", float, 0.1),
    "temperature": ("sampling temperature (0 = greedy)", float, 0.0),
    "seed": ("random seed (none: a fresh one)", int, None),
    "timeout": ("seconds after which the request ends with an error (none: no limit)", float, None),
    "constraint_timeout": ("seconds each constraint call may take", float, 2.0),
    "forced_tokens": ("commit the tokens the constraint forces without the model", bool, True),
    "schedule": ("how many positions a quota policy commits per step: uniform (LLaDA) or linspace (Dream)", str,
                 "uniform"),
    "order_temperature": ("> 0: draw the positions a quota policy commits, p = softmax(score / T) (Dream's "
                          "alg_temp)", float, 0.0),
    "template": ("answer text with holes to fill: <hole>, <hole:N>, <hole:..N> last (docs/decisions.md)", str, None),
    "hole_length": ("tokens of a <hole> that does not give its length", int, 8),
}
ENGINE_FLAGS: dict[str, str] = {
    "kv_cache": "KV reuse across steps",
    "refresh": "when the KV cache is refreshed inside a block",
    "keep_ratio": "< 1: Reuse steps attend to this share of the most salient cached keys per head",
    "logits_budget_bytes": "transient logits workspace (none: from free device memory)",
    "mask_workers": "threads computing constraint masks beside the forward (0: serially before it; none: 1 on CUDA, 0 on "
                    "the CPU, where 1 runs the forward without the GIL and pays with a second core)",
    "core_split": "with the forward without the GIL, a core of its own for the mask workers and the compile thread "
                  "(none: when torch's threads leave one over)",
    "kv_cache_memory": "bytes of KV cache the engine may hold, e.g. 4GiB or 512MiB; bounds the running requests' KV "
                       "memory at admission (none: no bound)",
}
SIZE_FLAGS = ("kv_cache_memory",)  # byte counts given as sizes such as 4GiB (constraints.byte_lru.parse_bytes)
# engine.state's POLICY_NAMES and SCHEDULES (tests/test_cli.py holds them equal)
CHOICES: dict[str, Sequence[str]] = {"policy": ("quota", "threshold", "entropy", "margin", "entropy_bound"),
                                     "kv_cache": KV_CACHE_MODES, "refresh": REFRESH_MODES,
                                     "schedule": ("uniform", "linspace")}
CHECKPOINT_FIELDS = ("max_new_tokens", "steps", "block_length", "policy", "threshold", "schedule")


def _add_flag(p: argparse.ArgumentParser, name: str, kind: type, help_: str) -> None:
    flag = "--" + name.replace("_", "-")
    if kind is bool:  # --forced-tokens / --no-forced-tokens
        p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_)
    else:
        p.add_argument(flag, type=str if name in SIZE_FLAGS else kind, default=None, choices=CHOICES.get(name),
                       help=help_)


def _add_sampling_flags(p: argparse.ArgumentParser) -> None:
    for name, (what, kind, default) in SAMPLING_FLAGS.items():
        shown = "none" if default is None else default
        said = CHECKPOINT_DEFAULT.format(shown) if name in CHECKPOINT_FIELDS else shown
        _add_flag(p, name, kind, f"{what} (default: {said})")


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(EngineConfig)
    for f in fields(EngineConfig):
        if f.name in ENGINE_FLAGS:
            kinds = [t for t in typing.get_args(hints[f.name]) if t is not type(None)] or [hints[f.name]]
            _add_flag(p, f.name, kinds[0], f"{ENGINE_FLAGS[f.name]} (default: the engine's)")


def field_options(args: argparse.Namespace) -> dict[str, Any]:
    """The SamplingParams and EngineConfig fields the flags set (unset flags are left out); sizes as byte counts
    (InvalidRequestError naming the flag for a bad one)."""
    options = {name: getattr(args, name) for name in [*SAMPLING_FLAGS, *ENGINE_FLAGS]
               if getattr(args, name) is not None}
    for name in SIZE_FLAGS:
        if name in options:
            from dllm_constrain.constraints.byte_lru import parse_bytes

            options[name] = parse_bytes(options[name], "--" + name.replace("_", "-"))
    return options


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dllm_constrain",
                                description="Generate (structured) text with a diffusion language model.")
    p.add_argument("prompt", help="the request text")
    p.add_argument("--schema", help="JSON Schema: a file path or inline JSON")
    p.add_argument("--regex", help="a regular expression the answer must match")
    p.add_argument("--grammar", help="a Lark grammar: a shipped name, a .lark path or grammar text")
    p.add_argument("--model", help="checkpoint folder (default: the bundled model)")
    _add_sampling_flags(p)
    _add_engine_flags(p)
    p.add_argument("--preset", choices=("fast", "reference"), default=None,
                   help="reference: the settings under which greedy answers equal the authors' generate() / "
                        "diffusion_generate() (full recompute, the family's schedule and ranking); default: fast")
    p.add_argument("--prompt-format", choices=("auto", "chat", "request", "raw"), default="auto",
                   help="chat: through the checkpoint's chat template; raw: as given (default: auto, chat for a "
                        "checkpoint with a chat template, the bundled model's request format for it)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default=None,
                   help="where the model runs: cpu, cuda or cuda:N (default: cuda when available, else cpu)")
    p.add_argument("--dtype", default=None,
                   help="weights dtype: bfloat16 (bf16), float16 (fp16) or float32 (fp32) (default: the stored "
                        "dtype; on CUDA bfloat16 for a float32 checkpoint when the GPU supports it)")
    p.add_argument("--no-progress", action="store_true", help="do not draw the denoising on stderr")
    p.add_argument("--stats", action="store_true",
                   help="print NFE, tokens per forward, forced tokens, remasks, backtracks and wall time on stderr")
    return p


class CanvasDisplay:
    """Redraws the first request's canvas on one terminal line per step."""

    def __init__(self, decode: Any, stream: TextIO) -> None:
        self.decode = decode
        self.stream = stream
        self.eos_id: int | None = None

    def render(self, canvas: list[int], committed: list[bool], mask_id: int) -> str:
        """Committed runs decoded together (so multi-byte characters survive), open positions as ░,
        nothing after the first committed EOS that closes the answer."""
        parts: list[str] = []
        run: list[int] = []
        for i, (tok, done) in enumerate(zip(canvas, committed)):
            if done and tok == self.eos_id:
                if run:
                    parts.append(self.decode(run))
                    run = []
                if all(committed[:i]):
                    break
                continue
            if done:
                run.append(tok)
            else:
                if run:
                    parts.append(self.decode(run))
                    run = []
                parts.append(OPEN)
        if run:
            parts.append(self.decode(run))
        return "".join(parts).replace("\n", "↵")

    def __call__(self, event: StepEvent) -> None:
        snap = event.snapshots[0]
        text = self.render(snap.canvas, snap.committed, event.mask_id)
        width = shutil.get_terminal_size((100, 20)).columns - 12
        if len(text) > width:
            text = "…" + text[-(width - 1):]
        self.stream.write(f"\r\x1b[2Kstep {event.step:>4} {text}")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\r\x1b[2K")
        self.stream.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads is not None:
        import torch

        torch.set_num_threads(max(1, args.threads))
    from dllm_constrain.api import LLM, _resolve_llm

    display: CanvasDisplay | None = None
    try:
        schema = load_schema_arg(args.schema) if args.schema is not None else None
        options = field_options(args)  # before the model loads: a bad size is an argument error
        if args.device is None and args.dtype is None and args.prompt_format == "auto":
            llm: LLM = _resolve_llm(args.model)
        else:
            llm = LLM(args.model, device=args.device, dtype=args.dtype, prompt_format=args.prompt_format)
        show = not args.no_progress and sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
        if show:
            display = CanvasDisplay(llm.engine.decode, sys.stderr)
            display.eos_id = llm.model.special.eos_id
        (result,) = llm.generate([args.prompt], schema=schema, regex=args.regex, grammar=args.grammar,
                                 progress=display, preset=args.preset, **options)
    except DllmConstrainError as exc:
        if display is not None:
            display.close()
        print("error: " + " ".join(str(exc).split("\n")), file=sys.stderr)
        return 2
    if display is not None:
        display.close()
    print(result.text)
    if args.stats:
        print(f"nfe={result.nfe} tokens_per_forward={result.tokens_per_forward:.2f} "
              f"forced_tokens={result.forced_tokens} remasks={result.remasks} backtracks={result.backtracks} "
              f"wall_time={result.wall_time:.3f}s finish_reason={result.finish_reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
