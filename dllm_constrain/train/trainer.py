"""Masked-diffusion SFT of a small LLaDA-architecture model on the generator's examples.

Objective (LLaDA SFT): the prompt is never masked; each answer position (the answer's tokens and its EOS
padding, which is how the model learns where to stop) is masked independently with probability t, with
t ~ U(eps, 1) per sample. The loss is the cross-entropy on masked positions, weighted by 1/t and divided by
the number of answer positions: an upper bound on the answer's negative log-likelihood.

A run lives in `run_dir`: `train_state.pt` (weights, optimizer, schedule, every random state and the step,
written every `save_every` steps) and `log.jsonl` (one line per step, plus held-out loss lines every
`eval_every` steps). `--resume` continues from `train_state.pt` exactly where it stopped, so a run can span
several sittings; `--out` receives the exported checkpoint (config.json, model.safetensors, tokenizer.json,
generation_config.json, training_log.json, loss_curve.png) at every save. `--init-from DIR` starts a new run from
an exported checkpoint's weights and tokenizer (for instance to widen the token shift, `--token-shift-left 3`). `report.py` redraws the curve and the
summary from the log alone.

Speed on CPU: rows are bucketed by length (a pool of `pool_batches` batches is drawn, sorted by token count
and cut into batches, so little compute goes to padding), the LM head runs only on masked rows, and
`--autocast bf16` runs the matmuls in bfloat16 (oneDNN's AVX-512 BF16 path) with float32 master weights.
"""
from __future__ import annotations

import json
import math
import random
import re
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from dllm_constrain.engine.models.base import default_position_ids
from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel
from dllm_constrain.train.data import ExampleGenerator
from dllm_constrain.train.tokenizer import BOS, EOS, MASK, PAD, train_tokenizer

HELDOUT_LOSS_SEED = 20011  # fixed held-out batches for the loss logged during training
# The exported checkpoint's decoding defaults (generation_config.json, with the canvas and blocks of 32 as in LLaDA's
# recipes): Fast-dLLM's confidence threshold, at 0.97. On the fifth run's checkpoint (100 held-out requests) 0.9 /
# 0.97 / 0.99 / one token per step (quota) gave constrained field recall 45.4 / 49.5 / 50.5 / 51.9% at 19.8 / 21.4 /
# 23.2 / 34.2 forwards per request; 0.97 keeps most of the gain for 8% more forwards (docs/performance.md).
DECODING_DEFAULTS = {"policy": "threshold", "threshold": 0.97}
CONTEXT = 2048


@dataclass
class TrainConfig:
    """Everything that decides the trained weights; the same config and seed give the same model."""

    out: str = "dllm_constrain/bundled"
    run_dir: str = "runs/bundled"
    resume: bool = False
    seed: int = 0
    vocab_size: int = 4096
    tokenizer_corpus: int = 20000
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 8
    mlp_hidden_size: int = 768
    token_shift: bool = False  # LLaDA's input token shift (engine/models/llada.py): neighbours' ids in each input
    token_shift_left: int = 1  # left neighbours in the token shift (2 or 3 hand a value's key to its first token)
    init_from: str = ""  # a checkpoint folder to start from (weights and tokenizer; see init_from_checkpoint)
    copy_init: bool = False  # start every attention layer as a copier (see copy_friendly_init)
    max_canvas: int = 96
    batch_size: int = 32
    accumulate: int = 1
    pool_batches: int = 8
    steps: int = 3000
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.01
    eps: float = 1e-3
    threads: int = 2
    autocast: str = "none"  # "none" or "bf16"
    log_every: int = 25
    max_minutes: float = 0.0  # stop early (and still save) after this many minutes of this sitting; 0 = none
    save_every: int = 250
    eval_every: int = 250
    eval_batches: int = 4
    simple_share: float = 0.0  # share of schema examples with 1-3 flat short fields (a copy-skill curriculum)
    copy_share: float = 0.0  # share of examples that are pure copy tasks (echo a span of the request)
    prefix_share: float = 0.0  # share of rows noised as a known answer prefix + masked suffix (see make_batch)
    value_share: float = 0.0  # share of rows noised value by value: whole values masked, structure mostly known


