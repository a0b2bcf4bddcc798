"""Lowering of scalar JSON values: enum/const, null, booleans, integers and numbers (bounds read as a
double-reading validator reads them, multipleOf, excluded values)."""
from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

from ...errors import InvalidSchemaError, UnsupportedSchemaError
from .. import dfa_ops
from .. import numeric as N
from .. import regex_ast as A
from .context import LoweringContext
from .ir import Conjunction, NumberRange
from .json_text import FLOAT_EXACT, ZERO_FRACTION, has_other_spellings, value_spellings
from .patterns import pattern_matches
from .values import as_doubles, canon, double_eq, inexact_as_double, is_number, json_eq

_FLOAT_MULTIPLES_MAX = 1000  # multipleOf a non-integer: the products n*k enumerated for |n| up to this


# ------------------------------------------------------------------------------------------ enum / const
def lower_enum(ctx: LoweringContext, s: Conjunction, path: str) -> A.Node:
    """The finite set of values of the enum/const that satisfy every conjunct, in every compact spelling."""
    vals = [s["const"]] if "const" in s else s["enum"]
    if "enum" in s and "const" in s:
        vals = [v for v in s["enum"] if json_eq(v, s["const"])]
    if not isinstance(vals, list):
        raise InvalidSchemaError(f"enum at {path} must be an array")
    keep = []
    seen: set[str] = set()
    excl_keys = {canon(e) for e in s.excluded}
    # integers beyond 2**53 in the conjuncts: a double reading may decide otherwise than the exact one
    inexact_conjuncts = any(inexact_as_double(c) for c in s.conjuncts)
    double_only = False  # a value valid read exactly was left out for its double reading
    for v in vals:
        kv = canon(v)
        if kv in seen or kv in excl_keys or any(double_eq(v, e) for e in s.excluded):
            continue  # excluded under the Python reading or the double reading
        seen.add(kv)
        if not all(ctx.validation.is_valid_fast(v, c) for c in s.conjuncts):
            continue
        if isinstance(v, str) and any(pattern_matches(p, v, path, "any") for p in s.excluded_patterns):
            continue  # `not {pattern}`: a reading may match it
        if (inexact_conjuncts or inexact_as_double(v)) and not all(
                ctx.validation.is_valid(as_doubles(v), as_doubles(c)) for c in s.conjuncts):
            double_only = True  # valid read exactly, not with every number a double (2**53 + 1 > 2**53 fails there)
            continue
        keep.append(v)
    if not keep:
        reading = " read both exactly and with every number a double (as ECMA-262 validators read it)" \
            if double_only else ""
        ctx.unsat.append(f"no value of the enum/const at {path} satisfies the schema{reading}")
        return A.NOTHING
    lits = []
    spelled = []  # values holding numbers: every decimal spelling of each number (1 == 1.0)
    for v in keep:
        try:
            lit = json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except ValueError:
            continue
        if has_other_spellings(v):
            spelled.append(A.alt(A.lit(lit), value_spellings(v)))
        else:
            lits.append(lit)
    return A.alt(A.alt_literals(lits), *spelled) if lits else A.alt(*spelled)


# ------------------------------------------------------------------------------------------ null / boolean
def lower_null(ctx: LoweringContext, s: Conjunction, path: str, excluded: list) -> A.Node:
    return A.NOTHING if excluded else A.lit("null")


def lower_boolean(ctx: LoweringContext, s: Conjunction, path: str, excluded: list) -> A.Node:
    return A.alt(*[A.lit(x) for x, v in (("true", True), ("false", False)) if not any(e is v for e in excluded)])


# ------------------------------------------------------------------------------------------ numbers
def lower_integer(ctx: LoweringContext, s: Conjunction, path: str, excluded: list) -> A.Node:
    node = integer(ctx, s, path)
    if excluded:
        # every literal a reader may take for an excluded value (doubles round)
        node = ctx.difference(node, [N.float_neighbourhood(v) for v in excluded], "not", path)
    return node


