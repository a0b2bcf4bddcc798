"""Exact regular languages for JSON numbers in ranges.

* Integers: canonical decimal spellings (no leading zeros, no "-0") of the integers in [lo, hi], either
  side unbounded, by the classic digit-range construction (split by digit count, then by leading digit).
* Decimals (JSON Schema "number" with bounds): spellings `-?INT(.FRAC)?` (no exponent, which is a sound
  restriction) whose value lies in the range, inclusive or exclusive on each side, exact for any decimal
  bounds: the integer part is a digit range, the fraction is checked by a small comparison automaton that
  compares the fraction digits with the bound's (zero-padded) digits.
* multipleOf k for integers: a remainder automaton over the digits (k states).
* Float readings: validators read a JSON number as a double (ECMA-262 always; Python's json.loads for any
  literal with a fraction or an exponent), which rounds. `float_safe_lower` / `float_safe_upper` move a bound
  so that every literal on the admitted side of the moved bound is on the admitted side of the original
  bound under the exact reading and under every double reading alike; `float_neighbourhood(v)` holds every
  literal some reader may take for v.
"""
from __future__ import annotations

from decimal import Decimal, localcontext

from . import regex_ast as A

DIGIT = A.chars([(0x30, 0x39)])
NONZERO = A.chars([(0x31, 0x39)])


def _dset(lo: int, hi: int) -> A.Node:
    return A.chars([(0x30 + lo, 0x30 + hi)])


# ------------------------------------------------------------------------------------------ integers
def _same_len(lo: str, hi: str) -> A.Node:
    """Digit strings s with len(s) == len(lo) == len(hi) and lo <= s <= hi (lexicographic = numeric)."""
    if not lo:
        return A.EMPTY
    k = len(lo) - 1
    if lo[0] == hi[0]:
        return A.seq(A.lit(lo[0]), _same_len(lo[1:], hi[1:]))
    a, b = int(lo[0]), int(hi[0])
    if lo[1:] == "0" * k and hi[1:] == "9" * k:
        return A.seq(_dset(a, b), A.rep(DIGIT, k, k))
    parts = []
    start, end = a, b
    if lo[1:] != "0" * k:
        parts.append(A.seq(A.lit(lo[0]), _same_len(lo[1:], "9" * k)))
        start = a + 1
    if hi[1:] != "9" * k:
        parts.append(A.seq(A.lit(hi[0]), _same_len("0" * k, hi[1:])))
        end = b - 1
    if start <= end:
        parts.append(A.seq(_dset(start, end), A.rep(DIGIT, k, k)))
    return A.alt(*parts)


def nat_range(lo: int, hi: int | None) -> A.Node:
    """Canonical spellings of the naturals in [lo, hi] (0 <= lo; hi None = unbounded)."""
    if lo < 0:
        raise ValueError("nat_range needs lo >= 0")
    if hi is not None and hi < lo:
        return A.NOTHING
    parts = []
    L = len(str(lo))
    top = hi if hi is not None else 10 ** L - 1
    for n in range(L, len(str(top)) + 1):
        a = max(lo, 0 if n == 1 else 10 ** (n - 1))
        b = min(top, 10 ** n - 1)
        if a <= b:
            parts.append(_same_len(str(a), str(b)))
    if hi is None:
        # every number with more digits than lo's largest same-length bound
        parts.append(A.seq(NONZERO, A.rep(DIGIT, L, None)))
    return A.alt(*parts)


def int_range(lo: int | None, hi: int | None) -> A.Node:
    """Canonical JSON integers in [lo, hi] (None = unbounded)."""
    if lo is not None and hi is not None and lo > hi:
        return A.NOTHING
    parts = []
    # non-negative part
    if hi is None or hi >= 0:
        parts.append(nat_range(max(lo, 0) if lo is not None else 0, hi))
    # negative part: x = -m, m >= 1
    if lo is None or lo < 0:
        m_lo = max(1, -hi) if hi is not None else 1
        m_hi = -lo if lo is not None else None
        if m_hi is None or m_lo <= m_hi:
            parts.append(A.seq(A.lit("-"), nat_range(m_lo, m_hi)))
    return A.alt(*parts)


# ------------------------------------------------------------------------------------------ decimals
FRAC_OPT = A.opt(A.seq(A.lit("."), A.plus(DIGIT)))
EXP = A.seq(A.chars([(ord("e"), ord("e")), (ord("E"), ord("E"))]), A.opt(A.chars([(ord("+"), ord("+")), (ord("-"), ord("-"))])), A.plus(DIGIT))
JSON_INT = A.alt(A.lit("0"), A.seq(A.opt(A.lit("-")), NONZERO, A.star(DIGIT)))  # no "-0"
JSON_NUMBER = A.seq(A.opt(A.lit("-")), A.alt(A.lit("0"), A.seq(NONZERO, A.star(DIGIT))), FRAC_OPT, A.opt(EXP))


