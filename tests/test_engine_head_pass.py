"""One head pass per step: one `row_stats` call and at most two host reads whatever the batch, sampling noise that
follows the request's seed and not its batch mates, and a model fault that ends only the request it belongs to."""
from __future__ import annotations

import sys

import pytest
import torch
from engine_fakes import ScriptedModel

from dllm_constrain.engine import logits
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.logits import LogitsPath
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.errors import StepFailedError

POISON = 9  # an ordinary token; FailsOnPoison breaks on any forward whose input holds it
SCRIPT = [{4: 0.9}, {5: 0.8}, {6: 0.7}, {7: 0.9}, {8: 0.6}, {10: 0.9}, {1: 0.9}, {1: 0.9}]
PARAMS = SamplingParams(max_new_tokens=8, block_length=4, steps=8)


class FailsOnPoison(ScriptedModel):
    def hidden_states(self, input_ids, position_ids=None, key_padding_mask=None):
        if bool((input_ids == POISON).any()):
            raise RuntimeError("the model broke on these rows")
        return super().hidden_states(input_ids, position_ids, key_padding_mask)


class OutOfMemoryOnce(ScriptedModel):
    """Runs out of memory at the first forward of more than one request, never again."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.raised = False

    def hidden_states(self, input_ids, position_ids=None, key_padding_mask=None):
        if input_ids.shape[0] > 1 and not self.raised:
            self.raised = True
            raise torch.cuda.OutOfMemoryError("out of memory (a test double)")
        return super().hidden_states(input_ids, position_ids, key_padding_mask)


def _count_calls(monkeypatch) -> dict[str, int]:
    """Count LogitsPath.row_stats calls and the engine modules' to_host calls."""
    counts = {"row_stats": 0, "to_host": 0}
    real_row_stats = LogitsPath.row_stats

    def row_stats(self, *args, **kwargs):
        counts["row_stats"] += 1
        return real_row_stats(self, *args, **kwargs)

    monkeypatch.setattr(LogitsPath, "row_stats", row_stats)
    engine_modules = [m for name, m in sorted(sys.modules.items())
                      if name.startswith("dllm_constrain.engine.") and hasattr(m, "to_host")]
    assert logits in engine_modules
    for module in engine_modules:  # every engine module that reads the device (they import to_host by name)
        real = module.to_host

        def to_host(*tensors, _real=real):
            counts["to_host"] += 1
            return _real(*tensors)

        monkeypatch.setattr(module, "to_host", to_host)
    return counts


@pytest.mark.parametrize("batch", [1, 16])
def test_a_step_makes_one_head_pass_and_at_most_two_host_reads(tiny_llada, tiny_tokenizer, monkeypatch,
                                                                batch: int) -> None:
    counts = _count_calls(monkeypatch)
    engine = LLMEngine(tiny_llada, tiny_tokenizer)
    for i in range(batch):  # greedy and sampled requests side by side
        params = SamplingParams(max_new_tokens=16, block_length=8, temperature=1.0 if i % 2 else 0.0, seed=i)
        engine.add_request(Request(tiny_tokenizer.encode(f"prompt number {i}").ids, params))
    per_step = []
    while engine.has_unfinished():
        before = dict(counts)
        engine.step()
        per_step.append((counts["row_stats"] - before["row_stats"], counts["to_host"] - before["to_host"]))
    assert max(passes for passes, _ in per_step) == 1
    assert max(reads for _, reads in per_step) <= 2
    assert engine.forward_stats.request_rows >= batch * engine.forward_stats.forwards // 2  # steps served many


def test_a_sampled_answer_follows_its_seed_not_its_batch_mates(tiny_llada, tiny_tokenizer) -> None:
    ids = tiny_tokenizer.encode("the same request").ids
    params = SamplingParams(max_new_tokens=16, block_length=8, temperature=1.0, seed=7)
    (alone,) = LLMEngine(tiny_llada, tiny_tokenizer).generate([Request(ids, params)])
    mates = [Request(tiny_tokenizer.encode(f"another one {i}").ids,
                     SamplingParams(max_new_tokens=16, block_length=8, temperature=0.5 + i / 10, seed=100 + i))
             for i in range(5)]
    batched = LLMEngine(tiny_llada, tiny_tokenizer).generate(mates[:2] + [Request(ids, params)] + mates[2:])
    assert batched[2].canvas_ids == alone.canvas_ids


def test_a_forward_that_breaks_on_one_request_ends_only_that_request() -> None:
    (alone,) = LLMEngine(ScriptedModel(SCRIPT, prompt_len=1)).generate([Request([4], PARAMS)])
    got = LLMEngine(FailsOnPoison(SCRIPT, prompt_len=1)).generate(
        [Request([4], PARAMS), Request([POISON], PARAMS), Request([4], PARAMS)], raise_errors=False)
    assert got[1].finish_reason == "error" and isinstance(got[1].error, StepFailedError)
    assert got[0].canvas_ids == got[2].canvas_ids == alone.canvas_ids
    assert got[0].finish_reason == got[2].finish_reason == alone.finish_reason


def test_an_out_of_memory_halves_the_step_budget_and_every_request_goes_on() -> None:
    (alone,) = LLMEngine(ScriptedModel(SCRIPT, prompt_len=1)).generate([Request([4], PARAMS)])
    model = OutOfMemoryOnce(SCRIPT, prompt_len=1)
    engine = LLMEngine(model)
    ids = [engine.add_request(Request([4], PARAMS)) for _ in range(4)]
    budget = None
    done = {}
    while engine.has_unfinished():
        if budget is None:
            budget = engine._loop.scheduler.config.max_step_tokens
        done.update({out.request_id: out.result for out in engine.step()})
    assert model.raised
    assert engine._loop.scheduler.config.max_step_tokens == budget // 2
    assert all(done[i].canvas_ids == alone.canvas_ids and done[i].finish_reason == alone.finish_reason for i in ids)


def test_the_head_pass_gathers_each_requests_rows_from_the_steps_packed_output_by_its_start() -> None:
    """Rows given as (packed, start, offset) and rows standing alone are gathered to the same hidden states."""
    packed = torch.arange(40.0).reshape(10, 4)
    a = logits.HeadJob(None, packed[2:6], 1, [0, 2], torch.zeros(0), 0.0, 0, packed=packed, start=2)
    b = logits.HeadJob(None, packed[6:10], 0, [3], torch.zeros(0), 0.0, 0, packed=packed, start=6)
    kept = logits.HeadJob(None, torch.full((2, 4), -1.0), 0, [1], torch.zeros(0), 0.0, 0)
    rows = logits.gather_rows([a, kept, b])
    assert torch.equal(rows, torch.stack([packed[3], packed[5], torch.full((4,), -1.0), packed[9]]))
