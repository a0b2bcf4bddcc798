"""The step instrument: ops, launches and host syncs counted honestly on the CPU, where every tensor is a CPU tensor."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dllm_constrain.engine.host_sync import to_host
from dllm_constrain.engine.sync_counter import SyncCounter, layer_params


@pytest.fixture
def weight() -> torch.Tensor:
    return torch.randn(4, 4)


def counted(weight: torch.Tensor, fn) -> SyncCounter:
    """Run fn(device_value) under a counter; device_value is computed from the 'device' weight inside it."""
    counter = SyncCounter([weight])
    with counter:
        fn(weight @ torch.ones(4))
    return counter


READS = {
    "item": lambda d: d[0].item(),
    "bool": lambda d: bool(d[0] > 0),
    "int": lambda d: int(d[1]),
    "float": lambda d: float(d[2]),
    "tolist": lambda d: d.tolist(),
    "numpy": lambda d: d.numpy(),
    "asarray": lambda d: np.asarray(d),
    "nonzero": lambda d: (d > 0).nonzero(),
    "where": lambda d: torch.where(d > 0),
    "masked_select": lambda d: d.masked_select(d > 0),
    "bool_index": lambda d: d[d > 0],
    "bool_index_put": lambda d: d.clone().__setitem__(d > 0, 0.0),
    "unique": lambda d: d.unique(),
    "repeat_interleave": lambda d: torch.repeat_interleave(d.long().abs() % 3),
    "to_str_cpu": lambda d: d.to("cpu", torch.long),
    "to_str_cpu_same_dtype": lambda d: d.to("cpu"),
    "cpu": lambda d: d.cpu(),
    "to_host": lambda d: to_host(d),
    "equal": lambda d: torch.equal(d, d),
}
KIND = {"item": "item", "bool": "item", "int": "item", "float": "item", "tolist": "tolist", "numpy": "numpy",
        "asarray": "numpy", "to_str_cpu": "copy", "to_str_cpu_same_dtype": "copy", "cpu": "copy",
        "to_host": "to_host", "equal": "equal"}


@pytest.mark.parametrize("name", sorted(READS))
def test_each_read_of_a_device_result_is_one_sync_of_its_kind(weight, name) -> None:
    counter = counted(weight, READS[name])
    assert dict(counter.counts.syncs) == {KIND.get(name, "nonzero"): 1}


@pytest.mark.parametrize("name", sorted(READS))
def test_the_same_reads_of_host_tensors_are_not_syncs(name) -> None:
    counter = SyncCounter()
    with counter:
        READS[name](torch.tensor([1.0, -2.0, 3.0, 0.5]))  # made from Python data: a host tensor
    assert counter.counts.total_syncs == 0


def test_one_to_host_call_is_one_sync_however_many_tensors_it_copies(weight) -> None:
    counter = counted(weight, lambda d: to_host(d, d + 1, d.argmax()))
    assert dict(counter.counts.syncs) == {"to_host": 1}


def test_consecutive_to_host_calls_are_one_sync_each(weight) -> None:
    counter = counted(weight, lambda d: [to_host(d), to_host(d * 2)])
    assert dict(counter.counts.syncs) == {"to_host": 2}


def test_repeat_interleave_with_output_size_is_no_sync(weight) -> None:
    repeats = torch.tensor([1, 2, 1, 0])
    counter = counted(weight, lambda d: torch.repeat_interleave(d, repeats, output_size=4))
    assert counter.counts.total_syncs == 0


def test_copy_into_a_host_buffer_is_a_sync_and_into_a_device_buffer_is_not(weight) -> None:
    host = torch.tensor([0.0, 0.0, 0.0, 0.0])
    counter = counted(weight, lambda d: host.copy_(d))
    assert dict(counter.counts.syncs) == {"copy": 1}
    counter = counted(weight, lambda d: d.new_zeros(4).copy_(d * 2))
    assert counter.counts.total_syncs == 0


def test_placing_on_the_model_device_is_no_read(weight) -> None:
    """`.to(model_device)` and `.to(dtype)` keep a device tensor on the device (on the CPU both are the CPU)."""
    counter = counted(weight, lambda d: [d.to(weight.device), d.to(torch.float64), d.to(weight.device, torch.half)])
    assert counter.counts.total_syncs == 0


def test_host_copies_are_host_tensors_afterwards(weight) -> None:
    counter = counted(weight, lambda d: to_host(d)[0].tolist() + [to_host(d)[0][0].item()])
    assert dict(counter.counts.syncs) == {"to_host": 2}


def test_views_and_in_place_writes_share_their_base_placement(weight) -> None:
    def fn(d):
        buf = torch.zeros(4)  # a buffer the host made ...
        buf[1:3] = d[:2]  # ... written by a device op: a device buffer from here on
        buf.view(2, 2)[0].sum().item()

    assert dict(counted(weight, fn).counts.syncs) == {"item": 1}


def test_op_counts_are_exact_for_a_known_sequence(weight) -> None:
    counter = SyncCounter([weight])
    x = torch.ones(4)
    with counter:
        y = weight @ x  # aten.mv
        z = y.view(2, 2)  # a view: an op, not a launch
        w = torch.relu(z) + 1  # relu, add
    c = counter.counts
    assert dict(c.ops) == {"aten.mv.default": 1, "aten.view.default": 1, "aten.relu.default": 1,
                           "aten.add.Tensor": 1}
    assert (c.total_ops, c.launches, c.total_syncs) == (4, 3, 0)
    assert w.shape == (2, 2)


def test_host_only_work_launches_nothing() -> None:
    counter = SyncCounter()
    with counter:
        torch.arange(8).sum().item()
    assert counter.counts.total_ops > 0 and counter.counts.launches == 0 and counter.counts.total_syncs == 0


def test_snapshots_subtract_to_what_happened_between_them(weight) -> None:
    counter = SyncCounter([weight])
    with counter:
        (weight @ torch.ones(4)).sum().item()
        before = counter.snapshot()
        (weight * 2).tolist()
    delta = counter.snapshot() - before
    assert dict(delta.ops) == {"aten.mul.Tensor": 1} and dict(delta.syncs) == {"tolist": 1} and delta.launches == 1


def test_ops_inside_layers_are_attributed_to_them() -> None:
    model = torch.nn.ModuleDict({"blocks": torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)]),
                                 "head": torch.nn.Linear(4, 2)})
    counter = SyncCounter.for_model(model)
    with counter:
        h = torch.ones(1, 4)
        for block in model["blocks"]:
            h = torch.relu(block(h))  # addmm (+ a transposed view) and relu per layer
        model["head"](h).sum()
    assert layer_params(model) and counter.counts.layer_ops == 4
    assert counter.counts.launches == 4 + 2  # the head's addmm and the sum are outside every layer


def test_wrappers_are_restored_and_other_threads_are_not_counted(weight) -> None:
    import threading

    original = torch.Tensor.tolist
    counter = SyncCounter([weight])
    with counter:
        d = weight * 2
        worker = threading.Thread(target=d.tolist)
        worker.start()
        worker.join()
    assert torch.Tensor.tolist is original and counter.counts.total_syncs == 0


def test_a_host_copy_is_read_once_and_the_device_tensor_stays_on_the_device(weight) -> None:
    def fn(d):
        host = d.to("cpu")
        host.tolist(), host[0].item()  # reads of the copy: no more syncs
        (d * 2).sum()  # the original is still a device tensor: a launch

    counter = counted(weight, fn)
    assert dict(counter.counts.syncs) == {"copy": 1} and counter.counts.launches == 1 + 2


def test_counters_do_not_nest(weight) -> None:
    with SyncCounter([weight]):
        with pytest.raises(RuntimeError, match="already active"):
            SyncCounter().__enter__()


@pytest.mark.parametrize("name", sorted(READS))
def test_reads_count_the_same_under_inference_mode(weight, name) -> None:
    """Under torch.inference_mode the `to` overloads reach the counter undecomposed (the engine's step runs so)."""
    with torch.inference_mode():
        counter = counted(weight, READS[name])
    assert dict(counter.counts.syncs) == {KIND.get(name, "nonzero"): 1}


def test_to_host_results_are_host_tensors_under_inference_mode(weight) -> None:
    counter = SyncCounter([weight])
    with torch.inference_mode(), counter:
        d = weight @ torch.ones(4)
        host = to_host(d, d.argmax())
        host[0].tolist(), host[1].item(), d.to(torch.float64)
    assert dict(counter.counts.syncs) == {"to_host": 1} and not counter.is_device(host[0])
    assert counter.is_device(d)


def test_launches_count_the_same_under_inference_mode(weight) -> None:
    def run(counter):
        with counter:
            y = weight @ torch.ones(4)
            y.to(torch.float64), y.to(torch.float32), y.view(2, 2)  # a conversion launches; a no-op `to` or view not

    plain, inference = SyncCounter([weight]), SyncCounter([weight])
    run(plain)
    with torch.inference_mode():
        run(inference)
    assert plain.counts.launches == inference.counts.launches == 2
