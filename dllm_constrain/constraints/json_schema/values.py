"""JSON values as a validator compares them: equality (1 == 1.0, True != 1), canonical keys, JSON types
and the disjoint kinds of values the oneOf checks reason about."""
from __future__ import annotations

import json

from ...errors import InvalidSchemaError


def canon(v) -> str:
    """A key equal for JSON-equal values (1 == 1.0; True != 1)."""
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, (int, float)):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        return "n" + repr(v)
    if isinstance(v, str):
        return "s" + v
    if isinstance(v, list):
        return "[" + ",".join(canon(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(k) + ":" + canon(v[k]) for k in sorted(v)) + "}"
    return repr(v)


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _equal(a, b, numbers_equal) -> bool:
    """JSON equality with numbers compared by `numbers_equal` (True != 1 whatever the reading)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if is_number(a) and is_number(b):
        return numbers_equal(a, b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y, numbers_equal) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k], numbers_equal) for k in a)
    return type(a) is type(b) and a == b


def json_eq(a, b) -> bool:
    """JSON equality (1 == 1.0, but True != 1)."""
    return _equal(a, b, lambda x, y: x == y)


def _as_double(x) -> float:
    try:
        return float(x)
    except OverflowError:  # an integer beyond the doubles reads as an infinity
        return float("inf") if x > 0 else float("-inf")


def double_eq(a, b) -> bool:
    """JSON equality as a validator that reads every number as a double does it (ECMA-262: 2**53 + 1 equals
    2**53). A value must differ from an excluded one under this reading too to be generated."""
    return _equal(a, b, lambda x, y: _as_double(x) == _as_double(y))


def inexact_as_double(x) -> bool:
    """Whether x (a JSON value or schema) holds an integer that a double cannot represent (beyond 2**53): there the
    double reading of a validator (ECMA-262) may decide otherwise than the exact one."""
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return _as_double(x) != x
    if isinstance(x, dict):
        return any(inexact_as_double(v) for v in x.values())
    if isinstance(x, list):
        return any(inexact_as_double(v) for v in x)
    return False


def as_doubles(x):
    """x with every integer read as a double, as an ECMA-262 validator reads the schema and the instance."""
    if isinstance(x, bool) or not isinstance(x, (int, dict, list)):
        return x
    if isinstance(x, int):
        return _as_double(x)
    if isinstance(x, dict):
        return {k: as_doubles(v) for k, v in x.items()}
    return [as_doubles(v) for v in x]


def type_of(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    raise InvalidSchemaError(f"not a JSON value: {v!r}")


def kinds_of_types(types) -> set[str]:
    """JSON types as disjoint kinds of values: "number" is "integer" plus "fraction" (non-integers)."""
    out = set(types)
    if "number" in out:
        out.discard("number")
        out |= {"integer", "fraction"}
    return out


def kind_of(v) -> str:
    t = type_of(v)
    return "fraction" if t == "number" else t


def types_of_kinds(kinds: set[str]) -> list[str]:
    """A `type` list for a set of kinds; non-integers without integers are not expressible (dropped)."""
    out = sorted(k for k in kinds if k not in ("integer", "fraction"))
    if "integer" in kinds:
        out.append("number" if "fraction" in kinds else "integer")
    return sorted(out)


def intersect_types(a: set[str], b: set[str]) -> set[str]:
    out = a & b
    if "integer" in a and "number" in b:
        out.add("integer")
    if "number" in a and "integer" in b:
        out.add("integer")
    return out
