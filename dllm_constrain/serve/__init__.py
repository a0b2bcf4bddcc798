"""An OpenAI-compatible HTTP server for dllm-constrain (`python -m dllm_constrain.serve`; needs fastapi and uvicorn).

Modules: protocol (OpenAI request/response bodies and their mapping to generation options), backend (the
`Backend` interface and `EngineBackend`, requests straight onto the LLM's engine loop, whose scheduler admits
them), streaming (the final text of a canvas), constraint_fields (choice and json_object as constraints, shared with the vLLM plugin),
chat (messages -> prompt), errors (typed errors -> HTTP statuses and OpenAI error bodies), app (the routes,
`build_app`), __main__ (the command line). See docs/serving.md. Replicas on Ray Serve (`python -m
dllm_constrain.serve.ray`, the [ray] extra): ray_serve (the deployment and its runner), ray_cli (that command
line), ray_proxy (OpenAI errors from Ray's proxy for a replica lost); docs/scale-out.md.
"""
from __future__ import annotations

from dllm_constrain.serve.backend import (
    Backend,
    Completion,
    EngineBackend,
    GenerationRequest,
    RequestHandle,
)

__all__ = ["Backend", "Completion", "EngineBackend", "GenerationRequest", "RequestHandle",
           "build_app"]


def __getattr__(name: str):  # build_app needs fastapi; the backend alone does not
    if name == "build_app":
        from dllm_constrain.serve.app import build_app

        return build_app
    raise AttributeError(name)
