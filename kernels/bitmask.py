"""The token bitmask: the one format of allowed-token masks from a constraint, through the engine, to the kernels.

Layout (xgrammar's token bitmask): int32 [rows, ceil(vocab / 32)]; bit j of word w of a row allows token 32 w + j
(bit 31 is the sign bit, so a word with all 32 tokens allowed is -1). Bits of tokens >= vocab are 0 in masks this
project builds (`allocate_token_bitmask` starts from -1, as xgrammar's; a fill overwrites every word of its rows).

On a little-endian host byte k of word w holds tokens 32 w + 8 k .. 32 w + 8 k + 7 (bit b = token 32 w + 8 k + b),
which is exactly numpy's `packbits(row, bitorder="little")` of a bool row. So the constraint layer writes a row as
bytes (`bitmask_bytes`, `write_row`), and packed token sets it already keeps (the token automaton's interned rows,
the grammar's group bits) are copied in without unpacking. A *mask row* below is either form: a bool [V] array or
its little-endian packed bytes (uint8 [>= ceil(V / 8)]); `write_row` / `set_token` also accept a bool destination,
so one row computation serves the bool convenience API (`allowed_tokens`) and the bitmask.

Why this module lives in kernels/: the layout is what the Triton kernel reads bit by bit
(`_triton_masked_row_stats._allowed_bits`) and what the torch reference unpacks; the module needs only torch and
numpy, and importing it does not run the constraint compiler's package, so the producers (constraints, engine) and
the consumer (kernels) share it without a cycle.
"""
from __future__ import annotations

import sys

import numpy as np
import torch
import torch.nn.functional as F

if sys.byteorder != "little":  # the helpers view int32 words as their bytes
    raise ImportError("dllm_constrain.kernels.bitmask assumes a little-endian host")

TOKENS_PER_WORD = 32

# bits of each byte value, low bit first: BYTE_BITS[v, b] = (v >> b) & 1; NOT_BYTE_BITS is its complement
BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
NOT_BYTE_BITS = np.ascontiguousarray(1 - BYTE_BITS)

try:  # the CPU kernel built by the package's build (setup.py); absent without a C compiler
    from dllm_constrain.kernels import _bitmask_cpu
except ImportError:
    _bitmask_cpu = None

__all__ = [
    "TOKENS_PER_WORD", "allocate_token_bitmask", "apply_token_bitmask_inplace", "bitmask_bytes", "clear_token",
    "pack_bool_mask", "packed_width", "row_allows", "row_tokens", "set_token", "single_token_rows", "single_tokens",
    "single_tokens_reference", "unpack_bitmask", "unpack_bitmask_into", "write_row",
]


def packed_width(vocab: int) -> int:
    """Words per row of a packed bitmask: ceil(vocab / 32)."""
    return (vocab + TOKENS_PER_WORD - 1) // TOKENS_PER_WORD


def allocate_token_bitmask(rows: int, vocab: int) -> torch.Tensor:
    """int32 [rows, ceil(vocab / 32)] on the CPU with every bit set (every token allowed), as xgrammar's
    `allocate_token_bitmask`; a constraint's `fill_token_bitmask` overwrites each row it is asked for."""
    return torch.full((int(rows), packed_width(int(vocab))), -1, dtype=torch.int32)


def bitmask_bytes(bitmask: torch.Tensor) -> np.ndarray:
    """uint8 [rows, 4 W] numpy view of a CPU int32 bitmask [rows, W] whose rows are contiguous (writes go
    through): the form the constraint layer writes rows in."""
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise TypeError(f"a token bitmask is int32 [rows, words], got {bitmask.dtype} {tuple(bitmask.shape)}")
    if bitmask.device.type != "cpu":
        raise ValueError(f"a token bitmask is filled on the CPU, got one on {bitmask.device}")
    if bitmask.shape[1] > 1 and bitmask.stride(1) != 1:
        raise ValueError("the rows of a token bitmask must be contiguous")
    return bitmask.numpy().view(np.uint8)


# ------------------------------------------------------------------------------------------- rows (numpy)


def write_row(dst: np.ndarray, row: np.ndarray | None) -> None:
    """Overwrite the mask row `dst` (packed bytes of a bitmask row, or bool [V]) with `row` (bool [V'] or packed
    bytes; None = nothing allowed). Tokens past what `dst` holds are dropped; the rest of `dst` is zeroed."""
    if row is None:
        dst[:] = 0
        return
    if dst.dtype == np.bool_:
        bits = row if row.dtype == np.bool_ else np.unpackbits(row, bitorder="little").view(np.bool_)
        k = min(dst.shape[0], bits.shape[0])
        dst[:k] = bits[:k]
        dst[k:] = False
        return
    data = np.packbits(row, bitorder="little") if row.dtype == np.bool_ else row
    if data.shape == dst.shape:
        np.copyto(dst, data)
        return
    k = min(dst.shape[0], data.shape[0])
    dst[:k] = data[:k]
    dst[k:] = 0


