"""The simulated model: the engine makes every decision, a decode-behaviour model stands in for the forward.

`SimEngine` is the real `LLMEngine` (scheduler, Refresh/Reuse planning in `ModelRunner.plan`, commit policies,
constraint masks and forced tokens, EOS exit) with one seam replaced: its runner's forward. `SimRunner` plans every
step as the real runner does (its KV pool holds slots without tensors, so the Refresh/Reuse decisions
are the real ones) and returns, for each open position of a request's active block, a hidden state that the
`SimModel`'s LM head turns into logits with a chosen top token and confidence:

  * the top token at canvas position p is the request's planned answer token (`RequestBehaviour.answer[p]`, a
    schema-valid JSON text for constrained requests), EOS from the answer's end on;
  * at each forward, the leftmost k open answer positions get confidence 0.95, where k is drawn (per request and
    forward number, so it does not depend on batch-mates) with mean `tokens_per_forward`; the other answer
    positions get 0.5 and EOS positions 0.99.

Under the threshold policy (threshold 0.9) a forward then commits k answer tokens (at least one) plus the block's
EOS tail; a constraint narrows the logits first, so constrained positions pass sooner and forced tokens need no
forward, as in the real engine. Every step's work is appended to `work_log`, which the harness prices on its
virtual clock; `RecordingRunner` does the same around a real model's forward (the CPU calibration).
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.model_runner import ModelRunner, Segment
from dllm_constrain.engine.models.base import SpecialTokens
from dllm_constrain.engine.state import RequestState
from dllm_constrain.sim.cost import ModelShape, SegmentWork

CONFIDENT = 0.95  # above Fast-dLLM's 0.9 threshold: committed at this forward
UNSURE = 0.5  # below it: stays open unless it is the best row (every forward commits at least one)
EOS_CONFIDENCE = 0.99  # trailing EOS: committed at the first forward that sees its block


@dataclass(frozen=True)
class RequestBehaviour:
    """A simulated request's decode behaviour: its answer's tokens and how many commit per forward."""

    answer: tuple[int, ...]
    seed: int
    tokens_per_forward: float

    def confident_tokens(self, forward: int) -> int:
        """k >= 1 for the request's `forward`-th forward: 1 + a geometric count with mean tokens_per_forward - 1."""
        rng = random.Random(self.seed * 1_000_003 + forward)
        stay = 1.0 - 1.0 / max(1.0, self.tokens_per_forward)
        k = 1
        while rng.random() < stay and k < 1024:
            k += 1
        return k


@dataclass
class SimConfig:
    """What the simulated model's config tells the scheduler (its KV size per token)."""

    n_layers: int
    kv_heads: int
    head_dim: int


class SimModel:
    """A DiffusionLM whose hidden states are (token, confidence) pairs made by `SimRunner`; its LM head turns
    them into logits over the tokenizer's vocabulary. `config` carries the simulated shape's KV size."""

    family = "sim"
    kv_query_shift = 0

    def __init__(self, special: SpecialTokens, vocab_size: int, shape: ModelShape,
                 max_sequence_length: int = 65536) -> None:
        self.special = special
        self.vocab_size = vocab_size
        self.max_sequence_length = max_sequence_length
        self.config = SimConfig(shape.layers, shape.kv_heads, shape.head_dim)
        self._dtype = torch.empty(0, dtype=torch.bfloat16 if shape.dtype_bytes == 2 else torch.float32)

    def parameters(self):
        yield self._dtype  # the simulated dtype (the scheduler's KV bytes per token read it)

    def hidden_states(self, input_ids: torch.Tensor, position_ids: Any = None, key_padding_mask: Any = None) -> Any:
        raise RuntimeError("SimModel has no forward: SimRunner makes its hidden states")

    hidden_states_cached = hidden_states  # the packed, cached forward families have (SimRunner replaces it)
    hidden_states_kv = hidden_states

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, 2] (token, confidence) -> [rows, vocab]: the token's logit set so that its softmax probability over
        the whole vocabulary is the confidence."""
        rows = hidden.shape[0]
        out = torch.zeros((rows, self.vocab_size), dtype=torch.float32)
        tokens = hidden[:, 0].long().clamp(0, self.vocab_size - 1)
        conf = hidden[:, 1].double().clamp(1e-6, 1 - 1e-6)
        logit = torch.log(conf * (self.vocab_size - 1) / (1 - conf)).float()
        out[torch.arange(rows), tokens] = logit
        return out


def segment_work(seg: Segment) -> SegmentWork:
    s = seg.state
    return SegmentWork(rows=seg.length, keys=len(s.prompt_ids) + s.canvas_len, refresh=seg.kind != "reuse",
                       logit_rows=len(s.open_in_block()))


class RecordingRunner(ModelRunner):
    """The real runner, each step's planned work appended to `work_log` (one list of SegmentWork per forward)."""

    def __init__(self, model: Any, pad_id: int, config: EngineConfig) -> None:
        super().__init__(model, pad_id, config)
        self.work_log: list[list[SegmentWork]] = []

    def plan(self, states: Sequence[RequestState]) -> list[Segment]:
        segments = super().plan(states)
        self.work_log.append([segment_work(seg) for seg in segments])
        return segments


