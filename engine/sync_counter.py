"""Counts what a region of engine code asks of the device: ops dispatched, kernels it would launch, host syncs.

`SyncCounter` is a `TorchDispatchMode`: every aten op the entering thread dispatches passes through it (mask
workers and other threads are not the step's device work). It counts every op by name, the ops that would launch
a kernel on a GPU, those inside the transformer layers, host syncs by kind and host-to-device uploads (`Counts`).
A host sync is a read on the host of a value the device computed: on CUDA it waits for every kernel queued before
it. `engine.host_sync.to_host` counts one sync per call, however many tensors it copies.

It is honest on the CPU, where every tensor is a CPU tensor: the model's parameters are the "device", and so is
every output of an op that read a device tensor (a taint set of storages, held weakly, so views and in-place writes
share their base's placement); tensors made from Python data or by host ops are the host's, and reading them is no
sync (`SyncCounter.is_device`). `Tensor.tolist`, `.numpy`, `.cpu` and `.to` do not always dispatch (`.to("cpu")` of
a CPU tensor returns it as it is), so while a counter is active they are wrapped on the class, counted for the
entering thread only, and restored on exit; counters do not nest.
"""
from __future__ import annotations

import re
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

from dllm_constrain.engine import host_sync

aten = torch.ops.aten

# ops whose output size depends on the values of a device input: the host waits for them to learn it
_VALUE_SIZED = {
    aten.nonzero.default, aten.where.default, aten.argwhere.default, aten.masked_select.default,
    aten._unique.default, aten._unique2.default,
    aten.unique_dim.default, aten.unique_consecutive.default, aten.bincount.default,
}
# a Python scalar of a device value (`item` and `is_nonzero` reach the mode undecomposed under inference mode)
_SCALAR_READS = {aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default}
_REPEAT_INTERLEAVE = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}
_MASK_INDEXED = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
# ops that launch nothing: allocation without a fill, aliasing, lifting Python data
_NO_LAUNCH = {
    aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default, aten.new_empty.default,
    aten.new_empty_strided.default, aten.detach.default, aten.alias.default, aten.lift_fresh.default,
    aten.lift_fresh_copy.default, aten.equal.default, *_SCALAR_READS,
}
# copies to another device or dtype: `_to_copy`, and the `to` overloads themselves, which reach the mode undecomposed
# under torch.inference_mode
_TO = {aten._to_copy.default, aten.to.dtype_layout, aten.to.device, aten.to.dtype, aten.to.other}
_TO_HOST_CODE: CodeType = host_sync.to_host.__code__
_CPU = torch.device("cpu")
_LAYER_NAME = re.compile(r"(?:^|\.)(?:blocks|layers|h)\.(\d+)\.")
_ORIGINAL = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy", "cpu", "to")}


@dataclass
class Counts:
    """What a counted region dispatched; `b - a` is what happened between two snapshots.

    ops        every aten op, by overload name (`aten.add.Tensor`)
    launches   ops with a device operand that would launch a kernel on a GPU: views, allocations without a fill,
               aliasing and host reads are not launches (eager CUDA launches about one kernel per such op; a fused
               op such as SDPA may launch two or three, a torch.compile'd region fewer)
    layer_ops  launches inside a transformer layer: an op reading a layer's parameter enters that layer, one reading
               a parameter outside every layer (embedding, final norm, LM head) leaves it
    syncs      host syncs by kind:
                 item      `aten._local_scalar_dense` (`.item()`, `bool(t)`, `int(t)`, `float(t)`)
                 equal     `torch.equal` (its answer is a Python bool)
                 nonzero   outputs sized by values: `nonzero` (`torch.where(cond)`), `masked_select`, `unique*`,
                           `bincount`, `repeat_interleave` without `output_size`, indexing / index_put by a bool mask
                 to_host   one per `engine.host_sync.to_host` call that copies a device tensor
                 copy      any other copy of a device tensor to the host (`.to("cpu")`, `.cpu()`, `host.copy_(d)`)
                 tolist, numpy   `.tolist()` / `.numpy()` (`np.asarray(t)`) of a device tensor
    uploads    copies from the host to a device tensor (a blocking one waits for the queue on CUDA); visible on a
               real device only: on the CPU `.to(device)` of a host tensor is a no-op
    """

    ops: Counter = field(default_factory=Counter)  # aten overload name -> calls
    launches: int = 0
    layer_ops: int = 0
    syncs: Counter = field(default_factory=Counter)  # kind -> host syncs
    uploads: int = 0

    @property
    def total_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def total_syncs(self) -> int:
        return sum(self.syncs.values())

    def copy(self) -> "Counts":
        return Counts(Counter(self.ops), self.launches, self.layer_ops, Counter(self.syncs), self.uploads)

    def __sub__(self, other: "Counts") -> "Counts":
        return Counts(self.ops - other.ops, self.launches - other.launches, self.layer_ops - other.layer_ops,
                      self.syncs - other.syncs, self.uploads - other.uploads)