def set_token(dst: np.ndarray, token: int) -> None:
    """Allow `token` in the mask row `dst` (packed bytes or bool); a token past the row is ignored."""
    if dst.dtype == np.bool_:
        if 0 <= token < dst.shape[0]:
            dst[token] = True
    elif 0 <= token < 8 * dst.shape[0]:
        dst[token >> 3] |= np.uint8(1 << (token & 7))


def row_allows(row: np.ndarray, token: int) -> bool:
    """Whether the mask row (packed bytes or bool) allows `token`."""
    if row.dtype == np.bool_:
        return 0 <= token < row.shape[0] and bool(row[token])
    return 0 <= token < 8 * row.shape[0] and bool((int(row[token >> 3]) >> (token & 7)) & 1)


def row_tokens(row: np.ndarray, vocab: int | None = None) -> np.ndarray:
    """Allowed token ids of a mask row (packed bytes or bool), ascending; below `vocab` when given."""
    if row.dtype != np.bool_:
        row = np.unpackbits(row, bitorder="little").view(np.bool_)
    ids = np.flatnonzero(row)
    return ids if vocab is None else ids[ids < vocab]


# --------------------------------------------------------------------------------------- tensors (torch)


def pack_bool_mask(allowed: torch.Tensor) -> torch.Tensor:
    """bool [..., V] (True = allowed) -> int32 [..., ceil(V/32)] with bit j of word w = allowed[..., 32 w + j].

    Bits past V are 0. Word values are the two's-complement int32 of sum_j 2^j allowed[32 w + j] (bit 31 sets the
    sign), exactly xgrammar's token bitmask. On the CPU numpy packs the bytes; elsewhere they are built byte by byte
    on the device (byte k of word w = tokens 32 w + 8 k + 0..7), so the temporaries cost one byte per token.
    """
    if allowed.dtype != torch.bool:
        raise TypeError(f"pack_bool_mask expects a bool tensor, got {allowed.dtype}")
    vocab = allowed.shape[-1]
    words = packed_width(vocab)
    if allowed.device.type == "cpu":
        out = np.zeros((*allowed.shape[:-1], words * 4), dtype=np.uint8)
        out[..., : (vocab + 7) // 8] = np.packbits(allowed.numpy(), axis=-1, bitorder="little")
        return torch.from_numpy(out).view(torch.int32)
    pad = words * 32 - vocab
    bits = F.pad(allowed, (0, pad)) if pad else allowed.contiguous()
    bits = bits.view(torch.uint8).reshape(*allowed.shape[:-1], words * 4, 8)
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=allowed.device)
    as_bytes = (bits * weights).sum(-1, dtype=torch.uint8)  # distinct powers of two: no overflow
    return as_bytes.view(torch.int32)


def _check_packed(packed: torch.Tensor, vocab: int) -> None:
    if packed.dtype != torch.int32:
        raise TypeError(f"packed bitmask must be int32, got {packed.dtype}")
    if packed.shape[-1] * 32 < vocab:
        raise ValueError(f"packed bitmask covers {packed.shape[-1] * 32} tokens, vocab is {vocab}")