class SimRunner(RecordingRunner):
    """The runner with the forward replaced by the decode-behaviour model (see the module docstring)."""

    def __init__(self, model: SimModel, pad_id: int, config: EngineConfig,
                 behaviours: dict[int, RequestBehaviour]) -> None:
        super().__init__(model, pad_id, config)
        self.behaviours = behaviours
        self.eos = model.special.eos_id

    def _packed_forward(self, segments: list[Segment]) -> torch.Tensor:
        total = sum(seg.length for seg in segments)
        hidden = torch.zeros((max(total, 1), 2), dtype=torch.float32)
        hidden[:, 1] = UNSURE
        for seg in segments:
            s = seg.state
            self._fill(hidden, seg, self.behaviours[s.index], s)
        return hidden[:total]

    def _fill(self, hidden: torch.Tensor, seg: Segment, plan: RequestBehaviour, s: RequestState) -> None:
        answer_len = len(plan.answer)
        k = plan.confident_tokens(s.nfe)
        base = seg.start + len(s.prompt_ids) - seg.first
        for p in s.open_in_block():
            row = base + p
            if p >= answer_len:
                hidden[row, 0], hidden[row, 1] = self.eos, EOS_CONFIDENCE
            else:
                hidden[row, 0] = plan.answer[p]
                hidden[row, 1] = CONFIDENT if k > 0 else UNSURE
                k -= 1


class SimEngine(LLMEngine):
    """The real engine driving a runner made by `runner_factory` (SimRunner or RecordingRunner)."""

    def __init__(self, model: Any, tokenizer: Any, runner_factory: Callable[[Any, int, EngineConfig], ModelRunner],
                 **kwargs: Any) -> None:
        self._runner_factory = runner_factory
        super().__init__(model, tokenizer, **kwargs)

    def _setup_call(self, config: EngineConfig) -> None:
        super()._setup_call(config)
        self.runner = self._runner_factory(self.model, self.special.pad_id, config)
        self.runner.on_reuse = self.reuse_hook

    @property
    def work_log(self) -> list[list[SegmentWork]]:
        return self.runner.work_log


def sim_engine(tokenizer: Any, shape: ModelShape, config: EngineConfig, behaviours: dict[int, RequestBehaviour],
               **kwargs: Any) -> SimEngine:
    """A SimEngine over the tokenizer's vocabulary and special ids, simulating `shape`."""
    special = SpecialTokens(mask_id=tokenizer.mask_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
                            bos_id=tokenizer.bos_id)
    model = SimModel(special, tokenizer.vocab_size, shape)
    return SimEngine(model, tokenizer, lambda m, pad, cfg: SimRunner(m, pad, cfg, behaviours), config=config,
                     **kwargs)


def real_engine(model: Any, tokenizer: Any, config: EngineConfig, **kwargs: Any) -> SimEngine:
    """The real model's forwards (they decide the tokens), each step's work recorded."""
    return SimEngine(model, tokenizer, RecordingRunner, config=config, **kwargs)

