"""A seeded generator of training (and held-out) examples for the bundled model.

Each example is a request in plain English that states some values, optionally a JSON Schema, and the
answer. Schema examples draw from a broad family (objects with 1-8 properties; strings, enums, integers,
numbers, booleans, string formats, arrays, nested objects, optional fields); the answer is compact JSON
that conforms to the schema, with properties in schema order and optional properties present exactly when
the request states them. A share of examples are plain-text tasks with no schema.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from dllm_constrain.prompting import format_prompt, schema_to_prompt_json

FIRST_NAMES = ["Alice", "Bob", "Carla", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kenji",
               "Lena", "Marco", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Sven", "Tara", "Uma", "Victor",
               "Wen", "Yara", "Zoe"]
LAST_NAMES = ["Smith", "Garcia", "Chen", "Muller", "Rossi", "Kowalski", "Okafor", "Silva", "Tanaka", "Dubois",
              "Novak", "Larsen", "Haddad", "Singh", "Brown"]
CITIES = ["Paris", "Berlin", "Tokyo", "Lagos", "Lima", "Oslo", "Madrid", "Toronto", "Sydney", "Cairo", "Seoul",
          "Rome", "Vienna", "Dublin", "Austin", "Denver", "Quito", "Hanoi"]
COUNTRIES = ["France", "Germany", "Japan", "Nigeria", "Peru", "Norway", "Spain", "Canada", "Australia", "Egypt",
             "Italy", "Austria", "Ireland", "Brazil", "India", "Kenya"]
COLORS = ["red", "green", "blue", "yellow", "black", "white", "orange", "purple", "gray", "pink"]
WORDS = ["alpha", "bravo", "delta", "echo", "nova", "orbit", "pixel", "quartz", "river", "solar", "tiger",
         "ultra", "vivid", "waves", "zen", "maple", "cedar", "ember", "frost", "lunar", "metro", "prime"]
PRODUCTS = ["laptop", "phone", "desk", "chair", "lamp", "kettle", "camera", "bicycle", "backpack", "monitor",
            "keyboard", "headphones", "tent", "watch", "guitar"]
DOMAINS = ["example.com", "mail.org", "corp.net", "uni.edu", "shop.io"]
STATUSES = ["active", "inactive", "pending", "archived", "draft", "done", "open", "closed"]
LEVELS = ["low", "medium", "high", "critical"]
ROLES = ["admin", "editor", "viewer", "owner", "guest"]
CATEGORIES = ["books", "music", "sports", "food", "travel", "games", "tools", "garden"]
TAGS = ["new", "sale", "eco", "premium", "classic", "limited", "bundle", "gift", "local", "fast"]


@dataclass
class FieldSpec:
    """One property: its name, the schema fragment, how to draw a value, and how a request phrases it."""

    name: str
    kind: str
    schema: dict[str, Any]
    children: list["FieldSpec"] = field(default_factory=list)


# name -> (kind, options) pools; kinds decide both the schema and the value generator.
STRING_FIELDS = {
    "name": "person", "full_name": "person", "author": "person", "owner": "person", "username": "handle",
    "city": "city", "country": "country", "title": "phrase", "label": "word", "color": "color",
    "product": "product", "code": "code", "nickname": "handle", "company": "company", "street": "street",
    "description": "phrase", "comment": "phrase",
}
FORMAT_FIELDS = {"email": "email", "contact_email": "email", "birth_date": "date", "start_date": "date",
                 "due_date": "date", "created_at": "date-time", "id": "uuid", "website": "uri", "open_time": "time"}
ENUM_FIELDS = {"status": STATUSES, "priority": LEVELS, "role": ROLES, "category": CATEGORIES, "size": ["S", "M", "L", "XL"],
               "unit": ["kg", "g", "lb"], "currency": ["USD", "EUR", "JPY", "GBP"], "day": ["mon", "tue", "wed", "thu", "fri"]}
INT_FIELDS = {"age": (0, 120), "count": (0, 1000), "quantity": (1, 500), "year": (1900, 2100), "rating": (1, 5),
              "score": (0, 100), "floor": (-3, 80), "stock": (0, 10000), "pages": (1, 2000), "rank": (1, 50),
              "port": (1, 65535), "level": (1, 10)}
NUM_FIELDS = {"price": (0, 5000), "weight": (0, 300), "height": (0, 250), "temperature": (-40, 50),
              "latitude": (-90, 90), "longitude": (-180, 180), "discount": (0, 1), "balance": (-1000, 100000)}
BOOL_FIELDS = ["active", "verified", "in_stock", "is_public", "enabled", "paid", "available", "archived_flag"]
ARRAY_FIELDS = {"tags": "tag", "colors": "color", "cities": "city", "scores": "int", "items": "product",
                "aliases": "handle", "ids": "int"}
OBJECT_FIELDS = {"address": ["street", "city", "country", "zip"], "owner": ["name", "email", "age"],
                 "dimensions": ["width", "height", "depth"], "location": ["city", "latitude", "longitude"],
                 "contact": ["email", "phone"], "stats": ["count", "score", "active"]}


class ExampleGenerator:
    """Seeded source of (prompt, answer) pairs; the same seed always yields the same stream."""

    def __init__(self, seed: int, plain_text_share: float = 0.12) -> None:
        self.rng = random.Random(seed)
        self.plain_text_share = plain_text_share

    # ---- values -------------------------------------------------------------------------------------
    def _string_value(self, kind: str) -> str:
        r = self.rng
        if kind == "person":
            return f"{r.choice(FIRST_NAMES)} {r.choice(LAST_NAMES)}"
        if kind == "handle":
            return f"{r.choice(FIRST_NAMES).lower()}{r.randint(1, 99)}"
        if kind == "city":
            return r.choice(CITIES)
        if kind == "country":
            return r.choice(COUNTRIES)
        if kind == "color":
            return r.choice(COLORS)
        if kind == "product":
            return r.choice(PRODUCTS)
        if kind == "word":
            return r.choice(WORDS)
        if kind == "code":
            return f"{r.choice(WORDS)[:3].upper()}-{r.randint(100, 999)}"
        if kind == "company":
            return f"{r.choice(WORDS).capitalize()} {r.choice(['Labs', 'Inc', 'Group', 'Works'])}"
        if kind == "street":
            return f"{r.randint(1, 200)} {r.choice(WORDS).capitalize()} Street"
        if kind == "tag":
            return r.choice(TAGS)
        return f"{r.choice(WORDS)} {r.choice(PRODUCTS)}"  # phrase

    def _format_value(self, fmt: str) -> str:
        r = self.rng
        if fmt == "email":
            return f"{r.choice(FIRST_NAMES).lower()}@{r.choice(DOMAINS)}"
        if fmt == "date":
            return f"{r.randint(1950, 2030)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"
        if fmt == "date-time":
            return (f"{r.randint(2000, 2030)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"
                    f"T{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:00Z")
        if fmt == "time":
            return f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:00Z"  # RFC 3339 full-time needs an offset
        if fmt == "uuid":
            return "-".join("".join(r.choice("0123456789abcdef") for _ in range(n)) for n in (8, 4, 4, 4, 12))
        return f"https://{r.choice(WORDS)}.{r.choice(DOMAINS)}"

    # ---- schema family --------------------------------------------------------------------------------
    def _field(self, name: str | None = None, depth: int = 0) -> FieldSpec:
        r = self.rng
        kinds = ["string", "format", "enum", "int", "num", "bool", "array"] + (["object"] if depth == 0 else [])
        weights = [5, 2, 3, 4, 2, 2, 2] + ([1.5] if depth == 0 else [])
        kind = r.choices(kinds, weights)[0]
        if kind == "string":
            name = name or r.choice(list(STRING_FIELDS))
            schema: dict[str, Any] = {"type": "string"}
            if r.random() < 0.2:
                schema["maxLength"] = 40
            return FieldSpec(name, "string:" + STRING_FIELDS.get(name, "phrase"), schema)
        if kind == "format":
            name = name or r.choice(list(FORMAT_FIELDS))
            fmt = FORMAT_FIELDS.get(name, "email")
            return FieldSpec(name, "format:" + fmt, {"type": "string", "format": fmt})
        if kind == "enum":
            name = name or r.choice(list(ENUM_FIELDS))
            pool = ENUM_FIELDS.get(name, STATUSES)
            values = r.sample(pool, k=min(len(pool), r.randint(2, 5)))
            return FieldSpec(name, "enum", {"type": "string", "enum": values})
        if kind == "int":
            name = name or r.choice(list(INT_FIELDS))
            lo, hi = INT_FIELDS.get(name, (0, 100))
            schema = {"type": "integer"}
            if r.random() < 0.6:
                schema["minimum"] = lo
            if r.random() < 0.4:
                schema["maximum"] = hi
            return FieldSpec(name, "int", schema)
        if kind == "num":
            name = name or r.choice(list(NUM_FIELDS))
            schema = {"type": "number"}
            if r.random() < 0.4:
                schema["minimum"] = NUM_FIELDS.get(name, (0, 100))[0]
            return FieldSpec(name, "num", schema)
        if kind == "bool":
            name = name or r.choice(BOOL_FIELDS)
            return FieldSpec(name, "bool", {"type": "boolean"})
        if kind == "array":
            name = name or r.choice(list(ARRAY_FIELDS))
            item = ARRAY_FIELDS.get(name, "tag")
            items = {"type": "integer"} if item == "int" else {"type": "string"}
            schema = {"type": "array", "items": items}
            if r.random() < 0.4:
                schema["minItems"] = 1
            if r.random() < 0.4:
                schema["maxItems"] = r.randint(3, 5)
            return FieldSpec(name, "array:" + item, schema)
        name = name or r.choice(list(OBJECT_FIELDS))
        child_names = OBJECT_FIELDS.get(name, ["name", "count"])
        children = [self._child(cn) for cn in child_names[: r.randint(1, len(child_names))]]
        schema = {"type": "object", "properties": {c.name: c.schema for c in children},
                  "required": [c.name for c in children]}
        if r.random() < 0.5:
            schema["additionalProperties"] = False
        return FieldSpec(name, "object", schema, children)

    def _child(self, name: str) -> FieldSpec:
        if name in INT_FIELDS or name in ("zip",):
            return FieldSpec(name, "int", {"type": "integer"})
        if name in NUM_FIELDS or name in ("width", "depth"):
            return FieldSpec(name, "num", {"type": "number"})
        if name in FORMAT_FIELDS:
            return FieldSpec(name, "format:" + FORMAT_FIELDS[name], {"type": "string", "format": FORMAT_FIELDS[name]})
        if name in BOOL_FIELDS:
            return FieldSpec(name, "bool", {"type": "boolean"})
        if name == "phone":
            return FieldSpec(name, "string:phone", {"type": "string"})
        return FieldSpec(name, "string:" + STRING_FIELDS.get(name, "word"), {"type": "string"})

    def _value(self, spec: FieldSpec) -> Any:
        r = self.rng
        kind = spec.kind
        if kind.startswith("string:"):
            sub = kind.split(":", 1)[1]
            if sub == "phone":
                return f"+{r.randint(1, 99)} {r.randint(100, 999)} {r.randint(1000, 9999)}"
            return self._string_value(sub)
        if kind.startswith("format:"):
            return self._format_value(kind.split(":", 1)[1])
        if kind == "enum":
            return r.choice(spec.schema["enum"])
        if kind == "int":
            lo = spec.schema.get("minimum", -50 if r.random() < 0.1 else 0)
            hi = spec.schema.get("maximum", max(lo, 0) + r.choice([10, 100, 1000]))
            return r.randint(lo, max(lo, hi))
        if kind == "num":
            lo = spec.schema.get("minimum", 0)
            return round(r.uniform(lo, lo + r.choice([1, 10, 100, 1000])), r.choice([1, 2]))
        if kind == "bool":
            return r.random() < 0.5
        if kind.startswith("array:"):
            item = kind.split(":", 1)[1]
            lo = spec.schema.get("minItems", 0)
            hi = spec.schema.get("maxItems", 4)
            n = r.randint(max(lo, 1 if r.random() < 0.85 else 0), max(lo, min(hi, 4)))
            if item == "int":
                return [r.randint(0, 100) for _ in range(n)]
            return [self._string_value(item) for _ in range(n)]
        return {c.name: self._value(c) for c in spec.children}

    # ---- phrasing -------------------------------------------------------------------------------------
    def _phrase(self, name: str, value: Any) -> str:
        r = self.rng
        label = name.replace("_", " ")
        if isinstance(value, bool):
            return r.choice([f"{label} is {'true' if value else 'false'}",
                             f"{'it is' if value else 'it is not'} {label}" if r.random() < 0.3 else
                             f"{label}: {'yes' if value else 'no'}"])
        if isinstance(value, list):
            shown = ", ".join(str(v) for v in value) if value else "none"
            return r.choice([f"{label} {shown}", f"{label} are {shown}", f"{label}: {shown}"])
        if isinstance(value, dict):
            inner = ", ".join(self._phrase(k, v) for k, v in value.items())
            return f"{label} with {inner}"
        return r.choice([f"{label} {value}", f"{label} is {value}", f"{label}: {value}", f"the {label} is {value}"])

    def _schema_example(self) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
        r = self.rng
        n = r.choices(range(1, 9), [3, 4, 4, 3, 2, 2, 1, 1])[0]
        fields: list[FieldSpec] = []
        seen: set[str] = set()
        while len(fields) < n:
            spec = self._field()
            if spec.name not in seen:
                seen.add(spec.name)
                fields.append(spec)
        required = [f.name for f in fields if r.random() < 0.75] or [fields[0].name]
        schema: dict[str, Any] = {"type": "object", "properties": {f.name: f.schema for f in fields},
                                  "required": required}
        if r.random() < 0.3:
            schema["title"] = r.choice(["Person", "Product", "Order", "Event", "Record", "Item", "Profile"])
        if r.random() < 0.5:
            schema["additionalProperties"] = False
        answer: dict[str, Any] = {}
        stated: dict[str, Any] = {}
        for f in fields:
            is_required = f.name in required
            if not is_required and r.random() < 0.5:
                continue  # optional and not mentioned: omitted from the answer
            value = self._value(f)
            answer[f.name] = value
            if not is_required or r.random() < 0.9:
                stated[f.name] = value
        parts = [self._phrase(k, v) for k, v in stated.items()]
        r.shuffle(parts)
        lead = r.choice(["Create a record with", "Fill in the form:", "Make an entry where", "Return JSON for",
                         "Describe an item with", "I need data:", "Record this:", "Generate an object,"])
        request = f"{lead} {'; '.join(parts)}." if parts else f"{lead} anything that fits."
        return request, json.dumps(answer, separators=(",", ":"), ensure_ascii=False), schema, stated

    def _plain_example(self) -> tuple[str, str]:
        r = self.rng
        task = r.randint(0, 5)
        if task == 0:
            a, b = r.randint(0, 99), r.randint(0, 99)
            return f"What is {a} plus {b}?", f"{a + b}."
        if task == 1:
            city_country = r.choice(list(zip(CITIES[:11], COUNTRIES[:11])))
            return f"Which country is {city_country[0]} in?", f"{city_country[0]} is in {city_country[1]}."
        if task == 2:
            w = r.choice(WORDS)
            return f"Repeat the word {w} twice.", f"{w} {w}"
        if task == 3:
            items = r.sample(COLORS, 3)
            return "Name three colors.", ", ".join(items) + "."
        if task == 4:
            name = r.choice(FIRST_NAMES)
            return f"Say hello to {name}.", f"Hello, {name}!"
        a, b = r.randint(2, 12), r.randint(2, 12)
        return f"What is {a} times {b}?", f"{a * b}."

    def example(self) -> dict[str, Any]:
        """One example: prompt text (formatted), answer text, and the schema/stated values for scoring."""
        if self.rng.random() < self.plain_text_share:
            request, answer = self._plain_example()
            return {"prompt": format_prompt(request, None), "answer": answer, "schema": None, "stated": {},
                    "request": request}
        request, answer, schema, stated = self._schema_example()
        return {"prompt": format_prompt(request, schema_to_prompt_json(schema)), "answer": answer,
                "schema": schema, "stated": stated, "request": request}

    def examples(self, n: int) -> list[dict[str, Any]]:
        return [self.example() for _ in range(n)]
