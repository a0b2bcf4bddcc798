"""How a request states its facts: lead sentences, key/value phrasings, joiners, lists vs sentences.

Two disjoint sets of templates: `TRAIN` for training and `HELDOUT` for the held-out figures, so the held-out
requests use phrasings the training generator never produces.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Phrasing:
    leads: tuple[str, ...]
    pairs: tuple[str, ...]        # "{k}" = the key as words, "{v}" = the value as written
    bool_pairs: tuple[str, ...]   # "{k}", "{yes}" / "{no}" words
    joiners: tuple[str, ...]
    yes_no: tuple[tuple[str, str], ...]


TRAIN = Phrasing(
    leads=("Create a record with", "Fill in the form:", "Make an entry where", "Return JSON for", "Record this:",
           "Describe an item with", "I need data:", "Generate an object,", "New entry:", "Store the following:",
           "Build a JSON object with", "Log this entry:", "Data:", "Make a record for", "Please record", "Add this:",
           "Save this entry:", "Note this:", "Put on file:", "Create an item where", "Write down", ""),
    # many ways to join a key to its value (verbs, modals, symbols, value first), so that what the model learns is to
    # skip the joining words, not a list of them: the held-out phrasings below are none of these
    pairs=("{k} {v}", "{k} is {v}", "{k}: {v}", "the {k} is {v}", "{k} = {v}", "{k} set to {v}", "with {k} {v}",
           "{k} was {v}", "its {k} is {v}", "{v} as {k}", "{k} equal to {v}", "{k} must be {v}", "{k} will be {v}",
           "{k} becomes {v}", "{k} is now {v}", "{k} => {v}", "{k} := {v}", "{k} == {v}", "{k} equals {v}",
           "change {k} to {v}", "update {k} to {v}", "make {k} {v}", "use {v} for {k}", "{v} for {k}",
           "{v} is the {k}", "the {k}: {v}", "{k} would be {v}", "{k} has to be {v}", "let {k} be {v}",
           "assign {v} to {k}", "{k} needs to be {v}", "{k} ought to be {v}", "{k}={v}", "{k} - {v}",
           "{k} (value {v})", "give {k} the value {v}", "{k} is going to be {v}", "{k} reads {v}"),
    bool_pairs=("{k} is {yes}", "{k}: {yes}", "{k} {yes}", "{k} = {yes}", "{k} set to {yes}", "{k} must be {yes}",
                "{k} == {yes}", "make {k} {yes}", "{k} becomes {yes}", "{k} is now {yes}", "let {k} be {yes}",
                "{k} => {yes}", "change {k} to {yes}"),
    joiners=("; ", ", ", " and ", "; ", ", ", "\n- ", ". ", " / ", "\n", " || ", ";\n", " + "),
    yes_no=(("true", "false"), ("yes", "no")),
)

HELDOUT = Phrasing(
    leads=("Please produce a record:", "Here are the details:", "Can you write this down?", "Entry details -"),
    pairs=("{k} should be {v}", "{k} -> {v}", "set {k} to {v}"),
    bool_pairs=("{k} should be {yes}", "{k} -> {yes}"),
    joiners=(" | ", "; ", "\n* "),
    yes_no=(("true", "false"), ("yes", "no")),
)


def written(value: Any) -> str:
    """A value as a request writes it: strings bare, numbers as JSON writes them, lists comma-separated."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ", ".join(written(v) for v in value) if value else "none"
    return json.dumps(value)


def state_fact(rng: random.Random, p: Phrasing, key: str, value: Any, depth: int = 0) -> str:
    """One fact of a request, e.g. 'age is 36' or 'address with street Elm, city Oslo'."""
    label = key.replace("_", " ") if rng.random() < 0.6 else key
    if isinstance(value, bool):
        yes, no = rng.choice(p.yes_no)
        return rng.choice(p.bool_pairs).format(k=label, yes=yes if value else no)
    if isinstance(value, dict):
        inner = ", ".join(state_fact(rng, p, k, v, depth + 1) for k, v in value.items())
        return rng.choice([f"{label} with {inner}", f"{label} ({inner})", f"{label}: {inner}"])
    if isinstance(value, list) and value and isinstance(value[0], dict):
        items = "; ".join("(" + ", ".join(state_fact(rng, p, k, v, depth + 1) for k, v in item.items()) + ")"
                          for item in value)
        return f"{label}: {items}"
    template = rng.choice(p.pairs)
    if isinstance(value, list) and "{v} as {k}" == template:
        template = "{k}: {v}"
    return template.format(k=label, v=written(value))


def state_request(rng: random.Random, p: Phrasing, facts: dict[str, Any]) -> str:
    """The whole request: a lead and the facts, shuffled, joined by one joiner."""
    items = list(facts.items())
    rng.shuffle(items)
    parts = [state_fact(rng, p, k, v) for k, v in items]
    lead = rng.choice(p.leads)
    if not parts:
        return f"{lead} anything that fits.".strip()
    joiner = rng.choice(p.joiners)
    if joiner.startswith("\n"):
        body = joiner.join([""] + parts)
        return f"{lead or 'Details:'}{body}"
    body = joiner.join(parts)
    return f"{lead} {body}." if lead else f"{body}."
