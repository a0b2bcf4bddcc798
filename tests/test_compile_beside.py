"""A constraint compiled beside its request's first forward: the engine admits a request whose constraint is still
compiling (`PendingConstraint`), runs the first forward meanwhile (it reads the all-open canvas), and commits once the
constraint is there. The answer never depends on when the compilation ended."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from engine_fakes import EOS, MASK, DigitsConstraint, ScriptedModel

import dllm_constrain as dc
from dllm_constrain.constraints import clear_cache
from dllm_constrain.engine.config import EngineConfig
from dllm_constrain.engine.llm_engine import LLMEngine
from dllm_constrain.engine.state import PendingConstraint, Request, RequestPhase, SamplingParams
from dllm_constrain.engine.structured_output import StructuredOutputManager
from dllm_constrain.errors import InvalidSchemaError, UnsatisfiableSchemaError, UnsupportedSchemaError

SEVEN = 11
Z = 15  # an ordinary token that is not a digit
# position 0 is forced (one digit), the model wants EOS at 2: forced tokens before and after the first forward
SCRIPT = [{Z: 0.99}, {SEVEN: 0.9}, {EOS: 0.99}, {Z: 0.9}, {Z: 0.9}, {Z: 0.9}]
PARAMS = SamplingParams(max_new_tokens=6, block_length=3, steps=6)
LATE_S = 0.3


COMPILES = ThreadPoolExecutor(2, thread_name_prefix="test-compile")


class SignalsForward(ScriptedModel):
    """Sets `forwarded` at its first forward."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.forwarded = threading.Event()

    def hidden_states(self, *args, **kwargs):
        self.forwarded.set()
        return super().hidden_states(*args, **kwargs)


def _answer(when: str, workers: int):
    constraint = DigitsConstraint(digits=[SEVEN])
    model = SignalsForward(SCRIPT, prompt_len=1)

    def compile_during():  # ends as soon as the first forward has run
        assert model.forwarded.wait(10)
        return constraint

    def compile_after():  # long after the first forward: the request waits for it without another forward
        time.sleep(LATE_S)
        return constraint

    given = {"before": constraint, "during": PendingConstraint(COMPILES, compile_during),
             "after": PendingConstraint(COMPILES, compile_after)}[when]
    engine = LLMEngine(model, config=EngineConfig(mask_workers=workers))
    t0 = time.perf_counter()
    (res,) = engine.generate([Request([0], PARAMS, given)])
    return res, model.forwards, time.perf_counter() - t0, constraint


@pytest.mark.parametrize("workers", [0, 1])
def test_the_answer_does_not_depend_on_when_the_constraint_compiled(workers: int) -> None:
    before, forwards_before, _, constraint = _answer("before", workers)
    assert constraint.accepts(before.token_ids)
    for when in ("during", "after"):
        res, forwards, _, _ = _answer(when, workers)
        assert res.canvas_ids == before.canvas_ids, when
        assert (res.nfe, res.forced_tokens, forwards) == (before.nfe, before.forced_tokens, forwards_before), when


@pytest.mark.parametrize("workers", [0, 1])
def test_a_request_whose_constraint_outlasts_the_first_forward_waits_for_it_without_another_forward(
        workers: int) -> None:
    res, forwards, elapsed, constraint = _answer("after", workers)
    assert elapsed >= LATE_S
    assert constraint.accepts(res.token_ids)
    assert forwards == res.nfe


