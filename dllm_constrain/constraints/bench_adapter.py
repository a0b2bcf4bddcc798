"""Adapter so ../shared/tools/anchors_mask_bench.py can measure this constraint engine next to the
autoregressive anchors (llguidance, xgrammar, outlines-core, lm-format-enforcer):

    python ../shared/tools/anchors_mask_bench.py --engines dllm_constrain.constraints.bench_adapter:make \\
        --tokenizer ../shared/data/tokenizers/bpe128k --data ../shared/data/jsonschemabench --out /tmp/ours

The harness walks a valid instance left to right, asking for the full next-token mask before each token;
our `LeftToRightMatcher` answers with the same token automaton the canvas masks use (an unbounded canvas).
Compilation is not cached between schemas here (a fresh compiler cache per compile), so compile times are
cold times.
"""
from __future__ import annotations

import json
import os

import numpy as np

from .compiler import ConstraintCompiler, clear_cache
from .tokenizer_info import TokenizerInfo


class _Adapter:
    name = "dllm_constrain"

    def __init__(self, tokdir: str, threads: int):
        try:
            import torch

            torch.set_num_threads(max(1, int(threads)))
        except Exception:  # pragma: no cover
            pass
        self.info = TokenizerInfo.from_tokenizer(tokdir)
        self.info.prepare()  # the per-tokenizer tables, built once (setup, not compile)
        self.vocab_size = self.info.vocab_size
        self.eos_id = self.info.eos_id
        self.compiler = ConstraintCompiler(self.info, timeout_s=30.0)
        try:
            from importlib.metadata import version

            v = version("dllm-constrain")
        except Exception:  # pragma: no cover
            v = "?"
        self.version = f"{v} (derivative DFA + token trie, whitespace=compact)"

    def compile(self, schema_json: str):
        clear_cache()
        return self.compiler.compile_json_schema(json.loads(schema_json))

    def new_matcher(self, compiled):
        return MaskMatcher(compiled.matcher())


class MaskMatcher:
    """The harnesses' matcher protocol (fill_mask / is_allowed / advance) over one of our matchers."""

    __slots__ = ("m", "mask")

    def __init__(self, m):
        self.m = m
        self.mask: np.ndarray | None = None

    def fill_mask(self) -> None:
        self.mask = self.m.fill_mask()

    def is_allowed(self, tid: int) -> bool:
        return bool(self.mask[tid])

    def advance(self, tid: int) -> bool:
        return self.m.advance(tid)


def make(tokenizer_dir: str, threads: int = 1) -> _Adapter:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return _Adapter(tokenizer_dir, threads)
