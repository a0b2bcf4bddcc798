"""Device and dtype placement: LLM(device=, dtype=), the default device, typed errors for bad values, the CLI and
server flags, and each request's generator on the model's device. CPU only: CUDA is reached by monkeypatching
availability checks, never by creating CUDA tensors."""
from __future__ import annotations

import pytest
import torch

import dllm_constrain as dc
from dllm_constrain.engine import placement
from dllm_constrain.engine.loader import load_checkpoint, save_checkpoint
from dllm_constrain.engine.state import Request, SamplingParams
from dllm_constrain.errors import InvalidRequestError
from dllm_constrain.kernels.masked_row_stats import gumbel_noise, noise_dtype

SMALL = dict(max_new_tokens=8, block_length=4)


def _no_cuda(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# ------------------------------------------------------------------------------------------------ default device
@pytest.mark.default_placement
def test_the_default_device_is_cuda_when_available(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert placement.default_device() == torch.device("cuda")


@pytest.mark.default_placement
def test_the_default_device_is_the_cpu_without_cuda(monkeypatch) -> None:
    _no_cuda(monkeypatch)
    assert placement.default_device() == torch.device("cpu")
    assert placement.resolve_device(None) == torch.device("cpu")


# ------------------------------------------------------------------------------------------------ LLM(device, dtype)
@pytest.mark.parametrize("dtype, want", [("bfloat16", torch.bfloat16), ("bf16", torch.bfloat16),
                                         ("float32", torch.float32), (torch.float32, torch.float32),
                                         ("torch.bfloat16", torch.bfloat16)])
def test_llm_loads_with_the_requested_dtype_on_the_cpu_and_generates(tiny_checkpoint, dtype, want) -> None:
    llm = dc.LLM(tiny_checkpoint, device="cpu", dtype=dtype)
    assert llm.device == torch.device("cpu") and llm.dtype == want
    assert {p.dtype for p in llm.model.parameters() if p.is_floating_point()} == {want}
    [greedy] = llm.generate(["hello"], **SMALL)
    assert isinstance(greedy.text, str)
    a, b = (llm.generate(["hello"], temperature=1.0, seed=7, **SMALL)[0].token_ids for _ in range(2))
    assert a == b  # seeded sampling reproduces on the same device


def test_without_cuda_llm_defaults_to_the_cpu_and_the_stored_dtype(tiny_checkpoint, tmp_path, monkeypatch) -> None:
    _no_cuda(monkeypatch)
    llm = dc.LLM(tiny_checkpoint)
    assert llm.device == torch.device("cpu") and llm.dtype == torch.float32
    half = load_checkpoint(tiny_checkpoint, dtype=torch.bfloat16)
    save_checkpoint(half.model, half.tokenizer, tmp_path / "bf16")
    assert placement.stored_dtype(tmp_path / "bf16") == torch.bfloat16
    assert dc.LLM(tmp_path / "bf16").dtype == torch.bfloat16


def test_the_cpu_path_samples_exactly_as_before(tiny_checkpoint, tiny_llada, tiny_tokenizer) -> None:
    """Loading with device="cpu", dtype="float32" changes nothing: same seeded samples as the model built in place."""
    loaded = dc.LLM(tiny_checkpoint, device="cpu", dtype="float32")
    built = dc.LLM.from_model(tiny_llada, tiny_tokenizer)
    opts = dict(temperature=0.8, seed=3, **SMALL)
    assert loaded.generate(["hi"], **opts)[0].token_ids == built.generate(["hi"], **opts)[0].token_ids


def test_on_cuda_a_float32_checkpoint_loads_as_bfloat16_when_supported(tiny_checkpoint, monkeypatch) -> None:
    """The CUDA wiring without a GPU: the loader is asked for cuda and bfloat16 (and stopped before loading)."""
    import dllm_constrain.engine.loader as loader

    asked = {}

    class Stop(Exception):
        pass

    def fake_load(path, dtype=None, device=None):
        asked.update(dtype=dtype, device=device)
        raise Stop

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(loader, "load_checkpoint", fake_load)
    with pytest.raises(Stop):
        dc.LLM(tiny_checkpoint)
    assert asked == {"dtype": torch.bfloat16, "device": torch.device("cuda")}
    with pytest.raises(Stop):
        dc.LLM(tiny_checkpoint, device="cuda:0", dtype="float16")
    assert asked == {"dtype": torch.float16, "device": torch.device("cuda:0")}
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(Stop):
        dc.LLM(tiny_checkpoint, device="cuda")
    assert asked == {"dtype": torch.float32, "device": torch.device("cuda")}


def test_the_dtype_rule() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert placement.resolve_dtype(None, cpu, torch.float32) == torch.float32
    assert placement.resolve_dtype(None, cpu, None) is None  # the loader keeps what is stored
    assert placement.resolve_dtype("fp16", cpu, torch.float32) == torch.float16
    assert placement.resolve_dtype(None, cuda, torch.float16) == torch.float16  # only float32 is narrowed


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "tpu", "mps", 3, "", object()])
def test_a_bad_device_is_an_invalid_request_naming_device(tiny_checkpoint, device) -> None:
    with pytest.raises(InvalidRequestError, match="device"):
        dc.LLM(tiny_checkpoint, device=device)


def test_cuda_without_cuda_is_an_invalid_request(tiny_checkpoint, monkeypatch) -> None:
    _no_cuda(monkeypatch)
    with pytest.raises(InvalidRequestError, match="CUDA is not available"):
        dc.LLM(tiny_checkpoint, device="cuda:0")


@pytest.mark.parametrize("dtype", ["int8", "float64", "bfloat", "", 16, torch.int32])
def test_a_bad_dtype_is_an_invalid_request_naming_dtype(tiny_checkpoint, dtype) -> None:
    with pytest.raises(InvalidRequestError, match="dtype"):
        dc.LLM(tiny_checkpoint, device="cpu", dtype=dtype)


# ------------------------------------------------------------------------------------------------ noise and generators
def test_a_requests_generator_lives_on_the_models_device(tiny_checkpoint) -> None:
    llm = dc.LLM(tiny_checkpoint, device="cpu")
    state = llm.engine._new_state(0, Request(llm.encode("hi"), SamplingParams(max_new_tokens=4, block_length=4,
                                                                              temperature=1.0, seed=1)))
    assert state.generator is not None and state.generator.device == llm.device == torch.device("cpu")


def test_noise_is_float64_on_the_cpu_and_float32_on_other_devices() -> None:
    assert noise_dtype("cpu") == torch.float64
    assert noise_dtype(torch.device("cuda:0")) == torch.float32
    g = gumbel_noise((2, 5), torch.Generator().manual_seed(0), torch.device("cpu"))
    u = torch.rand((2, 5), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert g.dtype == torch.float64 and torch.equal(g, -torch.log(-torch.log(u)))


# ------------------------------------------------------------------------------------------------ CLI and server flags
def test_the_cli_takes_device_and_dtype(tiny_checkpoint, capsys) -> None:
    from dllm_constrain.cli import main

    assert main(["hi", "--model", str(tiny_checkpoint), "--device", "cpu", "--dtype", "bf16", "--no-progress",
                 "--max-new-tokens", "8", "--block-length", "4"]) == 0
    assert main(["hi", "--model", str(tiny_checkpoint), "--dtype", "int8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: dtype must be") and err.count("\n") == 1


def test_the_server_takes_device_and_dtype() -> None:
    from dllm_constrain.serve.__main__ import parse_args

    args = parse_args(["--device", "cpu", "--dtype", "bfloat16"])
    assert (args.device, args.dtype) == ("cpu", "bfloat16")