def build_model(cfg: TrainConfig) -> LLaDAModel:
    """A LLaDA model whose config.json has the released field names (so the LLaDA loader serves it)."""
    model_cfg = LLaDAConfig(
        d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_heads,
        mlp_hidden_size=cfg.mlp_hidden_size, vocab_size=cfg.vocab_size, embedding_size=cfg.vocab_size,
        mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=BOS, rope_theta=10000.0,
        max_sequence_length=CONTEXT, input_token_shift=cfg.token_shift, token_shift_left=cfg.token_shift_left,
    )
    torch.manual_seed(cfg.seed)
    model = LLaDAModel(model_cfg)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02 if "ff_out" not in name and "attn_out" not in name
                                  else 0.02 / math.sqrt(2 * cfg.n_layers))
    if cfg.copy_init:
        copy_friendly_init(model)
    return model


def copy_friendly_init(model: LLaDAModel, out_scale: float = 0.5, head_scale: float = 50.0) -> None:
    """Start every attention layer as a copier: values and output projections are (scaled) identities, and the LM
    head is the input embedding (scaled), so whatever a position attends to is already read out as logits of the
    attended tokens.

    Why: copying a value from the request is an attention circuit with two halves, where to look (QK) and what
    to carry (OV), and each half's gradient is proportional to the other's strength. From a random start both are
    near zero, and a small masked-diffusion model sits on that saddle for thousands of steps (measured: a 4-layer
    d_model-128 model on a pure span-copy task learned nothing in 6,000 steps at batch 32); with the OV half given,
    the attention pattern is all that is left to learn, and the same task reaches 95-99% in about 1,000 steps.
    Only the initial point changes: the architecture and the checkpoint layout are LLaDA's."""
    d = model.config.d_model
    eye = torch.eye(d)
    with torch.no_grad():
        for block in model.transformer["blocks"]:
            block.v_proj.weight.copy_(eye[: block.v_proj.weight.shape[0]])
            block.attn_out.weight.copy_(out_scale * eye[:, : block.attn_out.weight.shape[1]])
        wte = model.transformer["wte"].weight
        model.transformer["ff_out"].weight.copy_(head_scale * wte)


