"""Templates: text with holes made into a pinned canvas (`SamplingParams.seed_canvas` / `pinned`).

A dLLM fills its canvas in any order, so it can fill the holes of a fixed text: the text around the holes is
pinned (committed before the first step, never changed), the holes are the open positions the model denoises,
under the request's constraint where it has one (each hole then only takes tokens that keep the whole canvas
valid).

Hole markers:
  `<hole>`      a hole of `hole_length` tokens (SamplingParams.hole_length, default 8);
  `<hole:N>`    a hole of exactly N tokens;
  `<hole:..N>`  a hole of at most N tokens: its value may end early. Only as the template's last part: the
                answer then ends inside it, and the canvas convention (EOS, then EOS only) pads the rest. A hole
                between pinned texts has a fixed length, because the pinned text after it sits at fixed canvas
                positions; to let a shorter value fit one, compile the schema with `whitespace="flexible"` (the
                value is then padded with whitespace, which JSON ignores).
The pinned text of each part is tokenized on its own, without specials; the constraint layer reads tokens as bytes,
so any tokenization of a valid text is valid. The canvas length (max_new_tokens) is the template's length in tokens.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from dllm_constrain.engine.state import SamplingParams
from dllm_constrain.errors import InvalidRequestError

HOLE_MARKER = re.compile(r"<hole(?::(\.\.)?([0-9]+))?>")
# the most open positions a template's holes may ask for together: checked before the canvas is built (a longer
# canvas than any model's context is refused later anyway, but `<hole:1000000000>` must not allocate first)
MAX_HOLE_TOKENS = 1 << 16


class TemplateError(InvalidRequestError):
    """A template's text cannot be made into a canvas (a bad hole marker, a free hole before pinned text)."""


@dataclass(frozen=True)
class Hole:
    """An open span of `length` canvas positions; `free`: the answer may end inside it (the last part only)."""

    length: int
    free: bool = False


@dataclass(frozen=True)
class TemplateCanvas:
    """A template made into canvas ids: the seed (mask_id at open positions), the pinned positions, and where each
    hole is ([start, end) canvas positions, in template order)."""

    seed_canvas: tuple[int, ...]
    pinned: tuple[int, ...]
    holes: tuple[tuple[int, int], ...]


def parse_template(text: str, hole_length: int = 8) -> list[str | Hole]:
    """The template's parts: pinned texts (non-empty) and holes, in order. Raises TemplateError for a hole of
    length 0, a free hole that is not the last part, a template without holes, or a stray `<hole` marker."""
    if not isinstance(text, str):
        raise TemplateError(f"template must be text with holes, got {type(text).__name__}")
    parts: list[str | Hole] = []
    at = 0
    for m in HOLE_MARKER.finditer(text):
        if m.start() > at:
            parts.append(text[at:m.start()])
        length = int(m.group(2)) if m.group(2) is not None else hole_length
        if length < 1:
            raise TemplateError(f"template: the hole at character {m.start()} has length 0; a hole needs >= 1 token")
        parts.append(Hole(length, free=m.group(1) is not None))
        at = m.end()
    if at < len(text):
        parts.append(text[at:])
    for p in parts:
        if isinstance(p, str) and "<hole" in p:
            raise TemplateError(f"template: {p[p.index('<hole'):][:16]!r} is not a hole marker; write <hole>, "
                                "<hole:N> or <hole:..N> (or give seed_canvas / pinned token ids)")
    total = sum(p.length for p in parts if isinstance(p, Hole))
    if total > MAX_HOLE_TOKENS:
        raise TemplateError(f"template: its holes ask for {total} tokens; at most {MAX_HOLE_TOKENS} are allowed")
    if not any(isinstance(p, Hole) for p in parts):
        raise TemplateError("template has no hole (<hole>, <hole:N> or <hole:..N>): nothing to generate")
    for i, p in enumerate(parts[:-1]):
        if isinstance(p, Hole) and p.free:
            raise TemplateError(f"template: the free-length hole <hole:..{p.length}> is followed by pinned text; "
                                "only the template's last hole may be free (the text after a hole sits at fixed "
                                "positions): give it a length, <hole:N>, or compile with whitespace='flexible'")
    return parts


def template_canvas(parts: list[str | Hole], encode: Callable[[str], list[int]], mask_id: int) -> TemplateCanvas:
    """The canvas of parsed template parts: each pinned text tokenized on its own (`encode`: text -> ids, no
    specials), each hole `length` open positions."""
    seed: list[int] = []
    pinned: list[int] = []
    holes: list[tuple[int, int]] = []
    for p in parts:
        if isinstance(p, Hole):
            holes.append((len(seed), len(seed) + p.length))
            seed += [mask_id] * p.length
        else:
            ids = encode(p)
            pinned += range(len(seed), len(seed) + len(ids))
            seed += ids
    return TemplateCanvas(tuple(seed), tuple(pinned), tuple(holes))


def apply_template(params: SamplingParams, encode: Callable[[str], list[int]], mask_id: int) -> SamplingParams:
    """`params` with its text template made into seed_canvas / pinned and max_new_tokens set to the template's
    length (unchanged without a template). A template and seed_canvas together are refused (one canvas)."""
    if params.template is None:
        return params
    if params.seed_canvas is not None:
        raise TemplateError("give a template or seed_canvas / pinned, not both")
    canvas = template_canvas(parse_template(params.template, params.hole_length), encode, mask_id)
    out = replace(params, seed_canvas=canvas.seed_canvas, pinned=canvas.pinned,
                  max_new_tokens=len(canvas.seed_canvas))
    out.validate()
    return out
