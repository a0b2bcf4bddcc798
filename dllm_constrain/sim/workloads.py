"""Serving workloads for the simulator: arrival processes and prompt / canvas / answer length distributions.

The three shapes are named after dLLM-Serve's evaluation workloads (LiveBench, Burst, OSC; arXiv 2512.17077),
whose abstract states the workloads and GPUs but whose length and arrival distributions are not reproduced here:
the figures below are assumptions chosen to have their stated character (canvases of 256-1024 tokens, long-tailed
answers, bursty arrivals), not measurements of those traces.

  livebench  Poisson arrivals; prompts lognormal (median 250 tokens); canvases 256 / 512 / 1024; answers lognormal
             (median 120 tokens, sigma 0.9)
  burst      bursts of `burst_size` requests arriving together, the bursts a Poisson process; prompts median 150;
             canvases 256 / 512; answers median 100 (sigma 1.0)
  osc        gamma inter-arrival times with coefficient of variation 3 (clustered); prompts median 400; canvases
             512 / 1024; answers median 250 (sigma 1.1), the longest filling their canvas
  cpu-small  the real CPU run's: Poisson; prompts median 40; canvases 64 / 128 (the bundled model decides answers)

A share of the requests (`constrained_share`) is constrained by a JSON Schema; its planned answer is a
schema-valid JSON text of about the drawn length.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass

from dllm_constrain.errors import InvalidRequestError


@dataclass(frozen=True)
class LengthDist:
    """A lognormal length clipped to [low, high]."""

    median: float
    sigma: float
    low: int
    high: int

    def draw(self, rng: random.Random, high: int | None = None) -> int:
        top = self.high if high is None else min(self.high, high)
        return max(self.low, min(top, int(round(rng.lognormvariate(math.log(self.median), self.sigma)))))


@dataclass(frozen=True)
class WorkloadShape:
    name: str
    arrivals: str  # "poisson" | "burst" | "gamma"
    prompt: LengthDist
    canvases: tuple[tuple[int, float], ...]  # (canvas, weight)
    answer: LengthDist
    burst_size: int = 32
    gamma_cv: float = 3.0


WORKLOADS = {
    "livebench": WorkloadShape("livebench", "poisson", LengthDist(250, 0.8, 16, 2048),
                               ((256, 0.3), (512, 0.5), (1024, 0.2)), LengthDist(120, 0.9, 4, 1024)),
    "burst": WorkloadShape("burst", "burst", LengthDist(150, 0.7, 16, 1024), ((256, 0.5), (512, 0.5)),
                           LengthDist(100, 1.0, 4, 1024)),
    "osc": WorkloadShape("osc", "gamma", LengthDist(400, 1.0, 16, 2048), ((512, 0.3), (1024, 0.7)),
                         LengthDist(250, 1.1, 4, 1024)),
    # the real CPU run's workload (the bundled model decides its answers): short, for a shared 2-core machine
    "cpu-small": WorkloadShape("cpu-small", "poisson", LengthDist(40, 0.6, 8, 160), ((64, 0.5), (128, 0.5)),
                               LengthDist(30, 0.8, 4, 127)),
}


@dataclass(frozen=True)
class SimRequest:
    """One request of a workload: when it arrives, its prompt and canvas lengths, its planned answer length, and
    whether it is constrained."""

    arrival: float  # seconds from the start
    prompt_len: int
    canvas: int
    answer_len: int  # tokens before EOS (< canvas)
    constrained: bool
    seed: int


def _arrival_times(shape: WorkloadShape, n: int, rate: float, rng: random.Random) -> list[float]:
    """n arrival instants with mean rate `rate` requests/s (rate <= 0 or inf: all at 0)."""
    if not rate or math.isinf(rate) or rate <= 0:
        return [0.0] * n
    times: list[float] = []
    t = 0.0
    if shape.arrivals == "burst":
        while len(times) < n:
            times += [t] * min(shape.burst_size, n - len(times))
            t += rng.expovariate(rate / shape.burst_size)
        return times
    for _ in range(n):
        times.append(t)
        if shape.arrivals == "gamma":
            k = 1.0 / shape.gamma_cv ** 2
            t += rng.gammavariate(k, 1.0 / (k * rate))
        else:
            t += rng.expovariate(rate)
    return times


def make_workload(name: str, n: int, rate: float, seed: int = 0, constrained_share: float = 0.2
                  ) -> list[SimRequest]:
    """`n` requests of workload `name` at mean `rate` requests/s (0: all at once), deterministic for `seed`."""
    if name not in WORKLOADS:
        raise InvalidRequestError(f"workload must be one of {sorted(WORKLOADS)}, got {name!r}")
    shape = WORKLOADS[name]
    rng = random.Random(seed)
    times = _arrival_times(shape, n, rate, rng)
    canvases, weights = zip(*shape.canvases)
    out = []
    for i, t in enumerate(times):
        canvas = rng.choices(canvases, weights)[0]
        out.append(SimRequest(arrival=t, prompt_len=shape.prompt.draw(rng), canvas=canvas,
                              answer_len=shape.answer.draw(rng, canvas - 1),
                              constrained=rng.random() < constrained_share, seed=seed * 100_003 + i))
    return out


# the constrained requests' schema and the filler their planned answers are made of
SCHEMA = {"type": "object",
          "properties": {"id": {"type": "integer"}, "name": {"type": "string"}, "notes": {"type": "string"}},
          "required": ["id", "name", "notes"]}
FILLER = ("the quick brown fox jumps over the lazy dog while a patient reader counts every token of the answer "
          "and the scheduler decides which request runs next ")


def plain_answer(encode, length: int, seed: int) -> list[int]:
    """`length` ordinary tokens (the filler text, from a seeded offset)."""
    words = FILLER.split()
    start = seed % len(words)
    ids: list[int] = []
    while len(ids) < length:
        ids += encode(" " + " ".join(words[start:] + words[:start]))
    return ids[:length]


def json_answer(encode, length: int, seed: int) -> list[int]:
    """A SCHEMA-valid compact JSON text of at most `length` tokens (and as close to it as the filler allows)."""
    words = FILLER.split()

    def text(n_words: int) -> list[int]:
        notes = " ".join(words[(seed + j) % len(words)] for j in range(n_words))
        return encode(json.dumps({"id": seed % 1000, "name": "ada", "notes": notes}, separators=(",", ":")))

    lo, hi = 0, max(1, length)
    while lo < hi:  # the most filler words that fit
        mid = (lo + hi + 1) // 2
        if len(text(mid)) <= length:
            lo = mid
        else:
            hi = mid - 1
    return text(lo)