def _split(d: Decimal) -> tuple[int, str]:
    """Non-negative decimal -> (integer part, fraction digits without trailing zeros)."""
    with localcontext() as ctx:
        ctx.prec = 1000
        ip = int(d)  # truncation == floor for d >= 0
        frac = d - ip
    s = format(frac, "f")
    digits = s.split(".")[1] if "." in s else ""
    return ip, digits.rstrip("0")


def _frac_language(lo: str | None, lo_strict: bool, hi: str | None, hi_strict: bool) -> A.Node:
    """Optional fraction part (`.ddd` or nothing) whose value 0.ddd (nothing = 0) satisfies
    0.lo <(=) v <(=) 0.hi. lo/hi are digit strings without trailing zeros (None = no bound)."""
    # comparison automaton: state = (klo, slo, khi, shi, nonempty); s* in {"eq", "gt"/"lt"}
    start = (0, "eq", 0, "eq", False)
    idx: dict = {start: 0}
    edges: list = []
    finals: list[int] = []
    todo = [start]

    def accepting(st) -> bool:
        klo, slo, khi, shi, _ = st
        ok_lo = True
        if lo is not None and slo == "eq":
            rest = lo[klo:]
            ok_lo = (rest == "") and not lo_strict
        ok_hi = True
        if hi is not None and shi == "eq":
            rest = hi[khi:]
            ok_hi = rest != "" or not hi_strict
        return ok_lo and ok_hi

    while todo:
        st = todo.pop()
        klo, slo, khi, shi, ne = st
        by_target: dict = {}
        for x in range(10):
            nlo, nslo = klo, slo
            if lo is not None and slo == "eq":
                ref = int(lo[klo]) if klo < len(lo) else 0
                if x < ref:
                    continue
                if x > ref:
                    nslo = "gt"
                nlo = min(klo + 1, len(lo))
            nhi, nshi = khi, shi
            if hi is not None and shi == "eq":
                ref = int(hi[khi]) if khi < len(hi) else 0
                if x > ref:
                    continue
                if x < ref:
                    nshi = "lt"
                nhi = min(khi + 1, len(hi))
            if nslo == "gt":
                nlo = 0
            if nshi == "lt":
                nhi = 0
            tgt = (nlo, nslo, nhi, nshi, True)
            if tgt not in idx:
                idx[tgt] = len(idx)
                todo.append(tgt)
            by_target.setdefault(tgt, []).append(x)
        for tgt, xs in by_target.items():
            edges.append((idx[st], A.chars([(0x30 + x, 0x30 + x) for x in xs]), idx[tgt]))
    for st, i in idx.items():
        if st[4] and accepting(st):
            finals.append(i)
    # the '.' is emitted before the first digit: a fresh entry node
    n = len(idx)
    entry = n
    edges2 = [(entry, A.lit("."), 0)] + edges
    g = A.Graph(n + 1, entry, tuple(finals), tuple(edges2)) if finals else A.NOTHING
    if accepting(start):
        return A.alt(A.EMPTY, g)
    return g


def mag_range(lo: Decimal | None, lo_strict: bool, hi: Decimal | None, hi_strict: bool) -> A.Node:
    """Spellings INT(.FRAC)? of non-negative decimals v with lo <(=) v <(=) hi (lo None = 0 inclusive)."""
    if lo is None:
        lo, lo_strict = Decimal(0), False
    if hi is not None and (hi < lo or (hi == lo and (lo_strict or hi_strict))):
        return A.NOTHING
    A_, fa = _split(lo)
    parts = []
    if hi is None:
        parts.append(A.seq(nat_range(A_ + 1, None), FRAC_OPT))
        parts.append(A.seq(nat_range(A_, A_), _frac_language(fa, lo_strict, None, False)))
        return A.alt(*parts)
    B_, fb = _split(hi)
    if A_ == B_:
        return A.seq(nat_range(A_, A_), _frac_language(fa, lo_strict, fb, hi_strict))
    parts.append(A.seq(nat_range(A_, A_), _frac_language(fa, lo_strict, None, False)))
    if A_ + 1 <= B_ - 1:
        parts.append(A.seq(nat_range(A_ + 1, B_ - 1), FRAC_OPT))
    parts.append(A.seq(nat_range(B_, B_), _frac_language(None, False, fb, hi_strict)))
    return A.alt(*parts)


