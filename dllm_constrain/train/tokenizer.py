"""Train the bundled model's byte-level BPE tokenizer on the generator's corpus.

Layout as in Llama-3/Qwen tokenizer.json files (ByteLevel pre-tokenizer and decoder, all 256 byte symbols in
the alphabet, so every string is encodable), plus four specials: BOS, EOS, PAD and MASK (MASK != PAD), and a
post-processor that prepends BOS, so `encode(text)` gives exactly the ids the model was trained on.

A space is always a token of its own (a Split pre-tokenizer isolates it before the byte-level one), unlike GPT-2's
" word" pieces. The model's main job is to copy a value from the request into a JSON string: with space-prefixed
pieces "name Ada Lovelace" gives " Ada" while `"name":"Ada Lovelace"` gives "Ada", so every copied value would start
with a different token than the one it copies, and a small model has to learn that mapping piece by piece. With
isolated spaces both sides carry the same ids ("Ada", "da", ...) and copying is reading out the same tokens.
"""
from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|mask|>"]
BOS, EOS, PAD, MASK = range(4)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    """A byte-level BPE with ids 0..3 = BOS, EOS, PAD, MASK."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", BOS)])
    assert [tok.token_to_id(s) for s in SPECIALS] == [BOS, EOS, PAD, MASK]
    return tok
