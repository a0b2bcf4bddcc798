"""Typed decisions: questions (predicate, choice, score) answered as constrained slots of a dLLM canvas, with
per-label probabilities. The Python side of `POST /v1/decisions` (dllm_constrain.serve.decisions), in the shape
vLLM 0.33 serves; the reference, with what the probabilities mean: docs/decisions.md.

Each question is a slot: a span of canvas positions whose text must be exactly one of the question's labels
(predicate: "yes" / "no"; choice: its options, as text; score: its level labels). Labels may be several tokens.
  - one request per question (joint=False): the canvas is the slot alone, constrained by the regex alternation
    of the labels; a label shorter than the slot ends with EOS (the canvas convention).
  - joint=True: every question of the call on ONE canvas, a template whose pinned text is the questions
    (`Q1: <instructions>\\nA: `) with one slot per answer; the constraint is one regex over the whole canvas, so
    every slot is masked to its own labels at every step and a slot committed later reads the answers before it.
The answer is the label the canvas committed: always exactly one of the question's labels (a slot that does not
read as a label after stripping its padding is a ConstraintError, never an answer). Its probabilities are read
at the forward that decided the slot, at no extra forward (`_probabilities`).

Map: Question / Decision / DecisionResult (the types), `decide` (the entry), `_joint_layout` and `_prompt` (the
canvas), `_read_slot` / `_probabilities` (the reading), `_decide_joint` / `_decide_each` (the two ways).
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dllm_constrain.errors import ConstraintError, InvalidRequestError

QUESTION_TYPES = ("predicate", "choice", "score")
PREDICATE_LABELS = ("yes", "no")
MAX_QUESTIONS = 200  # per call, as vLLM 0.33
MAX_JOINT_QUESTIONS = 64  # on one canvas (vLLM 0.33's `joint` packs up to 64)


@dataclass(frozen=True)
class Question:
    """One typed question. `options`: a choice's values (str or bool), a score's level labels; empty for a
    predicate. `descriptions`: one per option (may be empty strings), shown to the model in the prompt."""

    type: str
    instructions: str
    name: str | None = None
    options: tuple[Any, ...] = ()
    descriptions: tuple[str, ...] = ()

    @property
    def labels(self) -> tuple[str, ...]:
        """The texts a slot of this question may hold, in option order."""
        if self.type == "predicate":
            return PREDICATE_LABELS
        return tuple(v if isinstance(v, str) else json.dumps(v) for v in self.options)

    def validate(self) -> None:
        """Raise InvalidRequestError naming what is wrong (the limits of vLLM 0.33's Decisions API)."""
        if self.type not in QUESTION_TYPES:
            raise InvalidRequestError(f"question type must be one of {QUESTION_TYPES}, got {self.type!r}")
        if not isinstance(self.instructions, str):
            raise InvalidRequestError("question instructions must be text")
        lo, hi = {"predicate": (0, 0), "choice": (2, 255), "score": (2, 10)}[self.type]
        if self.type != "predicate" and not lo <= len(self.options) <= hi:
            raise InvalidRequestError(f"a {self.type} question takes {lo}-{hi} options, got {len(self.options)}")
        labels = self.labels
        for label in labels:
            if not label or label != label.strip() or "\n" in label:
                raise InvalidRequestError(f"label {label!r}: labels are non-empty, without surrounding whitespace "
                                          "or line breaks")
        if len(set(labels)) != len(labels):
            raise InvalidRequestError(f"question {self.instructions[:40]!r}: option labels must be distinct")

    def value_of(self, index: int) -> Any:
        """The answer value of label `index`: a predicate's bool, a choice's option value, a score's level."""
        if self.type == "predicate":
            return index == 0
        return self.options[index] if self.type == "choice" else index


def question_from_dict(d: dict[str, Any]) -> Question:
    """A Question from vLLM's wire shape: {"type", "instructions", "name"?, "choices": [{"value", "description"}]
    | "levels": [{"label", "description"}]}."""
    if not isinstance(d, dict):
        raise InvalidRequestError(f"a question is an object, got {type(d).__name__}")
    kind = d.get("type")
    items = d.get("choices") if kind == "choice" else d.get("levels") if kind == "score" else []
    if not isinstance(items, list):
        raise InvalidRequestError(f"a {kind} question needs a list of {'choices' if kind == 'choice' else 'levels'}")
    key = "value" if kind == "choice" else "label"
    q = Question(type=kind, instructions=d.get("instructions", ""), name=d.get("name"),
                 options=tuple(i.get(key) if isinstance(i, dict) else i for i in items),
                 descriptions=tuple(i.get("description", "") if isinstance(i, dict) else "" for i in items))
    q.validate()
    return q


@dataclass(frozen=True)
class Decision:
    """One answered question: the committed label (always one of the question's labels), its value, the
    per-label probabilities (label order, summing to 1) and the committed label's confidence."""

    question: Question
    label: str
    value: Any
    probabilities: tuple[float, ...]
    confidence: float

    @property
    def expected_score(self) -> float:
        """A score question's expected level (0-indexed), as vLLM's `score`."""
        return sum(i * p for i, p in enumerate(self.probabilities))


@dataclass
class DecisionResult:
    """The answers of one call with its cost: forwards (summed over the call's requests), tokens, wall time."""

    decisions: list[Decision]
    nfe: int
    input_tokens: int
    output_tokens: int
    wall_time: float
    canvases: list[str] = field(default_factory=list)


def regex_literal(text: str) -> str:
    """`text` as a regex matching it literally (every ASCII non-alphanumeric escaped, controls as \\xHH)."""
    out = []
    for ch in text:
        if ch.isascii() and not ch.isalnum():
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else "\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _alternation(labels: Sequence[str]) -> str:
    return "(?:" + "|".join(regex_literal(label) for label in labels) + ")"


def _prompt(text: str, questions: Sequence[Question], joint: bool) -> str:
    """The request text: the input, then each question's options (joint: the questions themselves are the pinned
    text of the canvas, so the prompt names only their options)."""
    lines = [text.strip(), ""]
    for i, q in enumerate(questions, 1):
        opts = [f"{label} ({d})" if d else label for label, d in zip(q.labels, q.descriptions or ("",) * len(q.labels))]
        if joint:
            lines.append(f"Q{i} options: " + ", ".join(opts))
        else:
            lines += ["Question: " + q.instructions, "Answer with one of: " + ", ".join(opts)]
    return "\n".join(lines)


@dataclass(frozen=True)
class _Slot:
    start: int
    fills: tuple[tuple[int, ...], ...]  # per label: the slot's ids (label tokens, then padding)


def _fills(llm: Any, q: Question, pad: int) -> tuple[tuple[int, ...], ...]:
    ids = [llm.encode_text(label) for label in q.labels]
    width = max(len(x) for x in ids)
    return tuple(tuple(x + [pad] * (width - len(x))) for x in ids)


def _single_token(llm: Any, text: str) -> int:
    ids = llm.encode_text(text)
    if len(ids) != 1:
        raise InvalidRequestError(f"joint decisions pad slots with {text!r}, which this tokenizer writes as "
                                  f"{len(ids)} tokens")
    return ids[0]


def _joint_layout(llm: Any, questions: Sequence[Question]) -> tuple[str, list[int], list[int], list[_Slot]]:
    """The joint canvas: (regex over the whole canvas, seed ids, pinned positions, slots)."""
    space, mask = _single_token(llm, " "), llm.model.special.mask_id
    seed: list[int] = []
    pinned: list[int] = []
    slots: list[_Slot] = []
    pattern = []
    for i, q in enumerate(questions, 1):
        text = ("" if i == 1 else "\n") + f"Q{i}: {q.instructions}\nA: "
        ids = llm.encode_text(text)
        pinned += range(len(seed), len(seed) + len(ids))
        seed += ids
        fills = _fills(llm, q, space)
        slots.append(_Slot(len(seed), fills))
        seed += [mask] * len(fills[0])
        pattern.append(regex_literal(text) + _alternation(q.labels) + " *")
    ids = llm.encode_text("\n")
    pinned += range(len(seed), len(seed) + len(ids))
    seed += ids
    pattern.append(regex_literal("\n"))
    return "".join(pattern), seed, pinned, slots


def _distinct_span(slot: _Slot) -> tuple[int, int]:
    """[a, b) offsets in the slot between its first and last position where the label fills differ (outside it
    every label has the same token: a common factor, and committing it decides nothing)."""
    differ = [j for j in range(len(slot.fills[0])) if len({fill[j] for fill in slot.fills}) > 1]
    return differ[0], differ[-1] + 1


def _read_slot(slot: _Slot) -> tuple[int, int, tuple[int, ...]]:
    """The engine's read request for a slot (SamplingParams.read_slots): the span where its labels differ and the
    ids the label fills use there."""
    a, b = _distinct_span(slot)
    ids = tuple(sorted({t for fill in slot.fills for t in fill[a:b]}))
    return slot.start + a, slot.start + b, ids


def _probabilities(slot: _Slot, read: torch.Tensor | None, committed: int) -> tuple[list[float], float]:
    """The labels' renormalised product-of-marginals probabilities from the slot's reading, and the labels' total
    mass over the vocabulary (positions not read, committed without the model, are skipped: a factor every label
    still possible shares). Without a reading (every position of the slot was forced) the committed label is the
    only one the constraint allowed: probability 1.

    The reading is the first forward whose commits touch the part of the slot where the labels differ
    (SamplingParams.read_slots keeps its log-probabilities). A label l fills the slot with its canonical tokens
    and padding, f_1..f_L, and P(l) = prod_j p_j(f_j(l)) / sum_l' prod_j p_j(f_j(l')), p_j the model's
    distribution at slot position j in that forward (temperature 1). Masking a position to the tokens some label
    has there scales every product alike, so P is the same from the masked or the full distribution. Why: a
    masked dLLM predicts one forward's positions independently, so the product of marginals is the probability
    it gives a whole filling in that forward, the distribution the answer was drawn from; it covers multi-token
    labels exactly and sums to 1 over the labels. The confidence (second value's use) is the committed label's
    product probability over the whole vocabulary, as vLLM's is."""
    if read is None:
        return [1.0 if i == committed else 0.0 for i in range(len(slot.fills))], 1.0
    a, b = _distinct_span(slot)
    _, _, ids = _read_slot(slot)
    column = {t: c for c, t in enumerate(ids)}
    scores = []
    for fill in slot.fills:
        terms = [float(read[j, column[t]]) for j, t in enumerate(fill[a:b])]
        scores.append(sum(x for x in terms if not math.isnan(x)))
    top = max(scores)
    weights = [math.exp(x - top) for x in scores]
    total = sum(weights)
    return [w / total for w in weights], math.exp(top) * total


def _committed_label(llm: Any, q: Question, slot_ids: Sequence[int]) -> int:
    eos = llm.model.special.eos_id
    ids = list(slot_ids)
    if eos in ids:
        ids = ids[:ids.index(eos)]
    text = llm.engine.decode(ids).rstrip(" ")
    if text not in q.labels:
        raise ConstraintError(f"the slot of question {q.instructions[:40]!r} reads {text!r}, not one of its labels")
    return q.labels.index(text)


def _decision(q: Question, slot: _Slot, label: int, read: torch.Tensor | None) -> Decision:
    probs, mass = _probabilities(slot, read, label)
    return Decision(q, q.labels[label], q.value_of(label), tuple(probs), probs[label] * mass)


def decide(llm: Any, text: str, questions: Sequence[Question | dict[str, Any]], *, joint: bool = False,
           **options: Any) -> DecisionResult:
    """Answer `questions` about `text` with `llm` (an api.LLM). joint: all questions on one canvas (at most 64);
    else one request per question, run as one batch. options: generation keywords (policy, steps, seed,
    temperature, ...; see LLM.generate); by default the canvas is one block and `steps` is the number of
    questions (joint) or 1 (one slot)."""
    start = time.perf_counter()
    qs = [q if isinstance(q, Question) else question_from_dict(q) for q in questions]
    for q in qs:
        q.validate()
    if not 1 <= len(qs) <= MAX_QUESTIONS:
        raise InvalidRequestError(f"questions: 1-{MAX_QUESTIONS} per call, got {len(qs)}")
    if joint and len(qs) > MAX_JOINT_QUESTIONS:
        raise InvalidRequestError(f"joint: at most {MAX_JOINT_QUESTIONS} questions on one canvas, got {len(qs)}")
    if not isinstance(text, str):
        raise InvalidRequestError("input must be text")
    forbidden = {"schema", "regex", "grammar", "template", "seed_canvas", "pinned", "max_new_tokens"} & set(options)
    if forbidden:
        raise InvalidRequestError(f"decide sets {sorted(forbidden)} itself (each question is a constrained slot)")
    if joint:
        return _decide_joint(llm, text, qs, options, start)
    return _decide_each(llm, text, qs, options, start)


def _decide_joint(llm: Any, text: str, qs: list[Question], options: dict[str, Any], start: float) -> DecisionResult:
    pattern, seed, pinned, slots = _joint_layout(llm, qs)
    n = len(seed)
    opts = {"block_length": n, "steps": len(qs), **options}
    prompt = _prompt(text, qs, joint=True)  # LLM.generate applies the checkpoint's request format
    [res] = llm.generate([prompt], regex=pattern, seed_canvas=seed, pinned=pinned, max_new_tokens=n,
                         read_slots=tuple(_read_slot(s) for s in slots), **opts)
    if res.error is not None:
        raise res.error
    canvas = list(res.canvas_ids)
    labels = [_committed_label(llm, q, canvas[s.start:s.start + len(s.fills[0])]) for q, s in zip(qs, slots)]
    reads = res.slot_logprobs or [None] * len(slots)
    return DecisionResult([_decision(q, s, lab, r) for q, s, lab, r in zip(qs, slots, labels, reads)], nfe=res.nfe,
                          input_tokens=len(llm.encode(llm.format(prompt))), output_tokens=n - len(pinned),
                          wall_time=time.perf_counter() - start, canvases=[res.text])


def _decide_each(llm: Any, text: str, qs: list[Question], options: dict[str, Any], start: float) -> DecisionResult:
    eos = llm.model.special.eos_id
    slots = [_Slot(0, _fills(llm, q, eos)) for q in qs]
    prompts = [_prompt(text, [q], joint=False) for q in qs]
    opts = {"steps": 1, **options}
    # one request per question, submitted together: the engine loop batches them (each its own canvas, constraint)
    handles = [llm.submit([p], regex=_alternation(q.labels), max_new_tokens=len(s.fills[0]),
                          block_length=len(s.fills[0]), read_slots=(_read_slot(s),), **opts)
               for p, q, s in zip(prompts, qs, slots)]
    results = [h.result()[0] for h in handles]
    for res in results:
        if res.error is not None:
            raise res.error
    labels = [_committed_label(llm, q, res.canvas_ids) for q, res in zip(qs, results)]
    decisions = [_decision(q, s, lab, (res.slot_logprobs or [None])[0])
                 for q, s, lab, res in zip(qs, slots, labels, results)]
    return DecisionResult(decisions, nfe=sum(r.nfe for r in results),
                          input_tokens=sum(len(llm.encode(llm.format(p))) for p in prompts),
                          output_tokens=sum(len(s.fills[0]) for s in slots), wall_time=time.perf_counter() - start,
                          canvases=[r.text for r in results])