class RecordsInputs(ScriptedModel):
    """Keeps the input ids of every forward."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.inputs: list[list[int]] = []

    def hidden_states(self, input_ids, *args, **kwargs):
        self.inputs.append(input_ids.flatten().tolist())
        return super().hidden_states(input_ids, *args, **kwargs)


@pytest.mark.parametrize("workers", [0, 1])
def test_the_first_forward_reads_the_all_open_canvas_and_the_forced_tokens_come_after_it(workers: int) -> None:
    """Position 0 allows one digit: it is committed after the first forward (which reads the canvas all open, as it
    would with the constraint still compiling) and the second forward reads it."""
    model = RecordsInputs(SCRIPT, prompt_len=1)
    (res,) = LLMEngine(model, config=EngineConfig(mask_workers=workers)).generate(
        [Request([0], PARAMS, DigitsConstraint(digits=[SEVEN]))])
    assert SEVEN not in model.inputs[0] and MASK in model.inputs[0]
    assert SEVEN in model.inputs[1]
    assert res.canvas_ids[0] == SEVEN and res.forced_tokens >= 1


def test_progress_events_say_whether_the_constraint_has_compiled() -> None:
    """A server announces a request started (no more 400s) only once its constraint has compiled: the events of the
    steps while it compiles say so."""
    events = []
    engine = LLMEngine(ScriptedModel(SCRIPT, prompt_len=1))
    constraint = DigitsConstraint(digits=[SEVEN])

    def compile_after():
        time.sleep(LATE_S)
        return constraint

    engine.generate([Request([0], PARAMS, PendingConstraint(COMPILES, compile_after))],
                    progress=events.append)
    ready = [event.snapshots[0].constraint_ready for event in events]
    assert ready[0] is False and ready[-1] is True
    assert ready == sorted(ready)  # False while it compiles, True from then on


def test_a_deferred_compilation_starts_once_the_first_forward_has_started() -> None:
    model = SignalsForward(SCRIPT, prompt_len=1)
    started_after: list[int] = []
    constraint = DigitsConstraint(digits=[SEVEN])

    def compile():
        started_after.append(model.forwards)
        return constraint

    (res,) = LLMEngine(model).generate([Request([0], PARAMS, PendingConstraint(COMPILES, compile))])
    assert started_after == [1] and constraint.accepts(res.token_ids)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_compilation_refused_after_admission_ends_its_request_with_the_compilers_error_and_the_others_go_on(
        workers: int) -> None:
    def refuse():
        time.sleep(0.1)
        raise UnsatisfiableSchemaError("minimum 3 > maximum 1")

    ok = DigitsConstraint(digits=[SEVEN])
    engine = LLMEngine(ScriptedModel(SCRIPT, prompt_len=1), config=EngineConfig(mask_workers=workers))
    refused, done = engine.generate([Request([0], PARAMS, PendingConstraint(COMPILES, refuse)),
                                     Request([0], PARAMS, ok)], raise_errors=False)
    assert refused.finish_reason == "error" and isinstance(refused.error, UnsatisfiableSchemaError)
    assert done.error is None and ok.accepts(done.token_ids)


def test_a_compilation_refused_before_admission_is_raised_at_admission() -> None:
    def refuse():
        raise UnsupportedSchemaError("'$dynamicRef' is not supported")

    pending = PendingConstraint(COMPILES, refuse)
    pending.start()
    assert isinstance(pending.future.exception(10), UnsupportedSchemaError)
    engine = LLMEngine(ScriptedModel(SCRIPT, prompt_len=1))
    with pytest.raises(UnsupportedSchemaError):
        engine.generate([Request([0], PARAMS, pending)], raise_errors=False)


# ---------------------------------------------------------------------------------- through the API
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.fixture(scope="module")
def llm() -> dc.LLM:
    llm = dc.LLM()
    yield llm
    llm.close()


def test_a_schema_not_compiled_yet_compiles_beside_the_first_forward_and_gives_the_cached_schemas_answer(
        llm: dc.LLM) -> None:
    # no time allowances (constraint_timeout=None): the masks depend on the work done only, not on the clock
    options = dict(schema=SCHEMA, max_new_tokens=32, seed=0, constraint_timeout=None)
    clear_cache()
    [request] = llm.processor.build("Name Ada, age 36", compile_beside=True, **options).make_requests()
    assert isinstance(request.constraint, PendingConstraint)
    request.constraint.result()
    clear_cache()
    [cold] = llm.generate("Name Ada, age 36", **options)
    [request] = llm.processor.build("Name Ada, age 36", compile_beside=True, **options).make_requests()
    assert not isinstance(request.constraint, PendingConstraint)  # cached now: compiled at once
    [warm] = llm.generate("Name Ada, age 36", **options)
    assert cold.error is None and cold.token_ids == warm.token_ids


def test_input_the_compiler_refuses_at_once_is_refused_before_any_forward(llm: dc.LLM) -> None:
    with pytest.raises(InvalidSchemaError):
        llm.generate("x", schema="{not json")
    before = llm.engine.forward_stats.forwards
    clear_cache()
    contradictory = {"type": "integer", "minimum": 3, "maximum": 1}
    with pytest.raises(UnsatisfiableSchemaError):
        llm.generate("x", schema=contradictory, max_new_tokens=8)  # compiled beside the first forward: refused
    with pytest.raises(UnsatisfiableSchemaError):  # the refusal is cached: raised before any forward
        llm.processor.build("x", schema=contradictory, compile_beside=True).make_requests()
    assert llm.engine.forward_stats.forwards >= before


def test_a_request_parked_for_its_compilation_can_be_aborted_and_the_loop_goes_on() -> None:
    engine = LLMEngine(ScriptedModel(SCRIPT, prompt_len=1))
    constraint = DigitsConstraint(digits=[SEVEN])

    def compile_late():
        time.sleep(LATE_S)
        return constraint

    parked = engine.add_request(Request([0], PARAMS, PendingConstraint(COMPILES, compile_late)))
    engine.step()  # its first forward; the compilation goes on
    assert engine.request_state(parked).phase is RequestPhase.PARKED
    assert engine.abort(parked)
    other = engine.add_request(Request([0], PARAMS, DigitsConstraint(digits=[SEVEN])))
    outputs = {}
    for _ in range(100):
        for out in engine.step():
            outputs[out.request_id] = out.result
        if not engine.has_unfinished():
            break
    assert outputs[parked].finish_reason == "aborted"
    assert outputs[other].error is None and constraint.accepts(outputs[other].token_ids)


def test_a_server_request_is_announced_started_only_once_its_constraint_has_compiled() -> None:
    """Until then a compilation error must still be answered with a 400, so the stream must not have started."""
    from dllm_constrain.engine.outputs import CanvasSnapshot, StepEvent
    from dllm_constrain.serve.backend import EngineBackend, Started, _Job

    class Handle:
        def __init__(self) -> None:
            self.events: list = []

        def wanted(self) -> bool:
            return True

        def publish(self, event) -> None:
            self.events.append(event)

    backend = EngineBackend.__new__(EngineBackend)  # only its step hook is exercised here
    backend._closing = False
    job = _Job(handle=Handle(), text=None, admitted=True)  # the scheduler admitted it

    def event(ready: bool) -> StepEvent:
        return StepEvent(step=1, snapshots=[CanvasSnapshot(0, [MASK], [False], False, ready)], mask_id=MASK)

    backend._progress(job, event(False))
    assert job.handle.events == []
    backend._progress(job, event(True))
    assert [type(e) for e in job.handle.events] == [Started]


class CountsForwards(ScriptedModel):
    """Sets `third` once its third forward has started."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.third = threading.Event()

    def hidden_states(self, *args, **kwargs):
        out = super().hidden_states(*args, **kwargs)
        if self.forwards >= 3:
            self.third.set()
        return out


