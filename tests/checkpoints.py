"""Builders for tiny random checkpoints with the released tensor names and config fields of each family.

Everything here is small enough to build in a test's tmp_path in well under a second (the DiffusionGemma one
goes through transformers' save_pretrained and takes about one). Nothing reads ../shared or the network.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import json

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from dllm_constrain.engine.loader import save_checkpoint
from dllm_constrain.engine.models.dream import DreamConfig, DreamModel
from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel

CORPUS = [
    '{"name": "Ada", "age": 36, "tags": ["math", "engines"]}',
    "The quick brown fox jumps over the lazy dog.",
    "Schema: {\"type\":\"object\"}\nRequest: give me a person\nAnswer: ",
    "naïve café – déjà vu, 東京 🚀",
    "    indented\tcode = [1, 2, 3]\r\n",
] * 20

MODEL_VOCAB = 320  # >= every tiny tokenizer below, padded like LLaDA's embedding_size

LLADA_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|eot_id|>", "<|mdm_mask|>"]
DREAM_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]

# Fields of the released LLaDA-8B config.json that do not change inference: a tiny config carries them too, so
# the tests prove a real config parses.
LLADA_RELEASED_FIELDS: dict[str, Any] = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModel": "modeling_llada.LLaDAModelLM"},
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "embedding_dropout": 0.0,
    "flash_attention": False, "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None,
    "init_device": "meta", "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False,
    "layer_norm_type": "rms", "layer_norm_with_affine": True, "mlp_ratio": 4, "model_type": "llada",
    "multi_query_attention": None, "precision": "amp_bf16", "residual_dropout": 0.0, "rope": True,
    "rope_full_precision": True, "scale_logits": False, "transformers_version": "4.46.3", "use_cache": False,
    "weight_tying": False,
}
# The same for Dream-v0-Instruct-7B's config.json.
DREAM_RELEASED_FIELDS: dict[str, Any] = {
    "architectures": ["DreamModel"], "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    "hidden_act": "silu", "initializer_range": 0.02, "max_window_layers": 28, "model_type": "Dream",
    "rope_scaling": None, "sliding_window": None, "torch_dtype": "bfloat16", "transformers_version": "4.46.2",
    "use_cache": False, "use_sliding_window": False,
}


def byte_level_tokenizer(specials: Sequence[str], vocab_size: int = 300) -> HFTokenizer:
    """A byte-level BPE (GPT-2/Llama-3 layout: ByteLevel pre-tokenizer and decoder, all 256 byte symbols)."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def sentencepiece_style_tokenizer(specials: Sequence[str] = GEMMA_SPECIALS) -> HFTokenizer:
    """A Llama-2/Gemma-style BPE: Metaspace '▁' for spaces, `<0xAB>` byte-fallback tokens, Replace decoder."""
    vocab: dict[str, int] = {}
    for s in specials:
        vocab[s] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in "▁abcdefghijklmnopqrstuvwxyz":
        vocab.setdefault(ch, len(vocab))
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("▁", "a")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(list(specials))
    return tok


def llada_config(vocab_ids: Callable[[str], int], **overrides: Any) -> LLaDAConfig:
    fields: dict[str, Any] = dict(
        d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden_size=48, vocab_size=MODEL_VOCAB,
        embedding_size=MODEL_VOCAB, mask_token_id=vocab_ids("<|mdm_mask|>"), eos_token_id=vocab_ids("<|endoftext|>"),
        pad_token_id=vocab_ids("<|endoftext|>"), bos_token_id=vocab_ids("<|startoftext|>"),
        rope_theta=500000.0, max_sequence_length=256,
    )
    fields.update(overrides)
    return LLaDAConfig(**fields)


def dream_config(vocab_ids: Callable[[str], int], **overrides: Any) -> DreamConfig:
    fields: dict[str, Any] = dict(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=MODEL_VOCAB, mask_token_id=vocab_ids("<|mask|>"), eos_token_id=vocab_ids("<|endoftext|>"),
        pad_token_id=vocab_ids("<|endoftext|>"), bos_token_id=vocab_ids("<|endoftext|>"),
        rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=256,
    )
    fields.update(overrides)
    return DreamConfig(**fields)


def randomize(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Deterministic non-trivial weights (norm weights too, so a wrong norm shows up)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() > 1 else 0.1) + (1.0 if p.dim() == 1 else 0.0))
    return model.eval()


def _with_released_fields(folder: Path, fields: dict[str, Any]) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update({k: v for k, v in fields.items() if k not in config or k == "architectures"})
    path.write_text(json.dumps(config, indent=2))


def build_llada(folder: Path, seed: int = 0, max_shard_bytes: int | None = None, **overrides: Any) -> LLaDAModel:
    """A tiny LLaDA checkpoint folder (released config fields included); returns the model that was saved."""
    tok = byte_level_tokenizer(LLADA_SPECIALS)
    model = randomize(LLaDAModel(llada_config(tok.token_to_id, **overrides)), seed)
    save_checkpoint(model, tok, folder, max_shard_bytes=max_shard_bytes)
    _with_released_fields(folder, LLADA_RELEASED_FIELDS)
    return model


