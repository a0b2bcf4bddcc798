"""engine/loader.py: family detection, (sharded) safetensors, and a CheckpointError naming each bad file/tensor."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoints import build_diffusion_gemma, build_dream, build_llada
from dllm_constrain.engine.loader import detect_family, load_checkpoint
from dllm_constrain.errors import CheckpointError, UnsupportedModelError

IDS = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])


def rewrite_tensors(file: Path, edit) -> None:
    """Load a safetensors file, let edit() change the dict, write it back."""
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file), metadata={"format": "pt"})


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_diffusion_gemma(tmp_path_factory.mktemp("dg") / "ckpt")


@pytest.mark.parametrize("config, family", [
    ({"model_type": "llada"}, "llada"),
    ({"model_type": "Dream"}, "dream"),
    ({"model_type": "diffusion_gemma"}, "diffusion_gemma"),
    ({"architectures": ["LLaDAModelLM"]}, "llada"),
    ({"architectures": ["DreamModel"]}, "dream"),
    ({"architectures": ["DiffusionGemmaForBlockDiffusion"]}, "diffusion_gemma"),
])
def test_family_is_detected_from_model_type_or_architectures(config: dict, family: str) -> None:
    assert detect_family(config) == family


def test_unknown_family_is_unsupported_and_named(tmp_path: Path) -> None:
    build_llada(tmp_path)
    edit_config(tmp_path, model_type="llada2_moe", architectures=["LLaDA2MoeModelLM"])
    with pytest.raises(UnsupportedModelError, match="llada2_moe"):
        load_checkpoint(tmp_path)


def test_llada_loads_with_identical_outputs(tmp_path: Path) -> None:
    saved = build_llada(tmp_path)
    loaded = load_checkpoint(tmp_path)
    assert loaded.family == "llada" and loaded.path == tmp_path
    assert loaded.tokenizer.mask_id == loaded.model.special.mask_id
    with torch.no_grad():
        assert torch.equal(loaded.model(IDS), saved(IDS))


def test_dream_loads_with_identical_outputs(tmp_path: Path) -> None:
    saved = build_dream(tmp_path)
    loaded = load_checkpoint(tmp_path)
    assert loaded.family == "dream"
    with torch.no_grad():
        assert torch.equal(loaded.model(IDS), saved(IDS))


def test_tied_dream_head_is_stored_once_and_tied_again_on_load(tmp_path: Path) -> None:
    saved = build_dream(tmp_path, tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(str(tmp_path / "model.safetensors"))
    loaded = load_checkpoint(tmp_path).model
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    with torch.no_grad():
        assert torch.equal(loaded(IDS), saved(IDS))


def test_sharded_checkpoint_loads_from_its_index(tmp_path: Path) -> None:
    saved = build_dream(tmp_path, max_shard_bytes=16_000)
    assert not (tmp_path / "model.safetensors").exists()
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    with torch.no_grad():
        assert torch.equal(load_checkpoint(tmp_path).model(IDS), saved(IDS))


def test_dtype_none_keeps_the_stored_dtype_and_dtype_converts(tmp_path: Path) -> None:
    build_llada(tmp_path)
    rewrite_tensors(tmp_path / "model.safetensors",
                    lambda t: t.update({k: v.to(torch.bfloat16) for k, v in t.items()}))
    assert next(load_checkpoint(tmp_path).model.parameters()).dtype == torch.bfloat16
    assert next(load_checkpoint(tmp_path, dtype=torch.float32).model.parameters()).dtype == torch.float32


def test_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="nowhere"):
        load_checkpoint(tmp_path / "nowhere")


@pytest.mark.parametrize("file", ["config.json", "tokenizer.json", "model.safetensors"])
def test_missing_file_is_named(tmp_path: Path, file: str) -> None:
    build_llada(tmp_path)
    (tmp_path / file).unlink()
    with pytest.raises(CheckpointError, match=file.replace(".", r"\.")):
        load_checkpoint(tmp_path)


def test_malformed_config_json_is_named(tmp_path: Path) -> None:
    build_llada(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        load_checkpoint(tmp_path)


def test_missing_shard_is_named(tmp_path: Path) -> None:
    build_dream(tmp_path, max_shard_bytes=16_000)
    shard = sorted(tmp_path.glob("model-*-of-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=shard.name):
        load_checkpoint(tmp_path)


def test_unknown_config_field_is_named(tmp_path: Path) -> None:
    build_dream(tmp_path)
    edit_config(tmp_path, quantization_config={"bits": 4})
    with pytest.raises(CheckpointError, match="quantization_config"):
        load_checkpoint(tmp_path)


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    build_llada(tmp_path)
    name = "model.transformer.blocks.1.up_proj.weight"
    rewrite_tensors(tmp_path / "model.safetensors", lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=rf"missing tensors: {name}"):
        load_checkpoint(tmp_path)


def test_unexpected_tensor_is_named(tmp_path: Path) -> None:
    build_dream(tmp_path)
    rewrite_tensors(tmp_path / "model.safetensors", lambda t: t.update({"model.rotary_emb.inv_freq": torch.ones(4)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensors: model\.rotary_emb\.inv_freq"):
        load_checkpoint(tmp_path)


def test_wrong_shape_is_named_with_both_shapes(tmp_path: Path) -> None:
    build_dream(tmp_path)
    name = "model.layers.0.self_attn.k_proj.bias"
    rewrite_tensors(tmp_path / "model.safetensors", lambda t: t.update({name: torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=rf"{name} \(file \(3,\), expected \(16,\)\)"):
        load_checkpoint(tmp_path)


def test_every_problem_is_listed_in_one_error(tmp_path: Path) -> None:
    build_llada(tmp_path)

    def break_three(t: dict) -> None:
        t.pop("model.transformer.ln_f.weight")
        t["model.transformer.extra"] = torch.ones(1)
        t["model.transformer.wte.weight"] = torch.zeros(2, 2)

    rewrite_tensors(tmp_path / "model.safetensors", break_three)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert all(s in str(err.value) for s in ("ln_f.weight", "model.transformer.extra", "wte.weight"))


def test_diffusion_gemma_loads_through_transformers(gemma_folder: Path) -> None:
    loaded = load_checkpoint(gemma_folder)
    assert loaded.family == "diffusion_gemma" and loaded.model.special.mask_id == loaded.tokenizer.mask_id


def test_diffusion_gemma_bad_tensors_are_named(gemma_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    shutil.copytree(gemma_folder, folder)

    def break_two(t: dict) -> None:
        t.pop("model.decoder.self_conditioning.up_proj.weight")
        t["model.decoder.norm.weight"] = torch.ones(7)

    rewrite_tensors(folder / "model.safetensors", break_two)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder)
    assert "missing tensors: model.decoder.self_conditioning.up_proj.weight" in str(err.value)
    assert "model.decoder.norm.weight (file (7,), model (32,))" in str(err.value)


def test_diffusion_gemma_without_a_mask_token_is_refused(gemma_folder: Path, tmp_path: Path) -> None:
    from checkpoints import sentencepiece_style_tokenizer

    folder = tmp_path / "nomask"
    shutil.copytree(gemma_folder, folder)
    sentencepiece_style_tokenizer(["<pad>", "<eos>", "<bos>", "<unk>"]).save(str(folder / "tokenizer.json"))
    with pytest.raises(CheckpointError, match="mask token"):
        load_checkpoint(folder)