def grown_layer_sources(old_layers: int, new_layers: int) -> list[tuple[int, bool]]:
    """For each block of a model grown from `old_layers` to `new_layers` blocks: (the checkpoint block it starts
    from, whether it is one of the inserted blocks). Inserted blocks are spread evenly through the stack, each
    right after the block it copies, e.g. 6 -> 8: [0, 1, 2, 2*, 3, 4, 5, 5*]."""
    if new_layers < old_layers:
        raise ValueError(f"a model cannot shrink from {old_layers} to {new_layers} blocks")
    extra = new_layers - old_layers
    after = {old_layers - 1 - (i * old_layers) // extra for i in range(extra)} if extra else set()
    if len(after) < extra:
        raise ValueError(f"cannot insert {extra} blocks into {old_layers}: at most one after each block")
    sources: list[tuple[int, bool]] = []
    for i in range(old_layers):
        sources.append((i, False))
        if i in after:
            sources.append((i, True))
    return sources


def init_from_checkpoint(model: LLaDAModel, folder: Path) -> Tokenizer:
    """Load a previous checkpoint's weights into `model` and return its tokenizer, so training begins exactly at
    the checkpoint's function (a fine-tune, not a restart) and only learns what the new parts add:

    - wider token-shift taps (`shift_prev{k}`) that the checkpoint lacks start at zero;
    - a deeper model (more blocks than the checkpoint) gets the extra blocks inserted evenly through the stack
      (`grown_layer_sources`), each a copy of the block before it with its two output projections (`attn_out`,
      `ff_out`) at zero: a residual block whose outputs are zero is the identity, so the grown model computes
      what the checkpoint computed, while its inner weights start as a trained block's rather than noise (model
      growth by depth, as in stacking / depth up-scaling, made function-preserving by the zero outputs).

    Anything else that does not match is refused."""
    from safetensors.torch import load_file

    folder = Path(folder)
    state = load_file(str(folder / "model.safetensors"))
    own = model.state_dict()
    block = re.compile(r"model\.transformer\.blocks\.(\d+)\.(.+)")
    old_layers = 1 + max((int(m.group(1)) for k in state if (m := block.match(k))), default=-1)
    new_layers = model.config.n_layers
    if new_layers != old_layers:
        try:
            sources = grown_layer_sources(old_layers, new_layers)
        except ValueError as e:
            raise ValueError(f"--init-from {folder}: {e}") from None
        grown: dict[str, torch.Tensor] = {k: v for k, v in state.items() if not block.match(k)}
        for new_i, (old_i, inserted) in enumerate(sources):
            for k, v in state.items():
                m = block.match(k)
                if m and int(m.group(1)) == old_i:
                    zero = inserted and m.group(2) in ("attn_out.weight", "ff_out.weight")
                    grown[f"model.transformer.blocks.{new_i}.{m.group(2)}"] = torch.zeros_like(v) if zero else v.clone()
        state = grown
    unexpected = sorted(set(state) - set(own))
    missing = sorted(set(own) - set(state))
    growable = [k for k in missing
                if k.startswith("model.transformer.shift_prev") and k != "model.transformer.shift_prev.weight"]
    if unexpected or len(growable) != len(missing):
        raise ValueError(f"--init-from {folder}: the checkpoint does not fit this model (unexpected tensors "
                         f"{unexpected[:4]}, missing {sorted(set(missing) - set(growable))[:4]})")
    for k, v in state.items():
        if v.shape != own[k].shape:
            raise ValueError(f"--init-from {folder}: {k} has shape {tuple(v.shape)}, this model {tuple(own[k].shape)}")
    with torch.no_grad():
        for k in growable:
            state[k] = torch.zeros_like(own[k])
    model.load_state_dict(state)
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def value_spans(answer: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of the leaf values of a compact JSON answer: the contents of strings in value
    position (without their quotes: a token such as `":"` joins a key's quote to a value's, and is structure),
    numbers, true, false, null; keys and punctuation are not in any span. [] when the answer is not JSON (the
    plain-text tasks)."""
    try:
        json.loads(answer)
    except ValueError:
        return []
    spans: list[tuple[int, int]] = []
    stack: list[str] = []  # "{" or "["
    expect_key = False
    i, n = 0, len(answer)
    while i < n:
        ch = answer[i]
        if ch in "{[":
            stack.append(ch)
            expect_key = ch == "{"
            i += 1
        elif ch in "}]":
            stack.pop()
            expect_key = False
            i += 1
        elif ch == ",":
            expect_key = bool(stack) and stack[-1] == "{"
            i += 1
        elif ch == ":":
            expect_key = False
            i += 1
        elif ch == '"':
            j = i + 1
            while answer[j] != '"':
                j += 2 if answer[j] == "\\" else 1
            if not expect_key and j > i + 1:
                spans.append((i + 1, j))
            i = j + 1
        elif ch in " \t\r\n":
            i += 1
        else:  # a number or a literal: up to the next delimiter
            j = i
            while j < n and answer[j] not in ",]} \t\r\n":
                j += 1
            spans.append((i, j))
            i = j
    return spans


def encode_examples(examples: list[dict], tok: Tokenizer, max_canvas: int
                    ) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt ids, answer ids, value of each answer token) of each example whose answer fits the canvas with one
    EOS; others are dropped (a truncated answer would teach the model to stop mid-value). The value of a token is
    the index of the leaf value (`value_spans`) it overlaps, -1 for structure (keys, punctuation, plain text)."""
    pairs = []
    for e in examples:
        enc = tok.encode(e["answer"], add_special_tokens=False)
        answer = enc.ids
        if len(answer) < max_canvas:
            spans = value_spans(e["answer"])
            value_of = []
            for start, end in enc.offsets:
                k = next((k for k, (a, b) in enumerate(spans) if start < b and a < end), -1)
                value_of.append(k)
            pairs.append((tok.encode(e["prompt"]).ids, answer, value_of))
    return pairs


def make_batch(pairs: list[tuple[list[int], ...]], cfg: TrainConfig, rng: random.Random,
               gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Left-padded [prompt | answer + EOS padding] rows, with the noised input and the masked targets.

    A row is noised either as in LLaDA (every answer position masked with probability t) or, with probability
    `cfg.prefix_share`, as a semi-autoregressive decode sees it: the answer's first c positions (c uniform over
    the answer) are known and each later position is masked with probability t. Constrained decoding commits
    the forced structure and the confident left part first, so a value's first token is mostly predicted from
    a known prefix and an all-masked right side, a state the uniform noise almost never shows.

    With probability `cfg.value_share` (rows whose answer has values: `encode_examples`' third field) a row is noised
    value by value: each leaf value is masked whole with probability t, each other answer position with
    probability t/2. That is the state constrained decoding asks about most (keys and punctuation forced or
    committed, a value's tokens all still masked), and under the uniform noise a value of L tokens is masked whole
    while its key of K tokens is known with probability L!K!/(L+K+1)! (under 1% for L = K = 3): without it the
    model rarely has to find a value from its key alone."""
    canvas = min(cfg.max_canvas, max(len(pa[1]) for pa in pairs) + rng.randint(1, 24))
    plen = max(len(pa[0]) for pa in pairs)
    rows, keep, answer_region = [], [], []
    for p, a, *_ in pairs:
        a = a[:canvas] + [EOS] * (canvas - len(a))
        pad = plen - len(p)
        rows.append([PAD] * pad + p + a)
        keep.append([False] * pad + [True] * (len(p) + canvas))
        answer_region.append([False] * plen + [True] * canvas)
    ids = torch.tensor(rows)
    key_padding_mask = torch.tensor(keep)
    region = torch.tensor(answer_region)
    t = (1 - cfg.eps) * torch.rand(len(rows), 1, generator=gen) + cfg.eps
    masked = (torch.rand(ids.shape, generator=gen) < t) & region
    if cfg.prefix_share > 0:
        prefix_rows = torch.rand(len(rows), 1, generator=gen) < cfg.prefix_share
        answer_len = torch.tensor([[min(len(a), canvas)] for _, a, *_ in pairs], dtype=torch.float32)
        cut = plen + (torch.rand(len(rows), 1, generator=gen) * (answer_len + 1)).floor().long()
        known = torch.arange(ids.shape[1]).unsqueeze(0) < cut
        masked &= ~(known & prefix_rows)
    if cfg.value_share > 0:
        value_rows = (torch.rand(len(rows), 1, generator=gen) < cfg.value_share).squeeze(1).tolist()
        for r, pa in enumerate(pairs):
            if not value_rows[r] or len(pa) < 3 or max(pa[2], default=-1) < 0:
                continue
            value_of = torch.tensor(pa[2][:canvas] + [-1] * (canvas - min(len(pa[2]), canvas)))
            hit = torch.rand(int(value_of.max()) + 1, generator=gen) < t[r]  # one draw per value
            other = torch.rand(canvas, generator=gen) < t[r] / 2
            masked[r, plen:] = torch.where(value_of >= 0, hit[value_of.clamp(min=0)], other)
    noisy = ids.masked_fill(masked, MASK)
    return {"ids": ids, "noisy": noisy, "masked": masked, "t": t.expand_as(ids), "kpm": key_padding_mask,
            "canvas": torch.full((len(rows),), canvas)}


def bucketed_batches(data: ExampleGenerator, tok: Tokenizer, cfg: TrainConfig,
                     rng: random.Random) -> list[list[tuple[list[int], list[int]]]]:
    """`pool_batches` batches cut from one pool sorted by length (then shuffled), so rows of a batch are alike
    in length and padding costs little."""
    pool: list[tuple[list[int], list[int]]] = []
    while len(pool) < cfg.batch_size * cfg.pool_batches:
        pool += encode_examples(data.examples(cfg.batch_size), tok, cfg.max_canvas)
    pool = sorted(pool[: cfg.batch_size * cfg.pool_batches], key=lambda pa: (len(pa[0]), len(pa[1])))
    batches = [pool[i:i + cfg.batch_size] for i in range(0, len(pool), cfg.batch_size)]
    rng.shuffle(batches)
    return batches


def diffusion_loss(model: LLaDAModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """sum over masked answer positions of CE / t, divided by the number of answer positions."""
    kpm = batch["kpm"]
    hidden = model.hidden_states(batch["noisy"], default_position_ids(kpm), kpm)
    m = batch["masked"]
    logits = model.logits(hidden[m])  # only masked rows: the LM head is the costliest layer here
    ce = F.cross_entropy(logits.float(), batch["ids"][m], reduction="none")
    return (ce / batch["t"][m]).sum() / batch["canvas"].sum()


def save_checkpoint(model: LLaDAModel, tok: Tokenizer, out: Path, generation: dict | None = None) -> None:
    """config.json + model.safetensors + tokenizer.json (+ generation_config.json): a LLaDA-style folder."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(out / "tokenizer.json"))
    if generation is not None:
        (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


@dataclass
class _Run:
    """The mutable state of one training run: what `train_state.pt` holds."""

    model: LLaDAModel
    tok: Tokenizer
    opt: torch.optim.Optimizer
    sched: Any
    data: ExampleGenerator
    rng: random.Random
    gen: torch.Generator
    step: int = 0
    ema: float | None = None
    seconds: float = 0.0
    pending: list = field(default_factory=list)  # batches drawn but not yet used


def _optimizer(model: LLaDAModel, cfg: TrainConfig) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW (no decay on norms) and a linear-warmup cosine schedule over cfg.steps."""
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / cfg.steps))))
    return opt, sched


def _generator(cfg: TrainConfig) -> ExampleGenerator:
    """The training stream: its mix (simple and copy shares) may change between sittings of one run."""
    return ExampleGenerator(cfg.seed, simple_share=cfg.simple_share, copy_share=cfg.copy_share)


def _new_run(cfg: TrainConfig) -> _Run:
    model = build_model(cfg)
    if cfg.init_from:
        tok = init_from_checkpoint(model, Path(cfg.init_from))
    else:
        corpus = ExampleGenerator(cfg.seed + 1).examples(cfg.tokenizer_corpus)
        tok = train_tokenizer((e["prompt"] + e["answer"] for e in corpus), cfg.vocab_size)
    opt, sched = _optimizer(model, cfg)
    return _Run(model, tok, opt, sched, _generator(cfg), random.Random(cfg.seed),
                torch.Generator().manual_seed(cfg.seed), pending=[])


def _save_state(run: _Run, cfg: TrainConfig, run_dir: Path) -> None:
    state = {"config": asdict(cfg), "model": run.model.state_dict(), "opt": run.opt.state_dict(),
             "sched": run.sched.state_dict(), "data_rng": run.data.rng.getstate(), "rng": run.rng.getstate(),
             "gen": run.gen.get_state(), "torch_rng": torch.get_rng_state(), "step": run.step, "ema": run.ema,
             "seconds": run.seconds, "pending": run.pending, "tokenizer": run.tok.to_str()}
    tmp = run_dir / "train_state.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(run_dir / "train_state.pt")  # atomic: an interrupted save leaves the previous state


def _load_state(cfg: TrainConfig, run_dir: Path) -> _Run:
    state = torch.load(run_dir / "train_state.pt", weights_only=False)
    saved = TrainConfig(**{"token_shift": False, "copy_init": False, "token_shift_left": 1, "init_from": "",
                           **state["config"]})
    for f in ("vocab_size", "d_model", "n_layers", "n_heads", "mlp_hidden_size", "token_shift", "token_shift_left",
              "copy_init", "seed"):
        if getattr(saved, f) != getattr(cfg, f):
            raise ValueError(f"--resume: {f} is {getattr(cfg, f)} but the saved run has {getattr(saved, f)}")
    tok = Tokenizer.from_str(state["tokenizer"])
    model = build_model(cfg)
    model.load_state_dict(state["model"])
    opt, sched = _optimizer(model, cfg)
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    data = _generator(cfg)
    data.rng.setstate(state["data_rng"])
    rng = random.Random()
    rng.setstate(state["rng"])
    gen = torch.Generator()
    gen.set_state(state["gen"])
    torch.set_rng_state(state["torch_rng"])
    return _Run(model, tok, opt, sched, data, rng, gen, step=state["step"], ema=state["ema"],
                seconds=state["seconds"], pending=state["pending"])


def _truncate_log(log_path: Path, step: int) -> None:
    """Drop log lines of steps after the saved state (they will be trained again), so a resumed log has each
    step once."""
    if not log_path.exists():
        return
    kept = [line for line in log_path.read_text().splitlines()
            if line and (json.loads(line)["step"] < step or ("heldout_loss" in line and json.loads(line)["step"] <= step))]
    log_path.write_text("".join(line + "\n" for line in kept))


def heldout_loss(model: LLaDAModel, tok: Tokenizer, cfg: TrainConfig) -> float:
    """Mean diffusion loss on fixed held-out batches (held-out phrasings, a seed training never uses): the same
    batches for every model, and the first k of n batches are those of a k-batch measure."""
    data = ExampleGenerator(HELDOUT_LOSS_SEED, split="heldout")
    cfg = replace(cfg, value_share=0.0, prefix_share=0.0)  # the LLaDA noise only: comparable across noise mixes
    rng = random.Random(HELDOUT_LOSS_SEED)
    gen = torch.Generator().manual_seed(HELDOUT_LOSS_SEED)
    was_training = model.training
    model.eval()
    losses = []
    with torch.no_grad():
        for _ in range(cfg.eval_batches):
            pairs = encode_examples(data.examples(cfg.batch_size), tok, cfg.max_canvas)
            losses.append(diffusion_loss(model, make_batch(pairs, cfg, rng, gen)).item())
    model.train(was_training)
    return sum(losses) / len(losses)


def checkpoint_heldout_loss(folder: Path, batches: int = 16, batch_size: int = 32, max_canvas: int = 96) -> float:
    """`heldout_loss` of an exported checkpoint (its config.json, weights and tokenizer), over `batches` batches of
    `batch_size` (the training defaults: what its runs log, over their first `eval_batches`)."""
    c = json.loads((folder / "config.json").read_text())
    cfg = TrainConfig(d_model=c["d_model"], n_layers=c["n_layers"], n_heads=c["n_heads"],
                      mlp_hidden_size=c["mlp_hidden_size"], vocab_size=c["vocab_size"],
                      token_shift=bool(c.get("input_token_shift", False)),
                      token_shift_left=int(c.get("token_shift_left", 1)), eval_batches=batches,
                      batch_size=batch_size, max_canvas=max_canvas)
    model = build_model(cfg)
    tok = init_from_checkpoint(model, folder)
    return heldout_loss(model, tok, cfg)


def train(cfg: TrainConfig) -> dict:
    """Train (or resume), checkpoint into run_dir and export into out; return a summary."""
    torch.set_num_threads(cfg.threads)
    torch.set_flush_denormal(True)
    out, run_dir = Path(cfg.out), Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "log.jsonl"
    if cfg.resume:
        run = _load_state(cfg, run_dir)
        _truncate_log(log_path, run.step)
    else:
        run = _new_run(cfg)
        log_path.write_text("")
    if cfg.autocast not in ("none", "bf16"):
        raise ValueError(f"autocast must be 'none' or 'bf16', got {cfg.autocast!r}")
    amp = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if cfg.autocast == "bf16" else nullcontext
    sitting_start = time.time()
    base_seconds = run.seconds
    run.model.train()
    with log_path.open("a") as log:
        while run.step < cfg.steps:
            run.opt.zero_grad(set_to_none=True)
            total = 0.0
            for _ in range(cfg.accumulate):
                if not run.pending:
                    run.pending = bucketed_batches(run.data, run.tok, cfg, run.rng)
                with amp():
                    loss = diffusion_loss(run.model, make_batch(run.pending.pop(), cfg, run.rng, run.gen))
                (loss / cfg.accumulate).backward()
                total += loss.item() / cfg.accumulate
            torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
            run.opt.step()
            run.sched.step()
            run.ema = total if run.ema is None else 0.95 * run.ema + 0.05 * total
            run.seconds = base_seconds + time.time() - sitting_start
            log.write(json.dumps({"step": run.step, "loss": total, "ema": run.ema,
                                  "lr": run.sched.get_last_lr()[0], "seconds": run.seconds}) + "\n")
            if run.step % cfg.log_every == 0:
                log.flush()
                print(f"step {run.step:5d} loss {total:.4f} ema {run.ema:.4f} {run.seconds:.0f}s", flush=True)
            run.step += 1
            if cfg.eval_every and run.step % cfg.eval_every == 0:
                h = heldout_loss(run.model, run.tok, cfg)
                log.write(json.dumps({"step": run.step, "heldout_loss": h, "seconds": run.seconds}) + "\n")
                print(f"step {run.step:5d} held-out loss {h:.4f}", flush=True)
            if run.step % cfg.save_every == 0:
                log.flush()
                _save_state(run, cfg, run_dir)
                export(run, cfg, out, log_path)
            if cfg.max_minutes and time.time() - sitting_start > cfg.max_minutes * 60:
                print(f"time limit reached at step {run.step}", flush=True)
                break
    _save_state(run, cfg, run_dir)
    run.model.eval()
    return export(run, cfg, out, log_path)


def export(run: _Run, cfg: TrainConfig, out: Path, log_path: Path) -> dict:
    """The shippable checkpoint, its training log summary and the loss curve, into `out`."""
    from dllm_constrain.train.report import read_log, summarize, plot_loss

    save_checkpoint(run.model, run.tok, out, {"max_new_tokens": cfg.max_canvas,
                                              "block_length": min(32, cfg.max_canvas), **DECODING_DEFAULTS})
    steps, evals = read_log(log_path)
    n_params = sum(p.numel() for p in run.model.parameters())
    summary = summarize(asdict(cfg), n_params, steps, evals)
    (out / "training_log.json").write_text(json.dumps(
        {"summary": summary, "log": steps[:: max(1, len(steps) // 400)], "heldout": evals}))
    plot_loss(steps, evals, out / "loss_curve.png")
    return summary

