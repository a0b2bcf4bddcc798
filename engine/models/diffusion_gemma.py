"""DiffusionGemma (google/diffusiongemma-*) driven by our denoising loop, through transformers' own modules.

Map (the model's anatomy, its sampler and the honest limits of this adapter: docs/checkpoints.md, "DiffusionGemma"):
- the encoder (a Gemma-4 MoE text stack) runs once over the prompt; its product is the KV cache;
- the decoder (the same, tied weights) runs over the canvas, bidirectional over [prompt KV cache | canvas], with the
  previous step's logits as the self-conditioning signal; logits are soft-capped as `30 * tanh(z / 30)`;
- uniform-state canvas: no mask token; open positions hold random vocabulary ids and re-noising draws new ones;
- block diffusion: a finished canvas is appended to the encoder cache (`extend_prompt`) and the next one starts.
What the engine loop calls (batch-first tensors; prompts left-padded, `prompt_mask` True = real token):
    prompt = model.encode_prompt(prompt_ids, prompt_mask)
    state = model.init_canvas(prompt, canvas_length, generator)
    loop: out = model.denoise_step(state); ...choose tokens...; model.advance(state, tokens, accepted, ...)
    next block: model.extend_prompt(prompt, finished_canvas); state = model.init_canvas(prompt, ...)
The engine's commits are monotone, the real sampler's are not: this runs the real model's forward, not its sampler.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from dllm_constrain.errors import CheckpointError
from dllm_constrain.engine.models.base import BlockDiffusionLM, SpecialTokens, default_position_ids


@dataclass
class GemmaPrompt:
    """The encoded prompts of a batch: the read-only KV cache the canvas decoder attends to.

    `mask` covers every cached slot (True = real token), `next_position` is the position id the first canvas
    token of each row takes, `hidden` the encoder's final states of the last encoded chunk (causal states, not
    canvas predictions).
    """

    cache: object  # transformers Cache (DynamicCache)
    mask: torch.Tensor
    next_position: torch.Tensor
    hidden: torch.Tensor


@dataclass
class GemmaCanvasState:
    """One batch's canvas between denoising steps: what the decoder sees next and what conditions it."""

    prompt: GemmaPrompt
    canvas: torch.Tensor  # [B, C] ids fed to the decoder: accepted tokens, noise elsewhere
    accepted: torch.Tensor  # [B, C] bool: positions taken from the loop's tokens at the last advance
    self_conditioning_logits: torch.Tensor | None  # [B, C, V] or None (zero signal)
    position_ids: torch.Tensor  # [B, C]
    step: int = 0


@dataclass
class DenoiseOutput:
    """Per canvas position: the decoder's final-norm hidden state and its soft-capped float32 logits."""

    hidden: torch.Tensor
    logits: torch.Tensor