def decimal_range(lo: Decimal | None, lo_strict: bool, hi: Decimal | None, hi_strict: bool) -> A.Node:
    """JSON numbers (no exponent) with lo <(=) v <(=) hi; None = unbounded. Never spells "-0"."""
    parts = []
    # v >= 0 part
    if hi is None or hi > 0 or (hi == 0 and not hi_strict):
        if lo is None or lo < 0:
            parts.append(mag_range(None, False, hi, hi_strict))
        else:
            parts.append(mag_range(lo, lo_strict, hi, hi_strict))
    # v < 0 part: "-" + m, m > 0, m = -v
    if lo is None or lo < 0:
        if hi is None or hi >= 0:
            m_lo, m_lo_strict = Decimal(0), True
        else:
            m_lo, m_lo_strict = -hi, hi_strict
        m_hi, m_hi_strict = (None, False) if lo is None else (-lo, lo_strict)
        parts.append(A.seq(A.lit("-"), mag_range(m_lo, m_lo_strict, m_hi, m_hi_strict)))
    return A.alt(*parts)


# ------------------------------------------------------------------------------------------ multipleOf
def int_multiple_of(k: int) -> A.Node:
    """Canonical JSON integers divisible by k (k >= 1): a remainder automaton over the digits."""
    if k == 1:
        return JSON_INT
    # nodes: 0 = start (before sign), 1 = after '-', 2.. = remainder r after >= 1 digit (r + 2)
    # non-negative: "0" or [1-9][0-9]* with remainder 0; negative: "-" then [1-9][0-9]* remainder 0
    n = 2 + k
    zero_node = n  # the literal "0"
    edges = [(0, A.lit("0"), zero_node), (0, A.lit("-"), 1)]
    for src in (0, 1):
        by = {}
        for d in range(1, 10):
            by.setdefault(d % k, []).append(d)
        for r, ds in by.items():
            edges.append((src, A.chars([(0x30 + d, 0x30 + d) for d in ds]), 2 + r))
    for r in range(k):
        by = {}
        for d in range(10):
            by.setdefault((r * 10 + d) % k, []).append(d)
        for r2, ds in by.items():
            edges.append((2 + r, A.chars([(0x30 + d, 0x30 + d) for d in ds]), 2 + r2))
    return A.Graph(n + 1, 0, (2, zero_node), tuple(edges))


def to_decimal(x) -> Decimal:
    if isinstance(x, bool):
        raise TypeError("boolean is not a number")
    if isinstance(x, int):
        return Decimal(x)
    if isinstance(x, float):
        return Decimal(repr(x))
    if isinstance(x, Decimal):
        return x
    raise TypeError(f"not a number: {x!r}")


# ------------------------------------------------------------------------------------------ float readings
FLOAT_EXACT = 2 ** 53  # every integer up to this magnitude is a double
# 1e-307 and every larger literal reads as a normal non-zero double (subnormals may be flushed to zero)
_MIN_MARGIN_EXP = -307


def float_margin(d: Decimal) -> Decimal:
    """A power of ten larger than twice the rounding error of a double near d (relative 1e-15 >
    2 * 2**-53; at least 1e-307, the normal range): a literal farther than this from d reads, as a
    double, on the same side of d (and of d's own double) as its exact value."""
    if d == 0:
        return Decimal(1).scaleb(_MIN_MARGIN_EXP)
    return Decimal(1).scaleb(max(d.adjusted() - 14, _MIN_MARGIN_EXP))


def float_safe_lower(lo: Decimal | None, strict: bool) -> tuple[Decimal | None, bool]:
    """A lower bound (inclusive) such that every literal x >= it satisfies `x >(=) lo` exactly, as a
    double, and against lo's double. An inclusive bound below 2**53 is kept (rounding is monotonic and
    lo's double reads back as lo); a strict one, or one beyond 2**53 (where integers stop being doubles),
    moves up by float_margin(lo)."""
    if lo is None:
        return None, False
    if not strict and abs(lo) < FLOAT_EXACT:
        return lo, False
    return _exact(lo, float_margin(lo)), False


def float_safe_upper(hi: Decimal | None, strict: bool) -> tuple[Decimal | None, bool]:
    """The mirror of float_safe_lower for an upper bound."""
    if hi is None:
        return None, False
    if not strict and abs(hi) < FLOAT_EXACT:
        return hi, False
    return _exact(hi, -float_margin(hi)), False


def float_neighbourhood(v) -> A.Node:
    """Every JSON number (no exponent) some reader may take for v: its exact spellings and every literal
    whose double (or exact value) could equal v's -- the open interval of float_margin(v) around v."""
    d = to_decimal(v)
    m = float_margin(d)
    return decimal_range(_exact(d, -m), True, _exact(d, m), True)


def _exact(a: Decimal, b: Decimal) -> Decimal:
    """a + b without rounding."""
    with localcontext() as ctx:
        ctx.prec = max(len(a.as_tuple().digits), 1) + abs(a.as_tuple().exponent) + abs(b.adjusted()) + 10
        return a + b


