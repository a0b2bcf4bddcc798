"""Lowering of scalar JSON values: enum/const, null, booleans, integers and numbers (bounds read as a
double-reading validator reads them, multipleOf, excluded values)."""
from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

from ...errors import InvalidSchemaError, UnsupportedSchemaError
from .. import dfa_ops
from .. import numeric as N
from .. import regex_ast as A
from ..float_multiples import float_test_multiples
from .context import LoweringContext
from .ir import Conjunction, NumberRange
from .json_text import FLOAT_EXACT, ZERO_FRACTION, has_other_spellings, value_spellings
from .patterns import pattern_matches
from .values import as_doubles, canon, double_eq, inexact_as_double, is_number, json_eq


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
    """multipleOf a non-integer k, read as ctx.opts.multiple_of says.

    "float" (python-jsonschema's test, `int(q) == q` on q = float(x) / float(k), as every double reading
    computes it): the multiples n*k that pass it and the bounds, every one of them for n in a window of
    _FLOAT_WINDOW multiples (the whole range when it holds no more; else the window nearest 0), plus, where
    numeric.decimal_multiple_of spells them, the multiples over the whole range that pass it whatever
    their size (for 0.01: the multiples of 0.25). "decimal": every multiple n*k in the range (decimal
    arithmetic: ajv's multipleOfPrecision, Decimal-based validators), which the float test may reject."""
    if not is_number(m) or m <= 0:
        raise InvalidSchemaError(f"multipleOf at {path} must be a positive number")
    r = number_range(s, path)
    k = N.to_decimal(m)
    if ctx.opts.multiple_of == "decimal":
        node = _decimal_multiples(ctx, k, r, path)
    else:
        dm = N.decimal_multiple_of(k)
        node = A.NOTHING if dm is not None and _dyadic(k) else _window_multiples(k, m, r)
        if dm is not None:
            node = A.alt(node, _wide_multiples(ctx, k, dm, r))
    if A.is_nothing(node):
        ctx.unsat.append(f"no multiple of {m} in range at {path}")
        return A.NOTHING
    return node


_FLOAT_WINDOW = 2 ** 17  # multiples n*k tested under the float reading (0.01: a window 1310.72 wide)
_FLOAT_WINDOW_SLOW = 2000  # where the quotients are not computed in numpy (|n * k| * 10^places >= 2^53)


def _multiple_bounds(k: Decimal, r: NumberRange) -> tuple[int | None, int | None]:
    """The least and greatest n with n*k in the range (None: unbounded)."""
    lo_n = hi_n = None
    if r.lo is not None:
        q = Fraction(r.lo) / Fraction(k)
        lo_n = math.floor(q) + 1 if r.lo_strict else math.ceil(q)
    if r.hi is not None:
        q = Fraction(r.hi) / Fraction(k)
        hi_n = math.ceil(q) - 1 if r.hi_strict else math.floor(q)
    return lo_n, hi_n


def _window(lo_n: int | None, hi_n: int | None, width: int) -> tuple[int, int]:
    """`width` consecutive integers within [lo_n, hi_n] (as many as there are), nearest 0."""
    centre = 0 if lo_n is None else max(lo_n, 0)
    centre = centre if hi_n is None else min(centre, hi_n)
    a, b = centre - width // 2, centre + width // 2
    if lo_n is not None and a < lo_n:
        a, b = lo_n, b + (lo_n - a)
    if hi_n is not None and b > hi_n:
        a, b = a - (b - hi_n), hi_n
    if lo_n is not None:
        a = max(a, lo_n)
    return a, b


def _dyadic(k: Decimal) -> bool:
    """Whether every multiple of k is a dyadic fraction (0.25, 0.5, 1.5): decimal_multiple_of then spells them
    all, and the float test accepts them all."""
    _, digits, exp = k.normalize().as_tuple()
    return exp >= 0 or int("".join(map(str, digits))) % 5 ** -exp == 0


def _window_multiples(k: Decimal, m: Any, r: NumberRange) -> A.Node:
    """The multiples n*k in the window that pass the float test (float_multiples.py)."""
    _, digits, exp = k.normalize().as_tuple()
    places = max(-exp, 0)
    a = int("".join(map(str, digits))) * 10 ** max(exp, 0)
    lo_n, hi_n = _multiple_bounds(k, r)
    if lo_n is not None and hi_n is not None and lo_n > hi_n:
        return A.NOTHING
    n0, n1 = _window(lo_n, hi_n, _FLOAT_WINDOW)
    node = float_test_multiples(a, places, float(m), n0, n1)
    if node is not None:
        return node
    n0, n1 = _window(lo_n, hi_n, _FLOAT_WINDOW_SLOW)
    texts = []
    for n in range(n0, n1 + 1):
        txt = format((k * n).normalize(), "f")
        if "." in txt:
            txt = txt.rstrip("0").rstrip(".")
        try:
            q = float(txt) / float(m)
            if int(q) != q:
                continue
        except (OverflowError, ValueError):
            continue
        texts.append("0" if txt in ("-0", "") else txt)
    return A.alt_literals(sorted(set(texts)))


def _decimal_multiples(ctx: LoweringContext, k: Decimal, r: NumberRange, path: str) -> A.Node:
    """Every multiple of k in the range, decimal-exact (multiple_of="decimal")."""
    mult = N.decimal_multiple_of(k, exact=True)
    if mult is None:
        raise UnsupportedSchemaError("multipleOf", path, f"multipleOf {k} too fine for the decimal reading")
    if r.lo is None and r.hi is None:
        return mult[0]
    try:
        return dfa_ops.intersect([N.decimal_range(r.lo, r.lo_strict, r.hi, r.hi_strict), mult[0]], ctx.deadline,
                                 ctx.opts.intersection_limit)
    except dfa_ops.TooLarge:
        raise UnsupportedSchemaError("multipleOf", path, "range with multipleOf too large") from None


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
