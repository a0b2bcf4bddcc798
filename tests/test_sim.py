"""The serving simulator: the real engine decides, a cost model prices each step on a virtual clock.

Specifications:
  * a simulation is deterministic for a seed (same per-request times, same figures), whatever the policy;
  * the simulated requests end by the engine's EOS exit with their planned answers (constrained ones schema-valid);
  * the phase policy's steps hold its token budget in the simulation too, and the KV peak never passes its budget;
  * the cost model counts what it says (KV bytes from the shape, Reuse cheaper than Refresh, launches per request);
  * the CPU fit recovers known non-negative coefficients;
  * workloads are deterministic for a seed and have the stated shapes.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from dllm_constrain.sim.__main__ import bundled_factory
from dllm_constrain.sim.calibrate import fit_nonnegative
from dllm_constrain.sim.cost import HARDWARE, SHAPES, RooflineCost, SegmentWork, step_features
from dllm_constrain.sim.harness import ServingSetup, simulate
from dllm_constrain.sim.workloads import make_workload

SHAPE, COST = SHAPES["llada-8b"], RooflineCost(HARDWARE["h200"])


@pytest.fixture(scope="module")
def factory():
    return bundled_factory(constrained=True)


def _run(factory, policy: str, seed: int = 3, step_tokens: int = 4096):
    workload = make_workload("burst", 14, 40.0, seed=seed, constrained_share=0.3)
    setup = ServingSetup(max_num_seqs=8, kv_budget_bytes=int(4e9), step_tokens=step_tokens)
    return simulate(workload, policy, setup, factory, SHAPE, COST)


@pytest.mark.parametrize("policy", ["phase", "static"])
def test_a_simulation_is_deterministic_for_a_seed(factory, policy) -> None:
    a, b = _run(factory, policy), _run(factory, policy)
    assert json.dumps(a.summary()) == json.dumps(b.summary())
    assert [(r.arrival, r.first_forward, r.finish, r.tokens) for r in a.records] == \
           [(r.arrival, r.first_forward, r.finish, r.tokens) for r in b.records]


def test_simulated_requests_end_with_their_planned_answers_under_every_budget(factory) -> None:
    result = _run(factory, "phase", step_tokens=1200)
    workload = make_workload("burst", 14, 40.0, seed=3, constrained_share=0.3)
    assert all(r.finish_reason == "eos" for r in result.records)
    planned = [len(factory.behaviour(req, 2.5).answer) for req in workload]
    assert sorted(r.tokens for r in result.records) == sorted(planned)
    assert result.peak_step_tokens <= 1200
    assert result.peak_kv_bytes <= 4e9


def test_constrained_planned_answers_are_schema_valid_json(factory) -> None:
    from dllm_constrain.sim.workloads import SCHEMA

    import jsonschema

    workload = make_workload("osc", 40, 1.0, seed=5, constrained_share=1.0)
    for req in workload[:10]:
        ids = factory.behaviour(req, 2.5).answer
        jsonschema.validate(json.loads(factory.tokenizer.decode(list(ids))), SCHEMA)


def test_the_cost_model_counts_kv_phases_and_launches() -> None:
    assert SHAPE.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2
    assert SHAPES["dream-7b"].kv_bytes_per_token == 2 * 28 * 4 * 128 * 2
    refresh = step_features(SHAPE, [SegmentWork(rows=1024, keys=1024, refresh=True, logit_rows=32)])
    reuse = step_features(SHAPE, [SegmentWork(rows=32, keys=1024, refresh=False, logit_rows=32)])
    assert COST.step_time(reuse).seconds < COST.step_time(refresh).seconds
    assert refresh.flops / (989e12 * 0.7) > refresh.bytes / (4.8e12 * 0.85)  # a Refresh is compute bound
    assert reuse.flops / (989e12 * 0.7) < reuse.bytes / (4.8e12 * 0.85)  # a Reuse is bandwidth bound
    two = step_features(SHAPE, [SegmentWork(32, 1024, False, 32)] * 2)
    assert two.launches - reuse.launches == 32 * 4 + 8
    assert two.head_bytes == 2 * reuse.head_bytes  # the LM head is read once per request per step


def test_the_cpu_fit_recovers_known_nonnegative_coefficients() -> None:
    rng = np.random.default_rng(0)
    x = np.column_stack([np.ones(200), rng.uniform(1e9, 1e11, 200), rng.uniform(1, 64, 200)])
    truth = np.array([2e-3, 3e-11, 4e-4])
    coef = fit_nonnegative(x, x @ truth)
    assert np.allclose(coef, truth, rtol=1e-6)
    coef = fit_nonnegative(x, x @ np.array([2e-3, 3e-11, 0.0]) - 1e-6 * x[:, 2])
    assert (coef >= 0).all()


def test_workloads_are_deterministic_and_shaped() -> None:
    a = make_workload("osc", 300, 5.0, seed=1)
    assert a == make_workload("osc", 300, 5.0, seed=1) and a != make_workload("osc", 300, 5.0, seed=2)
    assert all(512 <= r.canvas <= 1024 and 4 <= r.answer_len < r.canvas for r in a)
    burst = make_workload("burst", 96, 10.0, seed=1)
    assert len({r.arrival for r in burst}) == 3  # bursts of 32 arrive together
    assert all(r.arrival == 0.0 for r in make_workload("livebench", 20, 0.0))