def build_dream(folder: Path, seed: int = 0, max_shard_bytes: int | None = None, **overrides: Any) -> DreamModel:
    """A tiny Dream checkpoint folder (released config fields included); returns the model that was saved."""
    tok = byte_level_tokenizer(DREAM_SPECIALS)
    model = randomize(DreamModel(dream_config(tok.token_to_id, **overrides)), seed)
    model.tie_weights()  # randomize() may have replaced nothing, but keep the tie explicit
    save_checkpoint(model, tok, folder, max_shard_bytes=max_shard_bytes)
    _with_released_fields(folder, DREAM_RELEASED_FIELDS)
    return model


def diffusion_gemma_config(canvas_length: int = 8, sliding_window: int = 4) -> Any:
    """A tiny DiffusionGemmaConfig: one sliding and one full-attention layer, MoE with 4 experts, tiny vision."""
    from transformers import DiffusionGemmaConfig

    text = dict(
        vocab_size=MODEL_VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, global_head_dim=16, num_global_key_value_heads=1,
        max_position_embeddings=256, sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"], num_experts=4, top_k_experts=2,
        moe_intermediate_size=16, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=8, position_embedding_size=64, patch_size=4, pooling_kernel_size=1)
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas_length,
                                boi_token_id=MODEL_VOCAB - 3, eoi_token_id=MODEL_VOCAB - 2,
                                image_token_id=MODEL_VOCAB - 1)


def build_diffusion_gemma(folder: Path, seed: int = 0, canvas_length: int = 8, sliding_window: int = 4) -> Path:
    """A tiny DiffusionGemma checkpoint written by transformers' save_pretrained, plus a Gemma-style tokenizer."""
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(diffusion_gemma_config(canvas_length, sliding_window)).eval()
    with torch.no_grad():  # the default init leaves some norms at exactly 1 and scalars at 1: perturb them
        gen = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if p.dim() == 1 and "vision" not in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    sentencepiece_style_tokenizer().save(str(folder / "tokenizer.json"))
    return folder


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A left-padded [B, L] batch and its key-padding mask (True = real token)."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (width - len(r)) + list(r) for r in rows])
    mask = torch.tensor([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    return ids, mask


# ---------------------------------------------------------------------------------- Instruct layouts
# The chat formats of the released Instruct checkpoints, written from their published prompt layouts: LLaDA-8B-
# Instruct uses Llama-3's header/eot layout (the BOS written by the template before the first message), Dream-v0-
# Instruct-7B Qwen2's ChatML with a default system message.
LLADA_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
DREAM_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLADA_INSTRUCT_SPECIALS = [*LLADA_SPECIALS, "<|start_header_id|>", "<|end_header_id|>"]


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2))


def build_llada_instruct(folder: Path, seed: int = 0, generation_config: dict[str, Any] | None = None,
                         **overrides: Any) -> LLaDAModel:
    """A tiny LLaDA-8B-Instruct layout: config.json with the released fields, tokenizer_config.json with the chat
    template and its special tokens, generation_config.json (eos 126081-like `<|endoftext|>`; `<|eot_id|>` ends a
    turn). Returns the saved model."""
    tok = byte_level_tokenizer(LLADA_INSTRUCT_SPECIALS)
    model = randomize(LLaDAModel(llada_config(tok.token_to_id, **overrides)), seed)
    save_checkpoint(model, tok, folder)
    _with_released_fields(folder, LLADA_RELEASED_FIELDS)
    _write_json(folder / "tokenizer_config.json", {
        "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "chat_template": LLADA_CHAT_TEMPLATE, "model_max_length": 1000000000000000019884624838656})
    _write_json(folder / "generation_config.json", generation_config if generation_config is not None else {
        "bos_token_id": tok.token_to_id("<|startoftext|>"), "eos_token_id": tok.token_to_id("<|endoftext|>"),
        "pad_token_id": tok.token_to_id("<|endoftext|>")})
    return model


def build_dream_instruct(folder: Path, seed: int = 0, generation_config: dict[str, Any] | None = None,
                         **overrides: Any) -> DreamModel:
    """A tiny Dream-v0-Instruct-7B layout: ChatML template (`<|im_end|>` ends a turn), eos `<|endoftext|>`, mask
    `<|mask|>`, generation_config.json with the eos/pad/bos ids. Returns the saved model."""
    tok = byte_level_tokenizer(DREAM_SPECIALS)
    model = randomize(DreamModel(dream_config(tok.token_to_id, **overrides)), seed)
    model.tie_weights()
    save_checkpoint(model, tok, folder)
    _with_released_fields(folder, DREAM_RELEASED_FIELDS)
    _write_json(folder / "tokenizer_config.json", {
        "bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "mask_token": "<|mask|>",
        "chat_template": DREAM_CHAT_TEMPLATE})
    eos = tok.token_to_id("<|endoftext|>")
    _write_json(folder / "generation_config.json", generation_config if generation_config is not None else {
        "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos})
    return model