def _storage_ref(t: torch.Tensor) -> StorageWeakRef | None:
    try:
        return StorageWeakRef(t.untyped_storage())
    except (RuntimeError, NotImplementedError):  # tensors without storage (sparse, nested, meta-like)
        return None


def layer_params(model: torch.nn.Module) -> dict[StorageWeakRef, int]:
    """Each transformer layer's parameter storages -> the layer's index (names like `...blocks.3.` or `layers.3.`)."""
    out: dict[StorageWeakRef, int] = {}
    for name, p in model.named_parameters():
        m = _LAYER_NAME.search(name)
        ref = _storage_ref(p)
        if ref is not None:
            out[ref] = int(m.group(1)) if m else -1  # -1: a parameter outside every layer
    return out


def _target_device(func: Any, args: tuple, kwargs: dict) -> Any:
    """The device a `_TO` op copies to (None: the source's own)."""
    if func is aten.to.device:
        return args[1] if len(args) > 1 else kwargs.get("device")
    if func is aten.to.other:
        return (args[1] if len(args) > 1 else kwargs["other"]).device
    return kwargs.get("device")


def _held(refs: dict[StorageWeakRef, StorageWeakRef], ref: StorageWeakRef) -> bool:
    held = refs.get(ref)
    return held is not None and not held.expired()


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


