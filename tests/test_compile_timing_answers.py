"""A request's answer does not depend on when its constraint compiled (docs/engine.md, "The first forward"): compiled
before admission (its first masks after the forward: MASKS_AFTER, or beside it with mask workers), compiled while
its first forward runs (ready when the forward ends), or compiled only after that forward (PARKED, then unparked),
the same request and seed give the same answer, sampled (temperature > 0) or greedy. Each path is forced, with no
timing dependence: a compilation is held until the request's first forward has ended (parked), or the end of that
forward waits for it (ready). The bundled model, held-out requests of the training generator."""
from __future__ import annotations

import threading
from dataclasses import replace
from collections.abc import Iterator

import pytest

import dllm_constrain as dc
from dllm_constrain.constraints import clear_cache
from dllm_constrain.engine.state import PendingConstraint, Request, RequestPhase
from dllm_constrain.engine.structured_output import StructuredOutputManager
from dllm_constrain.train.data import ExampleGenerator

# requests whose sampled answers spread widely over seeds; the second one's also changes with its first step's draws
# alone (its first forward's noise keyed on another step changes its text)
EXAMPLES = [ExampleGenerator(11, plain_text_share=0.0, split="heldout").examples(16)[i] for i in (6, 15)]
PATHS = ("compiled before", "ready at the first forward's end", "parked")


@pytest.fixture(scope="module")
def llm() -> Iterator[dc.LLM]:
    llm = dc.LLM()
    yield llm
    llm.close()


def _request(llm: dc.LLM, example: dict, temperature: float) -> Request:
    """The request LLM.generate makes for a schema not compiled yet (its constraint a PendingConstraint); no time
    allowance (constraint_timeout=None): masks bounded by work only."""
    clear_cache()
    [request] = llm.processor.build([example["request"]], compile_beside=True, schema=example["schema"],
                                    temperature=temperature, seed=11, constraint_timeout=None).make_requests()
    assert isinstance(request.constraint, PendingConstraint)
    return request


def _answer(llm: dc.LLM, example: dict, path: str, workers: int, temperature: float,
            monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], int, list[tuple[RequestPhase, RequestPhase]]]:
    """The request's canvas and forwards along `path`, and the phases its first forward moved it between."""
    request = _request(llm, example, temperature)
    pending = request.constraint
    first_forward_ended = threading.Event()
    if path == "compiled before":
        request.constraint = pending.result()
    elif path == "parked":
        compile_now = pending._compile
        pending._compile = lambda: (first_forward_ended.wait(60), compile_now())[1]
    phases: list[tuple[RequestPhase, RequestPhase]] = []
    real = StructuredOutputManager.after_forward

    def after_forward(self, s, *args, **kwargs):
        if path == "ready at the first forward's end" and s.pending is not None:
            s.pending.constraint.future.result(60)
        before = s.phase
        going_on = real(self, s, *args, **kwargs)
        phases.append((before, s.phase))
        first_forward_ended.set()
        return going_on

    monkeypatch.setattr(StructuredOutputManager, "after_forward", after_forward)
    config = llm.engine.config.with_overrides(mask_workers=workers)
    (res,) = llm.engine.generate([request], config=config)
    monkeypatch.undo()
    assert res.error is None
    return res.canvas_ids, res.nfe, phases[:1]


@pytest.mark.parametrize("temperature", [0.7, 0.0], ids=["sampled", "greedy"])
@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("example", EXAMPLES, ids=["a", "b"])
def test_the_answer_is_the_one_with_the_constraint_compiled_before_whatever_the_compilations_end(
        llm: dc.LLM, example: dict, workers: int, temperature: float, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {path: _answer(llm, example, path, workers, temperature, monkeypatch) for path in PATHS}
    first_masks = RequestPhase.READY if workers else RequestPhase.MASKS_AFTER  # beside the forward, or after it
    assert answers["compiled before"][2] == [(first_masks, RequestPhase.READY)]
    assert answers["ready at the first forward's end"][2] == [(RequestPhase.COMPILING, RequestPhase.READY)]
    assert answers["parked"][2] == [(RequestPhase.COMPILING, RequestPhase.PARKED)]
    before_canvas, before_nfe, _ = answers["compiled before"]
    for path in PATHS[1:]:
        canvas, nfe, _ = answers[path]
        assert (canvas, nfe) == (before_canvas, before_nfe), path


def test_a_sampled_answer_follows_its_seed(llm: dc.LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail: another seed gives this request another sampled answer."""
    canvas, _, _ = _answer(llm, EXAMPLES[1], "compiled before", 0, 0.7, monkeypatch)
    request = _request(llm, EXAMPLES[1], 0.7)
    (other,) = llm.engine.generate([replace(request, params=replace(request.params, seed=12))])
    assert other.canvas_ids != canvas


def test_a_parked_request_beside_another_gets_its_first_masks_from_the_workers_and_the_compiled_before_answer(
        llm: dc.LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parked while another request keeps the loop's forwards going: once compiled, its first forward's masks are
    computed beside one of those forwards and its commits come a step later than alone; the sampled answer is the
    one it gets alone with its constraint compiled before."""
    example = EXAMPLES[1]
    alone, alone_nfe, _ = _answer(llm, example, "compiled before", 1, 0.7, monkeypatch)
    request = _request(llm, example, 0.7)
    parked = threading.Event()
    pending = request.constraint
    compile_now = pending._compile
    pending._compile = lambda: (parked.wait(60), compile_now())[1]
    parked_steps: list[int] = []
    real = StructuredOutputManager.after_forward

    def after_forward(self, s, *args, **kwargs):
        if s.index == 1 and s.nfe == 1:  # the other's second forward ends once the cold one has compiled
            pending.future.result(60)
        going_on = real(self, s, *args, **kwargs)
        if s.index == 0 and s.phase is RequestPhase.PARKED:
            parked_steps.append(s.nfe)
            parked.set()
        return going_on

    unparked_with_masks: list[bool] = []
    real_unpark = StructuredOutputManager.unpark

    def unpark(self, s, masks, timing):
        unparked_with_masks.append(masks is not None and not masks.compiling)
        return real_unpark(self, s, masks, timing)

    monkeypatch.setattr(StructuredOutputManager, "after_forward", after_forward)
    monkeypatch.setattr(StructuredOutputManager, "unpark", unpark)
    [other] = llm.processor.build(["Write a long story."], temperature=0.7, seed=3,
                                  max_new_tokens=96).make_requests()
    config = llm.engine.config.with_overrides(mask_workers=1)
    res, other_res = llm.engine.generate([request, other], config=config)
    monkeypatch.undo()
    assert parked_steps == [1] and other_res.nfe > 2
    assert unparked_with_masks == [True]  # its first forward's masks came from the workers
    assert (res.canvas_ids, res.nfe) == (alone, alone_nfe)
