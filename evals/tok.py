"""Which tokenizer the walks use.

`--tokenizer PATH`: a folder with tokenizer.json (+ tokenizer_config.json naming the EOS), or the file.
`--tokenizer bytes`: a byte-level tokenizer of 256 one-byte tokens + EOS (no merges), written to a cache
folder so every engine (llguidance and xgrammar load tokenizers through transformers) can read it.
No --tokenizer: the bundled model's tokenizer when the bundled checkpoint is there, else `bytes`.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

BYTES = "bytes"
BYTES_EOS = "<|end_of_text|>"


def bundled_tokenizer_dir() -> Path | None:
    from dllm_constrain.api import bundled_model_path

    p = bundled_model_path()
    return p if (p / "tokenizer.json").is_file() else None


def build_bytes_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(alphabet)}
    vocab[BYTES_EOS] = len(alphabet)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens([BYTES_EOS])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def bytes_tokenizer_dir() -> Path:
    d = Path(tempfile.gettempdir()) / f"dllm_constrain_evals_bytes_tokenizer_{os.getuid() if hasattr(os, 'getuid') else 0}"
    tj = d / "tokenizer.json"
    if not tj.is_file():
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"tokenizer.json.{os.getpid()}"
        build_bytes_tokenizer().save(str(tmp))
        os.replace(tmp, tj)
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": BYTES_EOS, "model_max_length": 1 << 20,
               "clean_up_tokenization_spaces": False}
        (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    return d


def resolve_tokenizer(spec: str | None) -> tuple[Path, str]:
    """(folder holding tokenizer.json, short name for tables)."""
    if spec is None:
        b = bundled_tokenizer_dir()
        if b is not None:
            return b, "bundled"
        spec = BYTES
    if spec == BYTES:
        return bytes_tokenizer_dir(), BYTES
    p = Path(spec)
    if p.is_file() and p.name == "tokenizer.json":
        p = p.parent
    if not (p / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {spec}")
    return p.resolve(), p.resolve().name


def special_ids(tokdir: str | os.PathLike) -> dict[str, int]:
    """EOS (and mask) ids a checkpoint folder declares in config.json, for tokenizers whose own files do not
    name the EOS (the bundled checkpoint: tokenizer.json + config.json, no tokenizer_config.json)."""
    d = Path(tokdir)
    out: dict[str, int] = {}
    if (d / "tokenizer_config.json").is_file() or not (d / "config.json").is_file():
        return out
    try:
        cfg = json.loads((d / "config.json").read_text())
    except (OSError, ValueError):
        return out
    for key, name in (("eos_token_id", "eos_id"), ("mask_token_id", "mask_id")):
        v = cfg.get(key)
        if isinstance(v, int):
            out[name] = v
    return out


def load_encoder(tokdir: str | os.PathLike):
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(Path(tokdir) / "tokenizer.json"))

    def encode(text: str) -> list[int]:
        return tk.encode(text, add_special_tokens=False).ids

    return encode
