"""python -m dllm_constrain.serve [--model PATH] [--host H] [--port P] [--device D] [--dtype T] [--max-queue N]
[--request-timeout S] [--max-queue-time S] [--max-batch-size B] [--max-body-bytes N] [--shutdown-timeout S]
[--grammar-dir DIR] [--compile-cache-memory SIZE] [--kv-cache-memory SIZE] [--served-model-name NAME]: an
OpenAI-compatible server (docs/serving.md)."""
from __future__ import annotations

import argparse
import gc
import logging
import sys
from pathlib import Path
from typing import Any, NamedTuple

from dllm_constrain.serve.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_QUEUE_TIME, DEFAULT_SHUTDOWN_TIMEOUT


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dllm_constrain.serve",
                                description="OpenAI-compatible HTTP server for structured output from a dLLM.")
    p.add_argument("--model", default=None, help="checkpoint folder (default: the bundled model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default=None, help="torch device for the model, e.g. cpu or cuda:0 (default: cuda "
                                                  "when available, else cpu)")
    p.add_argument("--dtype", default=None, help="weights dtype: bfloat16, float16 or float32 (default: the stored "
                                                 "dtype; bfloat16 for a float32 checkpoint on a GPU that supports it)")
    p.add_argument("--max-queue", type=int, default=64, help="requests that may wait for the engine; more get 429")
    p.add_argument("--max-batch-size", type=int, default=8,
                   help="requests in the engine's continuous batch at once: the engine scheduler's max_num_seqs, "
                        "the one admission limit (the others wait in its queue)")
    p.add_argument("--request-timeout", type=float, default=None,
                   help="seconds a request may take from arrival, queueing included (504 past it; default: none)")
    p.add_argument("--max-queue-time", type=float, default=DEFAULT_MAX_QUEUE_TIME,
                   help="seconds a request may wait for the engine; past it 503 with Retry-After "
                        f"(default {DEFAULT_MAX_QUEUE_TIME:g}; 0: no bound)")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help=f"largest request body; larger ones get 413 (default {DEFAULT_MAX_BODY_BYTES})")
    p.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT,
                   help="seconds from SIGTERM to exit: new requests get 503 at once, running ones are stopped "
                        f"after 3/4 of it (default {DEFAULT_SHUTDOWN_TIMEOUT:g})")
    p.add_argument("--grammar-dir", type=Path, default=None,
                   help="a directory of .lark grammars requests may name (by file name, inside it only); "
                        "default: shipped grammars and grammar text only")
    p.add_argument("--compile-cache-memory", default=None,
                   help="memory budget of the compiled-constraint cache, e.g. 512MB or 2GiB (default: 256 MiB); "
                        "least recently used constraints are dropped past it")
    p.add_argument("--kv-cache-memory", default=None,
                   help="bytes of KV cache the engine may hold, e.g. 4GiB or 512MiB; bounds the running requests' KV "
                        "memory at admission (default: no bound)")
    p.add_argument("--served-model-name", default=None, help="model id in /v1/models and responses")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    if args.max_queue < 1 or args.max_batch_size < 1:
        p.error("--max-queue and --max-batch-size must be >= 1")
    if args.request_timeout is not None and args.request_timeout <= 0:
        p.error("--request-timeout must be > 0")
    if args.max_queue_time < 0 or args.max_body_bytes < 1 or args.shutdown_timeout <= 0:
        p.error("--max-queue-time must be >= 0, --max-body-bytes >= 1 and --shutdown-timeout > 0")
    if args.grammar_dir is not None and not args.grammar_dir.is_dir():
        p.error(f"--grammar-dir {args.grammar_dir} is not a directory")
    for name in ("compile_cache_memory", "kv_cache_memory"):
        if getattr(args, name) is not None:
            from dllm_constrain.constraints.byte_lru import parse_bytes
            from dllm_constrain.errors import InvalidRequestError

            try:
                setattr(args, name, parse_bytes(getattr(args, name), "--" + name.replace("_", "-")))
            except InvalidRequestError as exc:
                p.error(str(exc))
    return args


class ServerApp(NamedTuple):
    """What `build_server_app` builds: the routes, the engine's backend, the drain flag the shutdown sets."""

    app: Any
    backend: Any
    drain: Any


def build_server_app(args: argparse.Namespace) -> ServerApp:
    """The app `main` serves for a parsed command line: the checkpoint loaded, its engine behind an EngineBackend,
    the routes over it with the command's limits. Each Ray Serve replica builds its own with this
    (serve/ray_serve.py), so both commands take the same options. Raises DllmConstrainError for a bad --device /
    --dtype or checkpoint."""
    from dllm_constrain import LLM
    from dllm_constrain.serve.admission import Drain
    from dllm_constrain.serve.app import build_app
    from dllm_constrain.serve.backend import EngineBackend
    from dllm_constrain.serve.chat import ChatFormatter
    from dllm_constrain.serve.grammar_access import GrammarAccess
    from dllm_constrain.serve.limits import ServeLimits, prompt_char_bound

    llm = LLM(args.model, device=args.device, dtype=args.dtype, compile_cache_memory=args.compile_cache_memory,
              max_num_seqs=args.max_batch_size, kv_cache_memory=args.kv_cache_memory)
    backend = EngineBackend(llm, model_id=args.served_model_name, max_queue=args.max_queue)
    limits = ServeLimits(max_body_bytes=args.max_body_bytes, max_prompt_chars=prompt_char_bound(llm),
                         max_queue_time=args.max_queue_time or None)
    drain = Drain()
    app = build_app(backend, chat=ChatFormatter.for_llm(llm), request_timeout=args.request_timeout, limits=limits,
                    grammars=GrammarAccess(args.grammar_dir), drain=drain)
    # The model, tokenizer and torch's own objects live as long as the server: moved out of the collector's
    # reach, a full collection no longer walks them (0.15-0.3 s with torch loaded, which would land inside
    # whatever constraint call runs then and eat its per-call time limit; docs/constraints.md, "Time bounds").
    gc.collect()
    gc.freeze()
    return ServerApp(app, backend, drain)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import dllm_constrain.serve.app  # noqa: F401 - fastapi, before the model loads
        from dllm_constrain.serve.shutdown import ShutdownPlan, make_server
    except ImportError as exc:
        print(f"the server needs fastapi and uvicorn ({exc}); pip install fastapi uvicorn", file=sys.stderr)
        return 2
    from dllm_constrain.errors import DllmConstrainError

    logging.basicConfig(level=args.log_level.upper())
    try:
        built = build_server_app(args)
    except DllmConstrainError as exc:  # a bad --device / --dtype or checkpoint: one line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server = make_server(built.app, backend=built.backend, drain=built.drain,
                         plan=ShutdownPlan(args.shutdown_timeout), host=args.host, port=args.port,
                         log_level=args.log_level)
    server.run()
    return 0

if __name__ == "__main__":
    sys.exit(main())