def unpack_bitmask(packed: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 [..., W] packed bitmask -> bool [..., vocab] (True = allowed); the inverse of `pack_bool_mask`.

    Works on the bytes of the words (little-endian: byte k of word w holds tokens 32 w + 8 k + 0..7): numpy's
    unpackbits on the CPU, shifts on the device elsewhere (one byte per token of temporaries)."""
    _check_packed(packed, vocab)
    as_bytes = packed.contiguous().view(torch.uint8)  # [..., 4 W], little-endian
    if packed.device.type == "cpu":
        return torch.from_numpy(np.unpackbits(as_bytes.numpy(), axis=-1, count=vocab, bitorder="little")).view(
            torch.bool)
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (as_bytes[..., :, None] >> shifts).bitwise_and_(1)  # [..., 4 W, 8] uint8
    return bits.reshape(*packed.shape[:-1], -1)[..., :vocab].bool()


def unpack_bitmask_into(packed: torch.Tensor, buffer: torch.Tensor, *, invert: bool = False) -> torch.Tensor:
    """bool [rows, 32 W] view of `buffer` (uint8, >= rows * 32 W bytes, on packed's device) holding the bits of the
    int32 [rows, W] bitmask (their complement with `invert`): the unpack the torch reference masks logits with,
    without allocating. On the CPU a byte-to-bits table lookup (numpy take), elsewhere shifts."""
    rows, words = packed.shape
    as_bytes = packed.contiguous().view(torch.uint8)  # [rows, 4 W], little-endian
    bits = buffer[: rows * words * 32].view(rows, words * 4, 8)
    if packed.device.type == "cpu":
        np.take(NOT_BYTE_BITS if invert else BYTE_BITS, as_bytes.numpy(), axis=0, out=bits.numpy())
    else:
        src = torch.bitwise_not(as_bytes) if invert else as_bytes
        shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
        torch.bitwise_right_shift(src[..., None], shifts, out=bits).bitwise_and_(1)
    return bits.view(torch.bool).view(rows, words * 32)


def apply_token_bitmask_inplace(logits: torch.Tensor, bitmask: torch.Tensor, value: float = float("-inf"),
                                buffer: torch.Tensor | None = None) -> torch.Tensor:
    """Set logits[r, t] = value for every token t that row r of the int32 bitmask [>= rows, >= ceil(V / 32)] does not
    allow (xgrammar's `apply_token_bitmask_inplace`); returns `logits`. A C-contiguous float32 block on the CPU goes
    through the native kernel (kernels/_bitmask_cpu.c: one pass, no per-token temporaries, the GIL released);
    anything else through the torch reference: the complement unpacked into `buffer` (uint8, >= rows * 32 W bytes,
    allocated when None) and one masked_fill."""
    rows, vocab = logits.shape
    _check_packed(bitmask, vocab)
    if bitmask.shape[0] < rows:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows, logits {rows}")
    if (_bitmask_cpu is not None and logits.device.type == "cpu" and bitmask.device.type == "cpu"
            and logits.dtype == torch.float32 and logits.is_contiguous() and bitmask.is_contiguous()):
        if rows:
            _bitmask_cpu.apply_token_bitmask(logits.numpy(), bitmask.numpy(), value)
        return logits
    packed = bitmask[:rows].to(logits.device)
    if buffer is None:
        buffer = torch.empty(packed.numel() * 32, dtype=torch.uint8, device=logits.device)
    logits.masked_fill_(unpack_bitmask_into(packed, buffer, invert=True)[:, :vocab], value)
    return logits


def single_tokens(bitmask: torch.Tensor) -> torch.Tensor:
    """int64 [rows]: the token each row of an int32 bitmask allows when it allows exactly one, else -1 (the forced
    tokens of a step). A CPU bitmask goes through the native kernel (one read of the words, the GIL released); else
    numpy: one nonzero word that is a power of two."""
    if _bitmask_cpu is not None and bitmask.device.type == "cpu" and bitmask.dim() == 2:
        out = torch.empty(bitmask.shape[0], dtype=torch.int64)
        if bitmask.shape[0]:
            _bitmask_cpu.single_tokens(bitmask.contiguous().numpy(), out.numpy())
        return out
    return single_tokens_reference(bitmask)


def single_tokens_reference(bitmask: torch.Tensor) -> torch.Tensor:
    """`single_tokens` in numpy (without the native kernel, and its reference in the tests)."""
    words = bitmask.cpu().contiguous().numpy().view(np.uint32)
    nonzero = words != 0
    single = (nonzero.sum(-1) == 1) & ((words & (words - np.uint32(1))) == 0).all(-1)
    word = nonzero.argmax(-1)
    bits = words[np.arange(words.shape[0]), word] if words.shape[0] else np.zeros(0, np.uint32)
    bit = np.log2(np.maximum(bits, 1).astype(np.float64)).astype(np.int64)  # exact for a power of two
    return torch.from_numpy(np.where(single, word.astype(np.int64) * TOKENS_PER_WORD + bit, -1))


def single_token_rows(bitmask: torch.Tensor) -> torch.Tensor:
    """bool [rows]: the rows of an int32 bitmask that allow exactly one token."""
    return single_tokens(bitmask) >= 0


def clear_token(bitmask: torch.Tensor, row: int, token: int) -> None:
    """Disallow `token` in row `row` of a CPU int32 bitmask (a token past the row is ignored)."""
    if 0 <= token < bitmask.shape[1] * TOKENS_PER_WORD:
        bitmask_bytes(bitmask)[row, token >> 3] &= np.uint8(0xFF ^ (1 << (token & 7)))