class SyncCounter(TorchDispatchMode):
    """Counts ops, launches and host syncs of the thread that enters it (see the module docstring).

    device_tensors: tensors that live on the simulated device when counting on the CPU (the model's parameters and
    buffers: `SyncCounter.for_model`). layers: parameter storage -> layer index (`layer_params`), for `layer_ops`.
    """

    def __init__(self, device_tensors: Iterable[torch.Tensor] = (),
                 layers: Mapping[StorageWeakRef, int] | None = None) -> None:
        super().__init__()
        self.counts = Counts()
        self._device: dict[StorageWeakRef, StorageWeakRef] = {}
        self._host: dict[StorageWeakRef, StorageWeakRef] = {}  # known host tensors (Python data, host copies)
        self._made: dict[StorageWeakRef, StorageWeakRef] = {}  # made in the region by ops without a device input
        self._to_names_host: bool | None = None  # inside a wrapped `.to` / `.cpu`: whether it named the host
        self._layers = dict(layers or {})
        self._layer: int | None = None
        self._to_host_frame: Any = None  # the to_host call that already counted its one sync
        self._thread: int | None = None
        self._reading = False  # inside a wrapped read (`.tolist()`, `.numpy()`), which counted itself
        self._added = 0
        for t in device_tensors:
            self.mark_device(t)

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> "SyncCounter":
        return cls(list(model.parameters()) + list(model.buffers()), layer_params(model))

    def snapshot(self) -> Counts:
        return self.counts.copy()

    # ------------------------------------------------------------------ placement
    def mark_device(self, t: torch.Tensor) -> None:
        """Count `t` (and every view of its storage) as a tensor on the device."""
        if t.device.type != "cpu":
            return
        ref = _storage_ref(t)
        if ref is not None:
            self._device[ref] = ref
            self._host.pop(ref, None)
            self._added += 1
            if self._added % 4096 == 0:
                self._device = {k: v for k, v in self._device.items() if not v.expired()}

    def mark_host(self, t: torch.Tensor) -> None:
        """Count `t` as a host tensor known to be one (made from Python data, or a copy read on the host)."""
        ref = _storage_ref(t)
        if ref is not None and t.device.type == "cpu":
            self._device.pop(ref, None)
            self._host[ref] = ref
            if len(self._host) % 4096 == 0:
                self._host = {k: v for k, v in self._host.items() if not v.expired()}

    def _is_host(self, t: torch.Tensor) -> bool:
        """A copy into the CPU tensor `t` is a read on the host unless `t` is a buffer an op without a device input
        made in the region (`torch.zeros(...)` may be the model's device on the CPU: the copy makes it a device
        buffer). Known host tensors (Python data, host copies) and tensors from before the region are the host's."""
        if t.device.type != "cpu":
            return False
        ref = _storage_ref(t)
        if ref is None:
            return False
        if _held(self._host, ref):
            return True
        return not _held(self._made, ref)

    def _note_made(self, outputs: list[torch.Tensor]) -> None:
        for t in outputs:
            ref = _storage_ref(t)
            if ref is not None and not _held(self._device, ref):
                self._made[ref] = ref
                if len(self._made) % 4096 == 0:
                    self._made = {k: v for k, v in self._made.items() if not v.expired()}

    def is_device(self, t: torch.Tensor) -> bool:
        """On a real device, every tensor not on the CPU. On the CPU, the taint set: the model's tensors and every
        output of an op that read a device tensor. A factory op on the model's device (`torch.zeros(...,
        device=model_device)`) cannot be told from a host one there, so a copy of a device tensor into a buffer made
        in the region makes it a device buffer (no sync), while a copy into a host tensor (Python data, a host copy,
        a tensor from before the region) is a read (`_is_host`). `.to(device)` is a read when it names the host
        ("cpu" as a string, or `engine.host_sync.HOST`), placement when it names the model's device."""
        if t.device.type != "cpu":
            return True
        ref = _storage_ref(t)
        return ref is not None and _held(self._device, ref)

    # ------------------------------------------------------------------ counting
    def _sync(self, kind: str) -> None:
        if not self._reading:  # a wrapped read already counted the copy it makes inside (CUDA `.tolist()`)
            self.counts.syncs[kind] += 1

    def _read(self, kind: str, fn: Any, t: torch.Tensor, *a: Any, **k: Any) -> Any:
        """A wrapped host read of the device tensor `t`: one sync, whatever it dispatches inside."""
        self._sync(kind)
        self._reading = True
        try:
            return fn(t, *a, **k)
        finally:
            self._reading = False

    def _host_copy(self) -> None:
        """A device tensor copied to the host: one sync per `to_host` call, one per copy elsewhere."""
        frame = sys._getframe(1)
        for _ in range(10):
            if frame is None:
                break
            if frame.f_code is _TO_HOST_CODE:
                if frame is not self._to_host_frame:
                    self._to_host_frame = frame
                    self._sync("to_host")
                return
            frame = frame.f_back
        self._sync("copy")

    def _host_twin(self, t: torch.Tensor) -> torch.Tensor:
        """A read of the device tensor `t` on the host that dispatched no copy (`.to("cpu")` of a CPU tensor returns
        it as it is): counted, and answered with an uncounted host copy, as a real device would give, so later reads
        of the result are not counted again while `t` stays a device tensor."""
        self._host_copy()
        with _disable_current_modes():
            twin = t.clone()
        self.mark_host(twin)
        return twin

    def _enter_layer(self, inputs: list[torch.Tensor]) -> None:
        for t in inputs:
            ref = _storage_ref(t) if t.device.type != "meta" else None
            layer = self._layers.get(ref) if ref is not None else None
            if layer is not None:
                self._layer = None if layer < 0 else layer
                return

    def _classify(self, func: Any, args: tuple, kwargs: dict, on_device: bool) -> str | None:
        """The sync kind of this op, None for an op the host does not wait for."""
        if not on_device:
            return None
        if func in _SCALAR_READS:
            return "item"
        if func is aten.equal.default:
            return "equal"
        if func in _VALUE_SIZED:
            return "nonzero"
        if func in _REPEAT_INTERLEAVE:
            return "nonzero" if kwargs.get("output_size") is None and len(args) < 4 else None
        if func in _MASK_INDEXED:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()):
                return "nonzero"
        return None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        counts = self.counts
        counts.ops[str(func)] += 1
        inputs = _tensors((args, kwargs))
        on_device = any(self.is_device(t) for t in inputs)
        if self._layers:
            self._enter_layer(inputs)
        out = func(*args, **kwargs)
        outputs = _tensors(out)
        if func in _TO and on_device and outputs and outputs[0] is not inputs[0] \
                and self._is_read(inputs[0], _target_device(func, args, kwargs)):
            self._host_copy()  # (a `.to` that returned its input copied nothing: the `.to` wrapper counts it)
            self.mark_host(outputs[0])
            return out
        if func is aten.copy_.default and self.is_device(inputs[1]) and not self.is_device(inputs[0]):
            dst, src = inputs[0], inputs[1]
            blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            if blocking and (self._is_host(dst) or src.device.type != "cpu"):
                self._host_copy()
                return out
        if (func in _TO or func is aten.copy_.default) and not on_device and outputs \
                and outputs[0].device.type != "cpu":
            counts.uploads += 1
        if func in (aten.lift_fresh.default, aten.lift_fresh_copy.default):
            self.mark_host(outputs[0])
        kind = self._classify(func, args, kwargs, on_device)
        if kind is not None:
            self._sync(kind)
        on_device = on_device or any(t.device.type != "cpu" for t in outputs)
        if not on_device and func not in (aten.lift_fresh.default, aten.lift_fresh_copy.default):
            self._note_made(outputs)
        if on_device:
            for t in outputs:
                self.mark_device(t)
            copied = func in _TO and outputs and outputs[0] is not inputs[0]  # `to` is a view when it copies nothing
            if kind is None and func not in _NO_LAUNCH and (copied or not func.is_view):
                counts.launches += 1
                if self._layer is not None:
                    counts.layer_ops += 1
        return out

    def _is_read(self, src: torch.Tensor, target: Any) -> bool:
        """Whether a copy of the device tensor `src` to `target` is a read on the host: on a real device, a copy to
        the CPU; on the CPU, a copy that named the host (`.to("cpu")`, `to_host`; see `_names_host`), not
        `.to(dtype)` or `.to(model_device)`."""
        if target is None or torch.device(target).type != "cpu":
            return False
        if src.device.type != "cpu":
            return True
        return self._to_names_host if self._to_names_host is not None else True

    # ------------------------------------------------------------------ reads that do not always dispatch
    def _wrapped(self) -> dict[str, Any]:
        counter = self
        thread = self._thread

        def counted(t: torch.Tensor) -> bool:
            return threading.get_ident() == thread and counter.is_device(t)

        def tolist(t: torch.Tensor, *a: Any, **k: Any) -> Any:
            if counted(t):
                return counter._read("tolist", _ORIGINAL["tolist"], t, *a, **k)
            return _ORIGINAL["tolist"](t, *a, **k)

        def numpy(t: torch.Tensor, *a: Any, **k: Any) -> Any:
            if counted(t):
                return counter._read("numpy", _ORIGINAL["numpy"], t, *a, **k)
            return _ORIGINAL["numpy"](t, *a, **k)

        def cpu(t: torch.Tensor, *a: Any, **k: Any) -> Any:
            if not counted(t):
                return _ORIGINAL["cpu"](t, *a, **k)
            counter._to_names_host = True
            try:
                out = _ORIGINAL["cpu"](t, *a, **k)
            finally:
                counter._to_names_host = None
            if out is t:  # no copy dispatched: the device tensor is read on the host as it is
                out = counter._host_twin(t)
            return out

        def to(t: torch.Tensor, *a: Any, **k: Any) -> Any:
            if not counted(t):
                return _ORIGINAL["to"](t, *a, **k)
            names = _names_host(a, k)
            counter._to_names_host = names
            try:
                out = _ORIGINAL["to"](t, *a, **k)
            finally:
                counter._to_names_host = None
            if out is t and names:
                out = counter._host_twin(t)
            return out

        return {"tolist": tolist, "numpy": numpy, "cpu": cpu, "to": to}

    def __enter__(self) -> "SyncCounter":
        if self._thread is not None or any(getattr(torch.Tensor, n) is not f for n, f in _ORIGINAL.items()):
            raise RuntimeError("a SyncCounter is already active (counters do not nest, nor run in two threads)")
        self._thread = threading.get_ident()
        for name, fn in self._wrapped().items():
            setattr(torch.Tensor, name, fn)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for name, fn in _ORIGINAL.items():
                setattr(torch.Tensor, name, fn)
            self._thread = None
            self._to_host_frame = None


def _names_host(args: tuple, kwargs: dict) -> bool:
    """Whether a `.to(...)` call names the host: the string "cpu" or `host_sync.HOST`. Engine code places tensors
    on the model's device with `.to(device)` (a torch.device, the CPU when the model is there: no read) and reads
    results with `.to("cpu")` or `to_host`."""
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, str):
        return torch.device(target).type == "cpu"
    return target is host_sync.HOST
