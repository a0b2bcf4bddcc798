"""Masked-diffusion SFT of a small LLaDA-architecture model on the generator's examples.

Objective (LLaDA SFT): the prompt is never masked; each answer position (the answer's tokens and its EOS
padding, which is how the model learns where to stop) is masked independently with probability t, with
t ~ U(eps, 1) per sample. The loss is the cross-entropy on masked positions, weighted by 1/t and divided by
the number of answer positions: an upper bound on the answer's negative log-likelihood.
"""
from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from dllm_constrain.engine.models.base import default_position_ids
from dllm_constrain.engine.models.llada import LLaDAConfig, LLaDAModel
from dllm_constrain.train.data import ExampleGenerator
from dllm_constrain.train.tokenizer import BOS, EOS, MASK, PAD, train_tokenizer


@dataclass
class TrainConfig:
    """Everything that decides the trained weights; the same config and seed give the same model."""

    out: str = "dllm_constrain/bundled"
    seed: int = 0
    vocab_size: int = 4096
    tokenizer_corpus: int = 20000
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 8
    mlp_hidden_size: int = 768
    max_canvas: int = 96
    batch_size: int = 32
    steps: int = 3000
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.01
    eps: float = 1e-3
    threads: int = 2
    log_every: int = 25
    max_minutes: float = 0.0  # stop early (and still save) after this many minutes; 0 = no limit
    save_every: int = 250


def build_model(cfg: TrainConfig) -> LLaDAModel:
    """A LLaDA model whose config.json has the released field names (so the LLaDA loader serves it)."""
    model_cfg = LLaDAConfig(
        d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_heads,
        mlp_hidden_size=cfg.mlp_hidden_size, vocab_size=cfg.vocab_size, embedding_size=cfg.vocab_size,
        mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=BOS, rope_theta=10000.0,
        max_sequence_length=1024,
    )
    torch.manual_seed(cfg.seed)
    model = LLaDAModel(model_cfg)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02 if "ff_out" not in name and "attn_out" not in name
                                  else 0.02 / math.sqrt(2 * cfg.n_layers))
    return model


def make_batch(examples: list[dict], tok: Tokenizer, cfg: TrainConfig, rng: random.Random,
               gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Left-padded [prompt | answer + EOS padding] rows, with the noised input and the masked targets."""
    prompts = [tok.encode(e["prompt"]).ids for e in examples]
    answers = [tok.encode(e["answer"], add_special_tokens=False).ids[: cfg.max_canvas - 1] for e in examples]
    canvas = min(cfg.max_canvas, max(len(a) for a in answers) + rng.randint(1, 24))
    plen = max(len(p) for p in prompts)
    rows, keep, answer_region = [], [], []
    for p, a in zip(prompts, answers):
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
    noisy = ids.masked_fill(masked, MASK)
    return {"ids": ids, "noisy": noisy, "masked": masked, "t": t.expand_as(ids), "kpm": key_padding_mask,
            "canvas": torch.full((len(rows),), canvas)}


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


def train(cfg: TrainConfig) -> dict:
    """Train, save the checkpoint, the loss log and a loss curve PNG into cfg.out; return a summary."""
    torch.set_num_threads(cfg.threads)
    torch.set_flush_denormal(True)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = ExampleGenerator(cfg.seed + 1).examples(cfg.tokenizer_corpus)
    tok = train_tokenizer((e["prompt"] + e["answer"] for e in corpus), cfg.vocab_size)
    model = build_model(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / cfg.steps))))
    data = ExampleGenerator(cfg.seed)
    rng = random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    log: list[dict] = []
    start = time.time()
    ema = None
    model.train()
    for step in range(cfg.steps):
        batch = make_batch(data.examples(cfg.batch_size), tok, cfg, rng, gen)
        loss = diffusion_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        log.append({"step": step, "loss": loss.item(), "ema": ema, "lr": sched.get_last_lr()[0],
                    "seconds": time.time() - start})
        if step % cfg.log_every == 0:
            print(f"step {step:5d} loss {loss.item():.4f} ema {ema:.4f} {time.time() - start:.0f}s", flush=True)
        if (step + 1) % cfg.save_every == 0:
            _save_all(model, tok, out, log, cfg, n_params)
        if cfg.max_minutes and time.time() - start > cfg.max_minutes * 60:
            print(f"time limit reached at step {step}", flush=True)
            break
    model.eval()
    return _save_all(model, tok, out, log, cfg, n_params)


def _save_all(model, tok, out: Path, log: list[dict], cfg: TrainConfig, n_params: int) -> dict:
    # The canvas the model was trained on is its natural default; blocks of 32 as in LLaDA's recipes.
    # decoding defaults measured on the bundled model (docs/performance.md): threshold 0.9 commits the same
    # answers as one-token quota steps with fewer forwards
    save_checkpoint(model, tok, out, {"max_new_tokens": cfg.max_canvas, "block_length": min(32, cfg.max_canvas),
                                      "policy": "threshold", "threshold": 0.9})
    summary = {"train_config": asdict(cfg), "parameters": n_params, "steps_done": len(log),
               "final_loss_ema": log[-1]["ema"] if log else None,
               "train_seconds": log[-1]["seconds"] if log else 0.0}
    (out / "training_log.json").write_text(json.dumps({"summary": summary, "log": log[:: max(1, len(log) // 400)]}))
    plot_loss(log, out / "loss_curve.png")
    return summary


def plot_loss(log: list[dict], path: Path) -> None:
    """The loss curve (raw and EMA) as a PNG; skipped quietly only when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in log], [r["loss"] for r in log], alpha=0.3, label="loss")
    ax.plot([r["step"] for r in log], [r["ema"] for r in log], label="EMA")
    ax.set_xlabel("step")
    ax.set_ylabel("masked-diffusion loss")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
