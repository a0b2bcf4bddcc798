"""Checkpoint folder -> (model, tokenizer): family detection, safetensors (single file or sharded), checks.

A checkpoint folder holds config.json, tokenizer.json and model.safetensors, or shards listed in
model.safetensors.index.json. LLaDA and Dream are built by our own modules and every tensor is checked by
name and shape before anything is loaded (one CheckpointError lists every missing, unexpected and mismatched
tensor). DiffusionGemma is loaded by transformers (local files only, never remote code) and its load report is
turned into the same kind of error. `save_checkpoint` writes the same layout (used by tests and training).
"""
from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from dllm_constrain.engine.models.base import SpecialTokens
from dllm_constrain.engine.models.dream import DreamConfig, DreamModel
from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel
from dllm_constrain.engine.tokenizer import Tokenizer
from dllm_constrain.errors import CheckpointError, UnsupportedModelError

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"

FAMILIES = ("llada", "dream", "diffusion_gemma")
_BY_MODEL_TYPE = {"llada": "llada", "dream": "dream", "diffusion_gemma": "diffusion_gemma"}
_BY_ARCHITECTURE = {"LLaDAModelLM": "llada", "DreamModel": "dream",
                    "DiffusionGemmaForBlockDiffusion": "diffusion_gemma"}
_NATIVE: dict[str, tuple[type, type]] = {"llada": (LLaDAConfig, LLaDAModel), "dream": (DreamConfig, DreamModel)}
_MAX_LISTED = 20


@dataclass
class LoadedModel:
    """What the engine needs from a checkpoint folder."""

    model: nn.Module
    tokenizer: Tokenizer
    family: str
    path: Path


def read_config(folder: str | Path) -> dict[str, Any]:
    """config.json as a dict; CheckpointError naming the file when it is absent or not a JSON object."""
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise CheckpointError(f"{CONFIG} not found in {Path(folder)}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{CONFIG} in {Path(folder)} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{CONFIG} in {Path(folder)} is not a JSON object")
    return raw


def detect_family(config: Mapping[str, Any]) -> str:
    """The family from model_type (case-insensitive, exact), else from architectures; else UnsupportedModelError."""
    model_type = str(config.get("model_type", "")).lower()
    if model_type in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[model_type]
    for arch in config.get("architectures") or []:
        if arch in _BY_ARCHITECTURE:
            return _BY_ARCHITECTURE[arch]
    raise UnsupportedModelError(
        f"unsupported model family: model_type={config.get('model_type')!r}, "
        f"architectures={config.get('architectures')!r} (supported: {', '.join(FAMILIES)})")


