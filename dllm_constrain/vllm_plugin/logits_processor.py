"""The sampler side: a vLLM v1 custom logits processor that applies the constraint layer's per-position
masks to every request carrying `extra_args["dllm_constrain"]`.

Interface: `vllm.v1.sample.logits_processor.LogitsProcessor` (the V1 model runner's; vLLM's CPU backend
uses that runner, as Model Runner V2 needs Triton's CPU backend). vLLM calls `update_state` with the
batch changes before each forward pass and `apply` with the [num_reqs, vocab] logits of the step;
`output_tok_ids` in a BatchUpdate is a live reference to the request's generated tokens.

Per request the state is a canvas as long as max_tokens whose left part holds the tokens generated so
far; the next position's row of `allowed_tokens` is the mask. Masked logits are set to -inf, so every
sampling mode (greedy, temperature, top-k/p) draws an allowed token.

Off the critical path: the rows of a step depend only on the tokens generated before it, which vLLM's
synchronous scheduler has appended when it calls `update_state`, before the step's forward pass. With the mask
thread on, `update_state` hands the step's rows to one worker thread and `apply` joins it, so on a GPU the rows
are computed while the device runs the forward. `DLLM_CONSTRAIN_VLLM_MASK_THREAD`: "auto" (default: on when the
model runs on CUDA; on a CPU the forward and the rows share the cores and the GIL), "on", "off".
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from ..kernels.bitmask import (allocate_token_bitmask, apply_token_bitmask_inplace, bitmask_bytes, packed_width,
                               set_token)
from .core import CACHE, EXTRA_KEY, RequestConstraint, SpecError, check_spec, logger, spec_digest
from .routing import claim, model_tokenizer_info, register

MASK_THREAD_ENV = "DLLM_CONSTRAIN_VLLM_MASK_THREAD"


def mask_thread_enabled(device: torch.device) -> bool:
    """Whether rows are computed on a worker thread beside the forward (see the module docstring)."""
    value = os.environ.get(MASK_THREAD_ENV, "auto")
    if value not in ("auto", "on", "off"):
        raise ValueError(f'{MASK_THREAD_ENV} must be "auto", "on" or "off", got {value!r}')
    return value == "on" or (value == "auto" and torch.device(device).type == "cuda")


class _Entry:
    __slots__ = ("rc", "output_ids", "digest")

    def __init__(self, rc: RequestConstraint, output_ids: list[int], digest: str):
        self.rc = rc
        self.output_ids = output_ids
        self.digest = digest


class DllmConstrainLogitsProcessor(LogitsProcessor):
    """Applies dllm-constrain's canvas masks to the requests that carry a claimed constraint.

    Enable with `--logits-processors dllm_constrain.vllm_plugin:DllmConstrainLogitsProcessor`; requests
    then send `response_format` json_schema / json_object (or `structured_outputs` regex / choice) as
    usual, and the plugin's admission hook (routing.py) hands them to this processor."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.device = device
        self.vocab_size = self.model_config.get_vocab_size()
        self.entries: dict[int, _Entry] = {}
        self._info = None
        self.max_model_len = self.model_config.max_model_len
        self._mask: torch.Tensor | None = None  # the batch's token bitmask (see _bitmask)
        # scratch for its bits where the native CPU kernel does not apply (apply_token_bitmask_inplace's torch path)
        self._unpacked: torch.Tensor | None = None
        self._batch_size = 0
        self._pool = (ThreadPoolExecutor(1, thread_name_prefix="dllm-constrain-masks")
                      if mask_thread_enabled(device) else None)
        self._pending: tuple[Future, int] | None = None  # a step's rows being filled: (job, rows it fills)

    # --------------------------------------------------------------------------- admission
    @classmethod
    def validate_params(cls, sampling_params) -> None:
        """Runs in the frontend after `SamplingParams.verify`. When the general plugin's verify hook is
        not installed (the plugin is not registered, or VLLM_PLUGINS leaves it out), the claim happens
        here, for models whose verify accepted the structured output (autoregressive ones)."""
        claim(sampling_params)
        spec = (sampling_params.extra_args or {}).get(EXTRA_KEY)
        if spec is not None:
            check_spec(spec)

    def is_argmax_invariant(self) -> bool:
        return False  # masking changes the argmax

    # --------------------------------------------------------------------------- batch state
    def _tokenizer_info(self):
        if self._info is None:
            from vllm.tokenizers import cached_tokenizer_from_config

            tok = cached_tokenizer_from_config(self.model_config)
            self._info = model_tokenizer_info(self.model_config, tok)
        return self._info

    def _new_entry(self, params, prompt_ids, output_ids) -> _Entry | None:
        spec = (getattr(params, "extra_args", None) or {}).get(EXTRA_KEY)
        if spec is None:
            return None
        try:
            check_spec(spec)
        except SpecError:
            logger.warning("dllm_constrain: ignoring a malformed %s entry", EXTRA_KEY)
            return None
        compiled = CACHE.get(self._tokenizer_info(), spec, where="sampler")
        n = params.max_tokens
        if not n:
            n = self.max_model_len - (len(prompt_ids) if prompt_ids is not None else 0)
        rc = RequestConstraint(compiled, n, self.vocab_size)
        digest = spec_digest(spec)
        logger.debug("dllm_constrain: constraining a request by %s %s over %d positions", spec["kind"], digest, n)
        return _Entry(rc, output_ids, digest)

    def update_state(self, batch_update) -> None:
        self._join()  # a job whose step ended without apply(): its rows are stale
        process_dict_updates(self.entries, batch_update, self._new_entry)
        if batch_update is not None:
            self._batch_size = batch_update.batch_size
        if self._pool is not None and self.entries:
            rows = max(self._batch_size, max(self.entries) + 1)
            self._bitmask(rows, self.vocab_size)
            self._pending = (self._pool.submit(self._fill, rows), rows)

    def _join(self) -> bool | None:
        """Wait for the pending job: whether it masked a row (None: no job); its exception is raised here."""
        pending, self._pending = self._pending, None
        return None if pending is None else pending[0].result()

    # --------------------------------------------------------------------------- masking
    def _bitmask(self, rows: int, width: int) -> torch.Tensor:
        """The batch's token bitmask (int32 [rows, ceil(width / 32)], kernels.bitmask's layout), reused across
        steps and grown when the batch is larger than any before."""
        bm = self._mask
        if bm is None or bm.shape[0] < rows or bm.shape[1] != packed_width(width):
            bm = self._mask = allocate_token_bitmask(max(rows, 8), width)
            self._unpacked = torch.empty(bm.numel() * 32, dtype=torch.uint8, device=self.device)
        return bm

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """One bitmask row per constrained request, filled from the layer's cached packed rows (a copy of
        ceil(V / 8) bytes each), then the batch's logits masked in place in one call (on the CPU the native
        kernel: one pass, no bool [rows, V] temporaries)."""
        n, width = logits.shape
        pending = self._pending
        if pending is not None and pending[1] >= n and width == self.vocab_size:
            masked = self._join()  # the rows were filled beside the forward
        else:
            self._join()
            if not self.entries:
                return logits
            self._bitmask(n, width)
            masked = self._fill(n)
        if masked:
            apply_token_bitmask_inplace(logits, self._mask[:n], float("-inf"), self._unpacked)
        return logits

    def _fill(self, n: int) -> bool:
        """Rows 0..n-1 of the batch's bitmask: each constrained request's next mask row, every token elsewhere.
        Whether some row is masked."""
        rows = bitmask_bytes(self._mask)
        rows[:n] = 0xFF  # requests without a constraint: everything allowed
        masked = False
        for index, entry in self.entries.items():  # update_state joins this job before it changes entries
            if index >= n:
                continue
            out = entry.output_ids
            if out and out[-1] < 0:
                continue  # placeholder of an in-flight async step: the real ids are not known yet
            dst = rows[index]
            nonempty = entry.rc.fill_row(out, dst)
            if nonempty is None:
                continue
            masked = True
            if not nonempty:
                # cannot happen for a completable canvas; keep the request going with EOS
                logger.warning("dllm_constrain: empty mask for a %s request; forcing EOS", entry.digest)
                set_token(dst, entry.rc.compiled.eos_id)
        return masked


# Loaded by --logits-processors in the frontend (for validate_params) and in the worker: install the
# admission hook here too, so later requests are claimed before vLLM's own checks even when the
# general plugin entry point is not registered.
register()
