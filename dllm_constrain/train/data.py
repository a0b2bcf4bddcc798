"""A seeded generator of training (and held-out) examples for the bundled model.

A schema example is a request in plain English that states some values, the schema it must follow, and the
answer: compact JSON with properties in schema order, optional properties present exactly when the request
states them. Values come from open distributions (`values.py`: pseudo-word names, numbers of any size, dates,
free text, unseen keys), so copying from the request is the only way to the answer; phrasings vary in order,
wording and layout (`phrasing.py`). A share of examples are the plain-text tasks of the grammar and regex
demos (`tasks.py`). `split="heldout"` uses phrasings the training split never produces.

The prompt holds the schema as a compact field sketch (`dllm_constrain.prompting`), as inference does.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from dllm_constrain.prompting import format_prompt, schema_sketch
from dllm_constrain.train import values as V
from dllm_constrain.train.phrasing import HELDOUT, TRAIN, state_request
from dllm_constrain.train.tasks import copy_task, plain_task

# Familiar keys with the value kind they usually hold; a share of every schema's keys are unseen (V.key).
STRING_KEYS = {"name": "person", "full_name": "person", "author": "person", "owner": "person",
               "username": "handle", "nickname": "handle", "city": "place", "country": "place", "title": "phrase",
               "label": "word", "color": "word", "product": "word", "code": "code", "company": "place",
               "description": "phrase", "comment": "phrase", "street": "phrase", "phone": "phone", "note": "phrase"}
FORMAT_KEYS = {"email": "email", "contact_email": "email", "birth_date": "date", "start_date": "date",
               "due_date": "date", "created_at": "date-time", "id": "uuid", "website": "uri", "open_time": "time"}
INT_KEYS = ["age", "count", "quantity", "year", "rating", "score", "floor", "stock", "pages", "rank", "port",
            "level", "zip", "total", "size"]
NUM_KEYS = ["price", "weight", "height", "temperature", "latitude", "longitude", "discount", "balance", "width"]
BOOL_KEYS = ["active", "verified", "in_stock", "is_public", "enabled", "paid", "available", "archived"]
ENUM_KEYS = ["status", "priority", "role", "category", "kind", "unit", "currency", "mode"]
ARRAY_KEYS = ["tags", "colors", "cities", "scores", "items", "aliases", "ids", "members", "labels"]
OBJECT_KEYS = ["address", "owner", "dimensions", "location", "contact", "stats", "details", "meta"]


@dataclass
class FieldSpec:
    """One property: its name, value kind, schema fragment, and children (objects, arrays of objects)."""

    name: str
    kind: str
    schema: dict[str, Any]
    children: list["FieldSpec"] = field(default_factory=list)


class ExampleGenerator:
    """Seeded source of (prompt, answer) pairs; the same seed and split always yield the same stream."""

    def __init__(self, seed: int, plain_text_share: float = 0.2, split: str = "train",
                 simple_share: float = 0.0, copy_share: float = 0.0) -> None:
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        for name, share in (("plain_text_share", plain_text_share), ("simple_share", simple_share),
                            ("copy_share", copy_share)):
            if not 0.0 <= share <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {share!r}")
        self.rng = random.Random(seed)
        self.plain_text_share = plain_text_share
        self.simple_share = simple_share
        self.copy_share = copy_share
        self.phrasing = TRAIN if split == "train" else HELDOUT

    # ---- schema family --------------------------------------------------------------------------------
    def _key(self, pool: list[str] | dict[str, Any]) -> str:
        return V.key(self.rng) if self.rng.random() < 0.35 else self.rng.choice(list(pool))

    def _field(self, depth: int = 0) -> FieldSpec:
        r = self.rng
        kinds = ["string", "format", "enum", "int", "num", "bool", "array"] + (["object"] if depth < 2 else [])
        weights = [5, 2, 2, 4, 2, 2, 2] + ([1.5 if depth == 0 else 0.7] if depth < 2 else [])
        kind = r.choices(kinds, weights)[0]
        if kind == "string":
            name = self._key(STRING_KEYS)
            sub = STRING_KEYS.get(name) or r.choice(list(V.STRING_KINDS))
            schema: dict[str, Any] = {"type": "string"}
            if r.random() < 0.15:
                schema["maxLength"] = 60
            return FieldSpec(name, "string:" + sub, schema)
        if kind == "format":
            name = self._key(FORMAT_KEYS)
            fmt = FORMAT_KEYS.get(name) or r.choice(list(V.FORMAT_KINDS))
            return FieldSpec(name, "format:" + fmt, {"type": "string", "format": fmt})
        if kind == "enum":
            name = self._key(ENUM_KEYS)
            values = list(dict.fromkeys(V.word(r, 1, 2) for _ in range(r.randint(2, 5))))
            return FieldSpec(name, "enum", {"type": "string", "enum": values} if r.random() < 0.8 else
                             {"enum": values})
        if kind == "int":
            schema = {"type": "integer"}
            if r.random() < 0.4:
                schema["minimum"] = r.choice([0, 0, 1, -100])
            if r.random() < 0.3:
                schema["maximum"] = schema.get("minimum", 0) + r.choice([10, 100, 1000, 100000])
            return FieldSpec(self._key(INT_KEYS), "int", schema)
        if kind == "num":
            schema = {"type": "number"}
            if r.random() < 0.3:
                schema["minimum"] = 0
            return FieldSpec(self._key(NUM_KEYS), "num", schema)
        if kind == "bool":
            return FieldSpec(self._key(BOOL_KEYS), "bool", {"type": "boolean"})
        if kind == "array":
            return self._array_field(depth)
        children = self._children(r.randint(1, 4), depth + 1)
        schema = {"type": "object", "properties": {c.name: c.schema for c in children},
                  "required": [c.name for c in children]}
        if r.random() < 0.5:
            schema["additionalProperties"] = False
        return FieldSpec(self._key(OBJECT_KEYS), "object", schema, children)

    def _array_field(self, depth: int) -> FieldSpec:
        r = self.rng
        name = self._key(ARRAY_KEYS)
        if depth == 0 and r.random() < 0.2:  # an array of small objects
            children = self._children(r.randint(1, 3), 2)
            item = {"type": "object", "properties": {c.name: c.schema for c in children},
                    "required": [c.name for c in children]}
            return FieldSpec(name, "array:object", {"type": "array", "items": item, "maxItems": 3}, children)
        item_kind = r.choice(["word", "word", "person", "place", "int", "num"])
        items = {"type": "integer"} if item_kind == "int" else {"type": "number"} if item_kind == "num" \
            else {"type": "string"}
        schema: dict[str, Any] = {"type": "array", "items": items}
        if r.random() < 0.4:
            schema["minItems"] = 1
        if r.random() < 0.4:
            schema["maxItems"] = r.randint(3, 6)
        return FieldSpec(name, "array:" + item_kind, schema)

    def _children(self, n: int, depth: int) -> list[FieldSpec]:
        children: list[FieldSpec] = []
        for _ in range(n * 3):
            spec = self._field(depth)
            if spec.name not in {c.name for c in children}:
                children.append(spec)
            if len(children) == n:
                break
        return children

    # ---- values ---------------------------------------------------------------------------------------
    def _value(self, spec: FieldSpec) -> Any:
        r = self.rng
        kind = spec.kind
        if kind.startswith("string:"):
            value = V.STRING_KINDS[kind.split(":", 1)[1]](r)
            return value[: spec.schema.get("maxLength", len(value))].strip() or "x"
        if kind.startswith("format:"):
            return V.FORMAT_KINDS[kind.split(":", 1)[1]](r)
        if kind == "enum":
            return r.choice(spec.schema["enum"])
        if kind == "int":
            lo, hi = spec.schema.get("minimum"), spec.schema.get("maximum")
            return V.integer(r, lo, hi)
        if kind == "num":
            return V.number(r, spec.schema.get("minimum"))
        if kind == "bool":
            return r.random() < 0.5
        if kind == "object":
            return {c.name: self._value(c) for c in spec.children}
        item = kind.split(":", 1)[1]
        lo, hi = spec.schema.get("minItems", 0), spec.schema.get("maxItems", 4)
        n = r.randint(max(lo, 1 if r.random() < 0.9 else 0), max(lo, min(hi, 4)))
        if item == "object":
            return [{c.name: self._value(c) for c in spec.children} for _ in range(min(n, 3))]
        if item == "int":
            return [V.integer(r, 0, r.choice([9, 99, 9999])) for _ in range(n)]
        if item == "num":
            return [V.number(r, 0.0) for _ in range(n)]
        return [V.STRING_KINDS[item](r) for _ in range(n)]

    # ---- examples -------------------------------------------------------------------------------------
    def _simple_fields(self) -> list[FieldSpec]:
        """1-3 flat fields of short values (a one- or two-syllable word or name, a small integer, a boolean):
        the copy skill in its plainest form, which a small model learns long before it can copy a uuid out of a
        nested list."""
        r = self.rng
        specs: list[FieldSpec] = []
        for _ in range(r.randint(1, 3)):
            kind = r.choices(["person", "place", "word", "int", "bool"], [3, 3, 2, 3, 1])[0]
            if kind == "int":
                spec = FieldSpec(self._key(INT_KEYS), "int", {"type": "integer"})
            elif kind == "bool":
                spec = FieldSpec(self._key(BOOL_KEYS), "bool", {"type": "boolean"})
            else:
                pool = [k for k, v in STRING_KEYS.items() if v == kind] or list(STRING_KEYS)
                spec = FieldSpec(self._key(pool), "short:" + kind, {"type": "string"})
            if spec.name not in {s.name for s in specs}:
                specs.append(spec)
        return specs

    def _short_value(self, spec: FieldSpec) -> Any:
        r = self.rng
        if spec.kind == "short:person":
            return f"{V.word(r, 1, 2).capitalize()} {V.word(r, 1, 2).capitalize()}"
        if spec.kind in ("short:place", "short:word"):
            w = V.word(r, 1, 2)
            return w.capitalize() if spec.kind == "short:place" else w
        if spec.kind == "int":
            return r.randint(0, r.choice([9, 99, 999]))
        return self._value(spec)

    def _schema_example(self) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
        r = self.rng
        simple = r.random() < self.simple_share
        fields = self._simple_fields() if simple else \
            self._children(r.choices(range(1, 8), [3, 4, 4, 3, 2, 1.5, 1])[0], 0)
        required = [f.name for f in fields if r.random() < 0.75] or [fields[0].name]
        schema: dict[str, Any] = {"type": "object", "properties": {f.name: f.schema for f in fields},
                                  "required": required}
        if r.random() < 0.3:
            schema["title"] = V.proper(r)
        if r.random() < 0.5:
            schema["additionalProperties"] = False
        answer: dict[str, Any] = {}
        stated: dict[str, Any] = {}
        for f in fields:
            is_required = f.name in required
            if not is_required and r.random() < 0.5:
                continue  # optional and not mentioned: omitted from the answer
            value = self._short_value(f) if simple else self._value(f)
            answer[f.name] = value
            if not is_required or r.random() < 0.95:
                stated[f.name] = value
        request = state_request(r, self.phrasing, stated)
        return request, json.dumps(answer, separators=(",", ":"), ensure_ascii=False), schema, stated

    def example(self) -> dict[str, Any]:
        """One example: prompt text (formatted), answer text, and the schema/stated values for scoring."""
        if self.copy_share and self.rng.random() < self.copy_share:
            request, answer = copy_task(self.rng)
            return {"prompt": format_prompt(request, None), "answer": answer, "schema": None, "stated": {},
                    "request": request}
        if self.rng.random() < self.plain_text_share:
            request, answer = plain_task(self.rng)
            return {"prompt": format_prompt(request, None), "answer": answer, "schema": None, "stated": {},
                    "request": request}
        request, answer, schema, stated = self._schema_example()
        return {"prompt": format_prompt(request, schema_sketch(schema)), "answer": answer,
                "schema": schema, "stated": stated, "request": request}

    def examples(self, n: int) -> list[dict[str, Any]]:
        return [self.example() for _ in range(n)]