# ------------------------------------------------------------------------------------------ decimal multipleOf
def decimal_multiple_of(m: Decimal, negative: bool = True, exact: bool = False) -> tuple[A.Node, Decimal] | None:
    """multipleOf a non-integer decimal m = a / 10^k: the literals `-?INT(.D{1,k})?` whose scaled integer
    N = value * 10^k is a multiple of lcm(a, 5^k), and the magnitude bound X below which they are sound.

    Validators test `value / m` in doubles (python-jsonschema: `int(q) == q` on q = float(x) / float(m);
    ajv alike), which rounds: 0.07 / 0.01 is 7.000000000000001. A multiple of 5^k in N makes the value a
    dyadic fraction, exactly a double (up to X); the quotient is then n * (m / double(m)) with n = N / a an
    integer below 2^53, and |m / double(m) - 1| < 2^-54 makes it round to n itself: every such literal passes
    the float test, the exact decimal test and every double reading alike. (For 0.01: the multiples of 0.25;
    0.25, 0.5: all multiples; 0.3: the multiples of 1.5.) None when that margin does not hold or the
    remainder automaton would be large. negative=False: no negative literals.

    exact=True: every decimal multiple of m (N a multiple of a), of any magnitude (the bound returned is
    then 0 and means none), for validators that test in decimal arithmetic; the float test rejects some."""
    from fractions import Fraction
    from math import lcm

    sign, digits, exp = m.normalize().as_tuple()
    if sign or exp >= 0:
        return None
    k = -exp
    a = int("".join(map(str, digits)))
    fm = float(m)
    if not exact and abs(Fraction(m) / Fraction(fm) - 1) >= Fraction(1, 2 ** 54):
        return None
    mod = a if exact else lcm(a, 5 ** k)
    if mod * (k + 3) > 20000:
        return None
    if exact:
        int_digits, bound = 1, Decimal(0)  # one layer of integer-part nodes, looping
    else:
        n_max = min(5 ** k, a) * (2 ** 53 - 1)  # N / 5^k and N / a stay below 2^53
        # integer parts of at most `int_digits` digits: every literal is below 10^int_digits <= n_max / 10^k
        int_digits = len(str(n_max // 10 ** k)) - 1
        bound = Decimal(10) ** int_digits
    # nodes: 0 start, 1 after '-', 2 literal "0", 3 + r: integer part (>= 1 digit, no leading zero) with
    # N-remainder r of the integer part, 3 + mod + j * mod + R: after '.' and j + 1 fraction digits (j < k),
    # dot nodes: 3 + mod * (k + 1) + R (R = integer part * 10^k mod M)
    if int_digits < 1:
        return None
    # integer-part nodes are layered by digit count: I0 + (c - 1) * mod + r after c digits
    I0 = 3
    F0 = 3 + mod * int_digits
    D0 = F0 + mod * k
    n = D0 + mod + 1  # the last node: "-0", not an end (no "-0" spelling; "-0.25" is one)
    edges = [(0, A.lit("0"), 2), (n - 1, A.lit("."), D0)]
    if negative:
        edges += [(0, A.lit("-"), 1), (1, A.lit("0"), n - 1)]
    scale = pow(10, k, mod)

    def digit_edges(src, f):
        by: dict[int, list[int]] = {}
        for d in range(10):
            t = f(d)
            if t is not None:
                by.setdefault(t, []).append(d)
        for t, ds in by.items():
            edges.append((src, A.chars([(0x30 + d, 0x30 + d) for d in ds]), t))

    for src in ((0, 1) if negative else (0,)):
        digit_edges(src, lambda d: I0 + d % mod if d else None)
    for c in range(int_digits):
        for r in range(mod):
            src_node = I0 + c * mod + r
            if c + 1 < int_digits or exact:
                nxt = I0 + min(c + 1, int_digits - 1) * mod
                digit_edges(src_node, lambda d, r=r, nxt=nxt: nxt + (r * 10 + d) % mod)
            edges.append((src_node, A.lit("."), D0 + (r * scale) % mod))
    edges.append((2, A.lit("."), D0))
    for R in range(mod):
        digit_edges(D0 + R, lambda d, R=R: F0 + (R + d * pow(10, k - 1, mod)) % mod)
        for j in range(k - 1):
            digit_edges(F0 + j * mod + R, lambda d, R=R, j=j: F0 + (j + 1) * mod + (R + d * pow(10, k - j - 2, mod)) % mod)
    finals = [2] + [I0 + c * mod + r for c in range(int_digits) for r in range(mod) if (r * scale) % mod == 0] \
        + [F0 + j * mod for j in range(k)]
    return A.Graph(n, 0, tuple(finals), tuple(edges)), bound