def weight_files(folder: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint: the shards of the index if present, else model.safetensors."""
    folder = Path(folder)
    index = folder / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{INDEX} in {folder} has no readable weight_map: {exc}") from exc
        shards = sorted(set(weight_map.values()))
        absent = [s for s in shards if not (folder / s).is_file()]
        if absent:
            raise CheckpointError(f"shard(s) listed in {INDEX} not found in {folder}: {', '.join(absent)}")
        return [folder / s for s in shards]
    if (folder / WEIGHTS).is_file():
        return [folder / WEIGHTS]
    others = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
    hint = f" (found {', '.join(others)}: only safetensors is supported)" if others else ""
    raise CheckpointError(f"{WEIGHTS} (or {INDEX}) not found in {folder}{hint}")


def _stored_shapes(files: list[Path]) -> dict[str, tuple[tuple[int, ...], Path, str]]:
    """name -> (shape, file, dtype string) read from the safetensors headers only (no tensor data)."""
    out: dict[str, tuple[tuple[int, ...], Path, str]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    sl = f.get_slice(name)
                    out[name] = (tuple(sl.get_shape()), path, sl.get_dtype())
        except Exception as exc:  # safetensors raises its own SafetensorError for corrupt headers
            raise CheckpointError(f"{path.name} is not a readable safetensors file: {exc}") from exc
    return out


def _expected_tensors(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Parameter/buffer names the file must hold: a tied LM head is stored once (as the embedding)."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        expected.pop("lm_head.weight", None)
    return expected


def check_tensors(expected: Mapping[str, tuple[int, ...]],
                  stored: Mapping[str, tuple[tuple[int, ...], Path, str]], where: str) -> None:
    """One CheckpointError listing every missing, unexpected and wrong-shape tensor (or nothing)."""
    def listed(names: list[str]) -> str:
        more = f", ... ({len(names) - _MAX_LISTED} more)" if len(names) > _MAX_LISTED else ""
        return ", ".join(names[:_MAX_LISTED]) + more

    missing = sorted(set(expected) - set(stored))
    unexpected = sorted(set(stored) - set(expected))
    mismatched = sorted(n for n in set(expected) & set(stored) if tuple(expected[n]) != stored[n][0])
    problems = []
    if missing:
        problems.append(f"missing tensors: {listed(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {listed(unexpected)}")
    if mismatched:
        problems.append("mismatched shapes: " + listed(
            [f"{n} (file {stored[n][0]}, expected {tuple(expected[n])})" for n in mismatched]))
    if problems:
        raise CheckpointError(f"{where}: " + "; ".join(problems))


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _load_native(family: str, folder: Path, config: dict[str, Any], dtype: torch.dtype | None,
                 device: torch.device | str) -> nn.Module:
    """Build LLaDA/Dream on the meta device, check every tensor, then assign the stored tensors."""
    config_cls, model_cls = _NATIVE[family]
    cfg = config_cls.from_dict(config)
    with torch.device("meta"):
        model = model_cls(cfg)
    files = weight_files(folder)
    stored = _stored_shapes(files)
    check_tensors(_expected_tensors(model), stored, f"{family} checkpoint {folder}")
    if dtype is None:  # the checkpoint's own floating dtype (the most common one, if mixed)
        counts = Counter(stored[n][2] for n in stored if stored[n][2] in _DTYPES)
        dtype = _DTYPES[counts.most_common(1)[0][0]] if counts else torch.float32
    state: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                state[name] = t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
    if getattr(cfg, "tie_word_embeddings", False):
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model.eval()


def _check_special(model: nn.Module, tokenizer: Tokenizer, folder: Path) -> None:
    """The model's special ids must be real ids of its vocabulary and tell EOS from the mask."""
    sp: SpecialTokens = model.special
    for role in ("mask_id", "eos_id", "pad_id"):
        value = getattr(sp, role)
        if not 0 <= value < model.vocab_size:
            raise CheckpointError(f"{folder}: {role}={value} is outside the model vocabulary ({model.vocab_size})")
    if sp.mask_id == sp.eos_id:
        raise CheckpointError(f"{folder}: mask_id and eos_id are both {sp.mask_id}")
    if tokenizer.vocab_size > model.vocab_size:
        raise CheckpointError(f"{folder}: {TOKENIZER} has {tokenizer.vocab_size} tokens but the model's "
                              f"vocabulary has only {model.vocab_size}")


def load_checkpoint(path: str | Path, dtype: torch.dtype | None = None,
                    device: torch.device | str | None = None) -> LoadedModel:
    """Load a checkpoint folder. dtype=None keeps the stored floating dtype; device=None means CPU."""
    folder = Path(path)
    if not folder.is_dir():
        if folder.exists():
            hint = (f"; pass the folder that holds it ({folder.parent})"
                    if folder.name in (CONFIG, TOKENIZER, WEIGHTS, INDEX, "generation_config.json") else "")
            raise CheckpointError(f"{folder} is a file, not a checkpoint folder (a folder holding {CONFIG}, "
                                  f"{WEIGHTS} and {TOKENIZER}){hint}")
        raise CheckpointError(f"checkpoint folder not found: {folder}")
    config = read_config(folder)
    family = detect_family(config)
    if not (folder / TOKENIZER).is_file():
        raise CheckpointError(f"{TOKENIZER} not found in {folder}")
    tokenizer = Tokenizer(folder)
    device = device if device is not None else "cpu"
    if family in _NATIVE:
        model = _load_native(family, folder, config, dtype, device)
    else:
        weight_files(folder)  # a clear error naming the weights file before transformers runs
        model = _load_diffusion_gemma(folder, config, tokenizer, dtype, device)
    _check_special(model, tokenizer, folder)
    return LoadedModel(model=model, tokenizer=tokenizer, family=family, path=folder)


def _load_diffusion_gemma(folder: Path, config: dict[str, Any], tokenizer: Tokenizer,
                          dtype: torch.dtype | None, device: torch.device | str) -> nn.Module:
    from dllm_constrain.engine.models.diffusion_gemma import DiffusionGemmaAdapter

    if tokenizer.eos_id is None:
        raise CheckpointError(f"{folder}: no eos token id in {CONFIG} or the tokenizer files")
    if tokenizer.mask_id is None or tokenizer.mask_id == tokenizer.eos_id:
        raise CheckpointError(f"{folder}: the tokenizer has no mask token to mark open canvas positions "
                              f"(looked for mask_token_id in {CONFIG}, mask_token in tokenizer_config.json / "
                              f"special_tokens_map.json, and well-known names)")
    text = config.get("text_config") or {}
    eos = text.get("eos_token_id", config.get("eos_token_id"))
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else (tokenizer.eos_id,))
    special = SpecialTokens(mask_id=tokenizer.mask_id, eos_id=tokenizer.eos_id,
                            pad_id=tokenizer.pad_id if tokenizer.pad_id is not None else tokenizer.eos_id,
                            bos_id=tokenizer.bos_id)
    return DiffusionGemmaAdapter.from_pretrained(folder, special, eos_ids=eos_ids, dtype=dtype, device=device)


def save_checkpoint(
    model: nn.Module,
    tokenizer: str | Path | Tokenizer | Any,
    folder: str | Path,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write config.json + model.safetensors (or shards + index when max_shard_bytes is set) + tokenizer.json.

    tokenizer: a tokenizer.json path, our Tokenizer, or a `tokenizers.Tokenizer`. LLaDA and Dream are written
    in their released layouts (a tied LM head is stored once); DiffusionGemma goes through save_pretrained.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    family = getattr(model, "family", None)
    if family == "diffusion_gemma":
        model.hf.save_pretrained(str(folder))
    elif family in _NATIVE:
        (folder / CONFIG).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n", encoding="utf-8")
        state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        if getattr(model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        _write_weights(state, folder, max_shard_bytes)
    else:
        raise UnsupportedModelError(f"save_checkpoint: unsupported model family {family!r}")
    if isinstance(tokenizer, (str, Path)):
        if Path(tokenizer).resolve() != (folder / TOKENIZER).resolve():
            shutil.copyfile(tokenizer, folder / TOKENIZER)
    else:
        tokenizer.save(str(folder / TOKENIZER))
    return folder


def _write_weights(state: dict[str, torch.Tensor], folder: Path, max_shard_bytes: int | None) -> None:
    for stale in [folder / WEIGHTS, folder / INDEX, *folder.glob("model-*-of-*.safetensors")]:
        stale.unlink(missing_ok=True)
    if max_shard_bytes is None:
        save_file(state, str(folder / WEIGHTS), metadata={"format": "pt"})
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                           indent=2) + "\n", encoding="utf-8")