def lower_number(ctx: LoweringContext, s: Conjunction, path: str, excluded: list) -> A.Node:
    if not excluded:
        return number(ctx, s, path)
    # no exponent spellings, then remove every decimal spelling of the excluded values
    node = number(ctx, s, path) if (number_range(s, path).bounded or "multipleOf" in s) \
        else N.decimal_range(None, False, None, False)
    return ctx.difference(node, [N.float_neighbourhood(v) for v in excluded], "not", path)


def number_range(s: Any, path: str) -> NumberRange:
    """The bounds of s, moved inward where a double could cross them."""
    lo = hi = None
    lo_strict = hi_strict = False
    for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        if k in s and not is_number(s[k]):
            raise InvalidSchemaError(f"{k} at {path} must be a number")
    if "minimum" in s:
        lo = N.to_decimal(s["minimum"])
    if "exclusiveMinimum" in s:
        v = N.to_decimal(s["exclusiveMinimum"])
        if lo is None or v >= lo:
            lo, lo_strict = v, True
    if "maximum" in s:
        hi = N.to_decimal(s["maximum"])
    if "exclusiveMaximum" in s:
        v = N.to_decimal(s["exclusiveMaximum"])
        if hi is None or v <= hi:
            hi, hi_strict = v, True
    # readers take numbers as doubles (ECMA-262 always, Python for literals with a fraction): bounds
    # that rounding could cross are moved inward (strict ones, and any beyond 2**53), so every admitted
    # literal satisfies them exactly and as a double alike
    lo, lo_strict = N.float_safe_lower(lo, lo_strict)
    hi, hi_strict = N.float_safe_upper(hi, hi_strict)
    return NumberRange(lo, lo_strict, hi, hi_strict)


def _int_bounds(ctx: LoweringContext, s: Any, path: str) -> tuple | None:
    r = number_range(s, path)
    lo, ls, hi, hs = r.lo, r.lo_strict, r.hi, r.hi_strict
    ilo = None if lo is None else (math.floor(lo) + 1 if ls else math.ceil(lo))
    ihi = None if hi is None else (math.ceil(hi) - 1 if hs else math.floor(hi))
    if ilo is not None and ihi is not None and ilo > ihi:
        ctx.unsat.append(f"no integer in the range at {path}")
        return None
    return ilo, ihi


def integer(ctx: LoweringContext, s: Any, path: str) -> A.Node:
    """Integers in canonical digits, optionally followed by `.0...` (JSON Schema counts 1.0 as an
    integer). A validator reads "n.0" as a float, exact only up to 2**53: the suffix is allowed where
    float rounding cannot change the verdict (bounds of at most 2**53 without multipleOf, or a range
    within +-2**53 with it)."""
    digits = _integer_digits(ctx, s, path)
    if A.is_nothing(digits):
        return A.NOTHING
    if not _zero_fraction_integers(ctx):
        return digits
    b = _int_bounds(ctx, s, path)
    lo, hi = b if b is not None else (None, None)
    small = [x is not None and abs(x) <= FLOAT_EXACT for x in (lo, hi)]
    if all(small) or ("multipleOf" not in s and all(ok or x is None for ok, x in zip(small, (lo, hi)))):
        return A.seq(digits, ZERO_FRACTION)
    return digits


def _zero_fraction_integers(ctx: LoweringContext) -> bool:
    """Whether "1.0" is an integer here: from draft 6 on; draft-03/04 (by the root's `$schema`) say no."""
    if ctx.opts.integer_zero_fraction == "never":
        return False
    return not ctx.refs.declares_draft("draft-03", "draft-04")


def _integer_digits(ctx: LoweringContext, s: Any, path: str) -> A.Node:
    b = _int_bounds(ctx, s, path)
    if b is None:
        return A.NOTHING
    lo, hi = b
    node = N.int_range(lo, hi) if (lo is not None or hi is not None) else N.JSON_INT
    if "multipleOf" not in s:
        return node
    m = s["multipleOf"]
    if not is_number(m) or m <= 0:
        raise InvalidSchemaError(f"multipleOf at {path} must be a positive number")
    if isinstance(m, float) and m.is_integer():
        m = int(m)
    if isinstance(m, float):
        if (1 / m).is_integer():
            return node  # every integer is a multiple of 1/k
        raise UnsupportedSchemaError("multipleOf", path, f"non-integer multipleOf {m}")
    if m > 10000:
        raise UnsupportedSchemaError("multipleOf", path, f"multipleOf {m} too large")
    mult = N.int_multiple_of(m)
    if lo is None and hi is None:
        return mult
    try:
        return dfa_ops.intersect([node, mult], ctx.deadline, ctx.opts.intersection_limit)
    except dfa_ops.TooLarge:
        raise UnsupportedSchemaError("multipleOf", path, "range with multipleOf too large") from None


