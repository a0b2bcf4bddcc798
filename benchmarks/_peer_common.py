"""What every material of bench_peer_soundness.py shares: the per-item time limit, the tally of verdicts, the
compile-or-refuse step, and the string sources (mutations of a string, random members of our automaton).
"""
from __future__ import annotations

import os
import random
import signal
import sys
import traceback
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
sys.path.insert(0, ROOT)  # the package, when the runner is started from a checkout

MUTATION_CHARS = ["a", "b", "0", "9", " ", "\n", "-", "x", "é", "\\", ".", "{", "\"", "A", "_",
                  "\u0663", "\u00a0", "\u212a", "\t"]  # Arabic-Indic 3, no-break space, Kelvin sign: Unicode classes


class Timeout(Exception):
    pass


class time_limit:
    """SIGALRM-based limit for one item (main thread only)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __enter__(self):
        def handler(*_a):
            raise Timeout()

        self.old = signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.old)
        return False


class Tally:
    def __init__(self, name: str):
        self.name = name
        self.items = 0
        self.compiled = 0
        self.refused: Counter = Counter()
        self.crashes: list[str] = []
        self.cases = 0
        self.agree = 0
        self.unsound: list[dict] = []
        self.gaps: list[dict] = []
        self.notes: Counter = Counter()
        self.seconds = 0.0

    def judge(self, item: str, text, ours: bool, reader: bool, why: str = "", known: str = "") -> None:
        self.cases += 1
        if ours == reader:
            self.agree += 1
        elif ours:
            self.unsound.append({"item": item, "text": text, "why": why, "known": known})
        else:
            self.gaps.append({"item": item, "text": text, "why": why})


def compile_or_tally(T: Tally, label: str, build, seconds: float, note=None, suffix: str = ""):
    """build() under the time limit; a typed refusal (noted by `note(e)` when given), a timeout or an untyped
    exception (a crash, named by `label`) is tallied on T and gives None."""
    from dllm_constrain.errors import ConstraintError

    try:
        with time_limit(seconds):
            return build()
    except ConstraintError as e:
        T.refused[type(e).__name__ + suffix] += 1
        if note is not None:
            T.notes[note(e)] += 1
    except Timeout:
        T.refused["timeout" + suffix] += 1
    except Exception:  # noqa: BLE001
        T.crashes.append(f"{label}: {traceback.format_exc(limit=1).splitlines()[-1]}")
    return None


def str_mutations(s: str, rng: random.Random, k: int) -> list[str]:
    out = {"", s + s}
    if s:
        out |= {s[:-1], s[1:], s + s[-1]}
    for _ in range(k):
        c = rng.choice(MUTATION_CHARS)
        i = rng.randint(0, len(s))
        r = rng.random()
        if r < 0.35 or not s:
            out.add(s[:i] + c + s[i:])
        elif r < 0.7:
            i = min(i, len(s) - 1)
            out.add(s[:i] + c + s[i + 1:])
        else:
            i = min(i, len(s) - 1)
            out.add(s[:i] + s[i + 1:])
    out.discard(s)
    return sorted(out)


def dfa_samples(dfa, rng: random.Random, k: int, max_len: int = 40) -> list[bytes]:
    """Random members of a lazy byte DFA: a random walk over live bytes, stopping at accepting states with
    some probability, finished by a shortest path to acceptance."""
    from dllm_constrain.constraints.deriv import DEAD, START

    out = []
    for _ in range(k):
        s = START
        buf = bytearray()
        limit = rng.randint(0, max_len)
        while len(buf) < limit:
            if dfa.accepting[s] and rng.random() < 0.15:
                break
            dfa.expand(s)
            row = dfa.T[s]
            live = [b for b in range(256) if row[b] != DEAD]
            if not live:
                break
            pr = [b for b in live if 0x20 <= b < 0x7F]
            b = rng.choice(pr if pr and rng.random() < 0.8 else live)
            buf.append(b)
            s = int(row[b])
        guard = 0
        while not dfa.accepting[s] and guard < 100_000:
            dfa.expand(s)
            row = dfa.T[s]
            d = int(dfa.dist[s])
            nxt = [b for b in range(256) if row[b] != DEAD and int(dfa.dist[row[b]]) == d - 1]
            if not nxt:
                break
            b = rng.choice(nxt)
            buf.append(b)
            s = int(row[b])
            guard += 1
        if dfa.accepting[s]:
            out.append(bytes(buf))
    return out


def byte_info():
    from dllm_constrain.constraints import TokenizerInfo

    toks = [bytes([b]) for b in range(256)]
    return TokenizerInfo(toks + [None, None], eos_id=256, mask_id=257)