class DiffusionGemmaAdapter(nn.Module, BlockDiffusionLM):
    """A loaded `DiffusionGemmaForBlockDiffusion` with the calls our loop makes (see the module docstring)."""

    family = "diffusion_gemma"

    def __init__(self, hf_model: nn.Module, special: SpecialTokens, eos_ids: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.hf = hf_model
        text = hf_model.config.get_text_config()
        self.text_config = text
        self.special = special
        self.eos_ids = tuple(eos_ids) if eos_ids else (special.eos_id,)
        self.vocab_size: int = text.vocab_size
        self.max_sequence_length: int = text.max_position_embeddings
        self.canvas_length: int = hf_model.config.canvas_length
        self.softcap: float | None = text.final_logit_softcapping

    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        special: SpecialTokens,
        eos_ids: tuple[int, ...] | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> "DiffusionGemmaAdapter":
        """Load with transformers (local files only, no remote code); CheckpointError on any tensor problem."""
        from transformers import DiffusionGemmaForBlockDiffusion
        from transformers.utils import logging as hf_logging

        folder = Path(folder).resolve()
        if not (folder / "config.json").is_file():  # else transformers would treat the path as a hub repo id
            raise CheckpointError(f"config.json not found in {folder}")
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the load report is turned into a CheckpointError below
        try:
            hf_model, info = DiffusionGemmaForBlockDiffusion.from_pretrained(
                str(folder), local_files_only=True, trust_remote_code=False, output_loading_info=True,
                ignore_mismatched_sizes=True, dtype=dtype if dtype is not None else "auto",
            )
        except (OSError, ValueError, TypeError) as exc:
            raise CheckpointError(f"DiffusionGemma checkpoint {folder} cannot be loaded: {exc}") from exc
        finally:
            hf_logging.set_verbosity(verbosity)
        problems = []
        if info["missing_keys"]:
            problems.append(f"missing tensors: {', '.join(sorted(info['missing_keys']))}")
        if info["unexpected_keys"]:
            problems.append(f"unexpected tensors: {', '.join(sorted(info['unexpected_keys']))}")
        if info["mismatched_keys"]:
            problems.append("mismatched shapes: " + ", ".join(
                f"{name} (file {tuple(got)}, model {tuple(want)})" for name, got, want in sorted(info["mismatched_keys"])))
        if problems:
            raise CheckpointError(f"DiffusionGemma checkpoint {folder}: " + "; ".join(problems))
        if device is not None:
            hf_model = hf_model.to(device)
        return cls(hf_model.eval(), special, eos_ids)

    # ------------------------------------------------------------------ prompt (encoder, KV cache)
    def encode_prompt(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> GemmaPrompt:
        """Run the encoder once over left-padded prompts [B, P]; the cache is what every step reads."""
        from transformers.cache_utils import DynamicCache

        if prompt_ids.shape[1] == 0:
            raise ValueError("DiffusionGemma needs a non-empty prompt (the canvas attends to its KV cache)")
        if prompt_mask is None:
            prompt_mask = torch.ones_like(prompt_ids, dtype=torch.bool)
        prompt_mask = prompt_mask.bool()
        if position_ids is None:
            position_ids = default_position_ids(prompt_mask)
        cache = DynamicCache(config=self.hf.config.get_text_config(decoder=True))
        out = self.hf.model.encoder(input_ids=prompt_ids, attention_mask=prompt_mask, past_key_values=cache,
                                    position_ids=position_ids)
        return GemmaPrompt(cache=out.past_key_values, mask=prompt_mask, next_position=position_ids[:, -1] + 1,
                           hidden=out.last_hidden_state)

    def extend_prompt(self, prompt: GemmaPrompt, ids: torch.Tensor) -> None:
        """Append real tokens [B, N] (e.g. a finished canvas) to the cache in place, as block diffusion does."""
        n = ids.shape[1]
        positions = prompt.next_position[:, None] + torch.arange(n, device=ids.device)
        mask = torch.cat([prompt.mask, torch.ones_like(ids, dtype=torch.bool)], dim=1)
        out = self.hf.model.encoder(input_ids=ids, attention_mask=mask, past_key_values=prompt.cache,
                                    position_ids=positions)
        prompt.cache = out.past_key_values
        prompt.mask = mask
        prompt.next_position = prompt.next_position + n
        prompt.hidden = out.last_hidden_state

    # ------------------------------------------------------------------ canvas (decoder)
    def noise(self, shape: tuple[int, ...], generator: torch.Generator | None = None,
              device: torch.device | str | None = None) -> torch.Tensor:
        """Uniform-state noise: ids drawn uniformly from the whole vocabulary (as the real sampler does)."""
        device = device if device is not None else self.hf.device
        return torch.randint(0, self.vocab_size, shape, generator=generator, device=device)

    def init_canvas(self, prompt: GemmaPrompt, canvas_length: int | None = None,
                    generator: torch.Generator | None = None) -> GemmaCanvasState:
        """A fresh all-open canvas: noise everywhere, nothing accepted, no self-conditioning signal."""
        c = canvas_length if canvas_length is not None else self.canvas_length
        b = prompt.mask.shape[0]
        device = prompt.mask.device
        positions = prompt.next_position[:, None] + torch.arange(c, device=device)
        return GemmaCanvasState(prompt=prompt, canvas=self.noise((b, c), generator, device),
                                accepted=torch.zeros(b, c, dtype=torch.bool, device=device),
                                self_conditioning_logits=None, position_ids=positions)

    def _decode(self, prompt: GemmaPrompt, canvas: torch.Tensor, position_ids: torch.Tensor,
                self_conditioning_logits: torch.Tensor | None) -> torch.Tensor:
        mask = torch.cat([prompt.mask, torch.ones_like(canvas, dtype=torch.bool)], dim=1)
        out = self.hf.model.decoder(decoder_input_ids=canvas, past_key_values=prompt.cache,
                                    self_conditioning_logits=self_conditioning_logits,
                                    decoder_attention_mask=mask, decoder_position_ids=position_ids)
        return out.last_hidden_state

    def denoise_step(self, state: GemmaCanvasState) -> DenoiseOutput:
        """One decoder pass over the current canvas with the current self-conditioning signal (state unchanged)."""
        hidden = self._decode(state.prompt, state.canvas, state.position_ids, state.self_conditioning_logits)
        return DenoiseOutput(hidden=hidden, logits=self.logits(hidden))

    def advance(
        self,
        state: GemmaCanvasState,
        tokens: torch.Tensor,
        accepted: torch.Tensor | None = None,
        *,
        self_conditioning_logits: torch.Tensor | None,
        generator: torch.Generator | None = None,
    ) -> None:
        """Next canvas: `tokens` where accepted, fresh noise elsewhere (re-noising); store the next SC signal.

        accepted=None reads `tokens` as an engine canvas: positions holding `special.mask_id` are open.
        self_conditioning_logits must be given explicitly (None = zero signal, as on the first step).
        """
        if accepted is None:
            accepted = tokens != self.special.mask_id
        accepted = accepted.bool()
        noise = self.noise(tuple(tokens.shape), generator, tokens.device)
        state.canvas = torch.where(accepted, tokens, noise)
        state.accepted = accepted.clone()
        state.self_conditioning_logits = self_conditioning_logits
        state.step += 1

    # ------------------------------------------------------------------ DiffusionLM contract (one-shot)
    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        *,
        canvas_length: int | None = None,
        self_conditioning_logits: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[B, P + C] ids (canvas = last C columns, given as-is) -> [B, P + C, D].

        Prompt rows are the encoder's causal states, canvas rows the decoder's; only canvas rows are canvas
        predictions. Open canvas positions should hold noise: the model was never trained on a mask token.
        """
        c = canvas_length if canvas_length is not None else self.canvas_length
        if not 0 < c < input_ids.shape[1]:
            raise ValueError(f"canvas_length={c} must be in [1, {input_ids.shape[1] - 1}] (a prompt must precede it)")
        if key_padding_mask is None:
            key_padding_mask = torch.ones_like(input_ids, dtype=torch.bool)
        if not bool(key_padding_mask[:, -c:].all()):
            raise ValueError("the canvas (last canvas_length columns) cannot contain padding")
        if position_ids is None:
            position_ids = default_position_ids(key_padding_mask)
        prompt = self.encode_prompt(input_ids[:, :-c], key_padding_mask[:, :-c], position_ids[:, :-c])
        canvas_hidden = self._decode(prompt, input_ids[:, -c:], position_ids[:, -c:], self_conditioning_logits)
        return torch.cat([prompt.hidden, canvas_hidden], dim=1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head, then float32 soft-capping `cap * tanh(z / cap)`, exactly as the real forward does."""
        z = self.hf.lm_head(hidden).float()
        if self.softcap:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        *,
        canvas_length: int | None = None,
        self_conditioning_logits: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Full [B, P + C, V] logits, one-shot; for tests."""
        return self.logits(self.hidden_states(input_ids, position_ids, key_padding_mask,
                                              canvas_length=canvas_length,
                                              self_conditioning_logits=self_conditioning_logits))