def number(ctx: LoweringContext, s: Any, path: str) -> A.Node:
    if "multipleOf" in s:
        m = s["multipleOf"]
        if isinstance(m, int) or (isinstance(m, float) and m.is_integer()):
            return integer(ctx, s, path)  # only integer multiples of an integer: narrow to integers
        return _float_multiples(ctx, s, m, path)
    r = number_range(s, path)
    lo, ls, hi, hs = r.lo, r.lo_strict, r.hi, r.hi_strict
    if not r.bounded:
        return N.JSON_NUMBER
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (ls or hs))):
        ctx.unsat.append(f"empty numeric range at {path}: minimum {lo} / maximum {hi}")
        return A.NOTHING
    return N.decimal_range(lo, ls, hi, hs)


def _float_multiples(ctx: LoweringContext, s: Any, m: Any, path: str) -> A.Node:
    """multipleOf a non-integer k: the multiples n*k, |n| <= _FLOAT_MULTIPLES_MAX, that pass jsonschema's own
    float test (instance / k is an integer in float arithmetic) and the bounds -- a finite, sound set --
    and, where numeric.decimal_multiple_of spells them, the multiples over the whole range."""
    if not is_number(m) or m <= 0:
        raise InvalidSchemaError(f"multipleOf at {path} must be a positive number")
    r = number_range(s, path)
    k = N.to_decimal(m)
    texts = _small_multiples(k, m, r)
    small = A.alt_literals(sorted(set(texts))) if texts else A.NOTHING
    dm = N.decimal_multiple_of(k)
    if dm is not None:
        small = A.alt(small, _wide_multiples(ctx, k, dm, r))
    if A.is_nothing(small):
        ctx.unsat.append(f"no multiple of {m} in range at {path}")
        return A.NOTHING
    return small


def _small_multiples(k: Decimal, m: Any, r: NumberRange) -> list[str]:
    lo, ls, hi, hs = r.lo, r.lo_strict, r.hi, r.hi_strict
    texts = []
    for n in range(-_FLOAT_MULTIPLES_MAX, _FLOAT_MULTIPLES_MAX + 1):
        d = (k * n).normalize()
        if lo is not None and (d < lo or (ls and d == lo)):
            continue
        if hi is not None and (d > hi or (hs and d == hi)):
            continue
        txt = format(d, "f")
        if "." in txt:
            txt = txt.rstrip("0").rstrip(".")
        if txt in ("-0", ""):
            txt = "0"
        v = float(txt)
        q = v / float(m)
        try:
            if int(q) != q:
                continue
        except (OverflowError, ValueError):
            continue
        texts.append(txt)
    return texts


def _wide_multiples(ctx: LoweringContext, k: Decimal, dm: tuple, r: NumberRange) -> A.Node:
    """The multiples of k in the range that every double reading accepts (see N.decimal_multiple_of)."""
    lo, ls, hi, hs = r.lo, r.lo_strict, r.hi, r.hi_strict
    mult, bound = dm
    # (the automaton spells only magnitudes below `bound`: a bound beyond it needs no product)
    blo, bls = (None, False) if lo is None or lo <= -bound else (lo, ls)
    bhi, bhs = (None, False) if hi is None or hi >= bound else (hi, hs)
    if blo == 0 and not bls:  # `minimum: 0`, the common case: drop the sign instead
        mult, blo = N.decimal_multiple_of(k, negative=False)[0], None
    if blo is None and bhi is None:
        return mult
    if blo is None or bhi is None or blo < bhi or (blo == bhi and not (bls or bhs)):
        try:
            return dfa_ops.intersect([N.decimal_range(blo, bls, bhi, bhs), mult], ctx.deadline,
                                     ctx.opts.intersection_limit)
        except dfa_ops.TooLarge:
            return A.NOTHING
    return A.NOTHING
