"""One check per option field, and its one message, wherever the value comes from (Python API, CLI, HTTP).

    check = int_check(1)                                  # a positive integer
    field(default=4, metadata=check_metadata(check))      # on a dataclass field (EngineConfig)
    checks_of(EngineConfig)["refresh_steps"](0)           # InvalidRequestError: "refresh_steps must be ..."

A `Check` says what a field takes (`want`) and tests and normalises a value (numpy integers to int, sequences to
tuples). The same check serves the dataclass's own `validate()` (None refused where the field needs a value) and
the keyword routing of `dllm_constrain.options` (`.allowing_none()`: None keeps the checkpoint's or the engine's
value), so a bad value gets the same words from `dc.generate`, the CLI and the server. No torch here: the
command line parses without it.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from dllm_constrain.errors import InvalidRequestError

__all__ = ["Check", "bool_check", "check_metadata", "checks_of", "choice_check", "given", "instance_check",
           "int_check", "int_tuple_check", "real_check", "seed_check", "validate_fields"]


def given(x: Any) -> str:
    """A value as an error message shows it: its repr, and its type unless it is a plain number."""
    return f"{x!r} (a {type(x).__name__})" if not isinstance(x, (int, float)) or isinstance(x, bool) else repr(x)


def is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)  # True is an int to Python, not here


def is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _same(x: Any) -> Any:
    return x


@dataclass(frozen=True)
class Check:
    """What one field takes: `want` (words for the message), `test` and `convert` (the value as stored).
    `optional`: None passes unchanged. `name`: the field's (bound by `checks_of` for dataclass metadata)."""

    want: str
    test: Callable[[Any], bool]
    convert: Callable[[Any], Any] = _same
    optional: bool = False
    name: str = ""

    def __call__(self, x: Any) -> Any:
        if x is None and self.optional:
            return None
        if x is None or not self.test(x):
            raise InvalidRequestError(f"{self.name} must be {self.want}{' (or None)' if self.optional else ''}, "
                                      f"got {given(x)}")
        return self.convert(x)

    def allowing_none(self) -> "Check":
        return self if self.optional else replace(self, optional=True)

    def named(self, name: str) -> "Check":
        return replace(self, name=name)


def int_check(lo: int, *, optional: bool = False, name: str = "") -> Check:
    want = "a positive integer" if lo == 1 else f"an integer >= {lo}"
    return Check(want, lambda x: is_int(x) and x >= lo, int, optional, name)


def real_check(lo: float, hi: float = math.inf, *, lo_open: bool = False, hi_open: bool = False,
               optional: bool = False, name: str = "") -> Check:
    if hi == math.inf:
        want = f"a finite number {'>' if lo_open else '>='} {lo:g}"
    else:
        want = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"

    def test(x: Any) -> bool:
        return is_real(x) and math.isfinite(x) and (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)
    return Check(want, test, float, optional, name)


def choice_check(choices: Sequence[str], *, optional: bool = False, name: str = "") -> Check:
    return Check(f"one of {', '.join(map(repr, choices))}", lambda x: isinstance(x, str) and x in choices, _same,
                 optional, name)


def bool_check(*, optional: bool = False, name: str = "") -> Check:
    return Check("True or False", lambda x: isinstance(x, bool), _same, optional, name)


def seed_check(*, optional: bool = True, name: str = "") -> Check:
    return Check("an integer in [-2**63, 2**64)", lambda x: is_int(x) and -(1 << 63) <= x < (1 << 64), int,
                 optional, name)


def _int_items(x: Any, lo: int | None) -> bool:
    """Whether `x` is a collection (not text, not a one-shot iterator) of integers >= lo."""
    if isinstance(x, (str, bytes)) or not hasattr(x, "__iter__") or iter(x) is x:
        return False
    return all(is_int(i) and (lo is None or i >= lo) for i in x)


def int_tuple_check(want: str = "a list of integers", lo: int | None = None, *, optional: bool = True,
                    name: str = "") -> Check:
    """A sequence of integers (token ids, canvas positions) stored as a tuple of ints; `lo`: their least value."""
    return Check(want, lambda x: _int_items(x, lo), lambda x: tuple(int(i) for i in x), optional, name)


def instance_check(want: str, kind: type | tuple[type, ...], *, optional: bool = True, name: str = "") -> Check:
    return Check(want, lambda x: isinstance(x, kind), _same, optional, name)


def check_metadata(check: Check) -> dict[str, Check]:
    """The dataclass field metadata that carries `check` (see `checks_of`)."""
    return {"check": check}


def checks_of(cls: type) -> dict[str, Check]:
    """Field name -> its check, named after the field, for every field of dataclass `cls` that carries one."""
    return {f.name: f.metadata["check"].named(f.name) for f in fields(cls) if "check" in f.metadata}


def validate_fields(obj: Any, checks: Mapping[str, Check]) -> None:
    """Raise the first failing check's InvalidRequestError, in field order."""
    for name, check in checks.items():
        check(getattr(obj, name))