def test_beside_other_requests_a_request_that_waited_for_its_constraint_gets_its_first_masks_from_the_workers(
        monkeypatch) -> None:
    """Its constraint compiles past its first forward (it parks); once compiled, while another request keeps the
    loop's forwards going, the mask workers compute the masks of its first forward beside one of them, and the loop
    thread only commits. Its answer is the one it gets with its constraint compiled before."""
    constraint = DigitsConstraint(digits=[SEVEN])
    # the script's canvas goes on with Z, which the other request (its prompt 8 tokens long) commits, one per step
    model = CountsForwards(SCRIPT + [{Z: 0.9}] * 100, prompt_len=1)

    def compile_later():
        model.third.wait(10)
        return constraint

    after_forward: list[tuple[int, bool]] = []
    real = StructuredOutputManager._ready

    def spy(self, s, masks, timing):
        # whether the step's masks are computed after the forward (none came from the workers)
        after_forward.append((s.index, masks is None or masks.compiling))
        return real(self, s, masks, timing)

    monkeypatch.setattr(StructuredOutputManager, "_ready", spy)
    cold = Request([0], PARAMS, PendingConstraint(COMPILES, compile_later))
    # long enough that the compile thread, woken at the third forward, has run long before it ends
    other = Request([0] * 8, SamplingParams(max_new_tokens=96, block_length=96, steps=96), None)
    engine = LLMEngine(model, config=EngineConfig(mask_workers=1))
    res, other_res = engine.generate([cold, other])
    monkeypatch.undo()
    assert other_res.nfe > 3  # the other request's forwards went on past the compilation
    before, _, _, _ = _answer("before", 1)
    assert res.canvas_ids == before.canvas_ids
    assert (res.nfe, res.forced_tokens) == (before.nfe, before.forced_tokens)
    first = [masks_after for index, masks_after in after_forward if index == 0][0]
    assert first is False  # its first commits read the workers' masks, none computed after the forward
