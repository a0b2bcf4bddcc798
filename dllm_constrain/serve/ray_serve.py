"""Replicas of the OpenAI-compatible server on Ray Serve, behind one endpoint (`python -m dllm_constrain.serve.ray`).

A dLLM engine runs one continuous batch per process; past what one device gives, the way out is more engines.
Each Ray Serve replica is the same server `python -m dllm_constrain.serve` runs (`build_server_app`: its own
checkpoint load, engine, engine loop and constraint compile cache), and Ray's HTTP proxy spreads requests over the
replicas (it sends each to the less loaded of two, by requests in flight) and scales their number between bounds
when autoscaling is asked for. Nothing is shared between replicas, so a replica that dies takes only its own
requests with it.

The route is Ray Serve's public ingress API: `@serve.deployment` around a class decorated with `@serve.ingress()`
and no app, whose `__serve_build_asgi_app__` hands Ray our FastAPI app once the replica's engine is loaded (the app
must be built per replica, around that replica's engine). Ray runs the app's lifespan: the backend starts with the
replica and closes when Ray stops it, after Ray has let in-flight requests finish (`graceful_shutdown_timeout_s`).
`check_health` is the backend's (`EngineBackend.check_health`): a replica that stopped serving, or whose engine
made no step for `stall_timeout` seconds with requests in it, is replaced by Ray. Streaming responses pass through
the proxy chunk by chunk. A request whose replica dies gets an OpenAI error from the proxy (ray_proxy.py).
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

from ray import serve

from dllm_constrain.serve import ray_proxy

APP_NAME = "dllm-constrain"


@dataclass(frozen=True)
class ReplicaPolicy:
    """How many replicas, what each one reserves, and how Ray watches and stops them (Ray's deployment options).

    replicas: a fixed count; with `max_replicas` set, Ray autoscales between `min_replicas` and `max_replicas`,
    aiming at `target_ongoing_requests` requests in flight per replica (Ray's `autoscaling_config`).
    max_ongoing_requests: requests Ray hands one replica at once; beyond them requests wait at Ray's router for
    the first replica with room, which keeps replicas evenly loaded (default: twice the engine's batch, so a
    replica's next batch is already queued when one request leaves).
    max_queued_requests: requests that may wait at the router (-1: no bound); more get HTTP 503 from Ray.
    stall_timeout: seconds without an engine step, with requests in the engine, after which the health check
    fails and Ray replaces the replica."""

    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None
    upscale_delay_s: float | None = None
    downscale_delay_s: float | None = None
    max_ongoing_requests: int | None = None
    max_queued_requests: int = -1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 30.0
    graceful_shutdown_timeout_s: float | None = None  # None: the server's --shutdown-timeout
    stall_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be >= 1")
        if self.max_replicas is not None and self.max_replicas < max(1, self.min_replicas or 0):
            raise ValueError("max_replicas must be >= 1 and >= min_replicas")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError("num_cpus and num_gpus must be >= 0")
        if self.stall_timeout <= 0:
            raise ValueError("stall_timeout must be > 0")

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None

    def autoscaling_config(self) -> dict[str, Any]:
        """Ray's autoscaling_config: the bounds, and only the knobs given (Ray's defaults for the others)."""
        config: dict[str, Any] = {"min_replicas": self.min_replicas if self.min_replicas is not None else 1,
                                  "max_replicas": self.max_replicas,
                                  "initial_replicas": max(self.replicas, self.min_replicas or 1)}
        for name in ("target_ongoing_requests", "upscale_delay_s", "downscale_delay_s"):
            if getattr(self, name) is not None:
                config[name] = getattr(self, name)
        return config

    def deployment_options(self, server_args: argparse.Namespace) -> dict[str, Any]:
        """Keyword arguments of `serve.deployment(...).options(...)` for these replicas of that server."""
        options: dict[str, Any] = {
            "max_ongoing_requests": self.max_ongoing_requests or 2 * server_args.max_batch_size,
            "max_queued_requests": self.max_queued_requests,
            "ray_actor_options": {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus},
            "health_check_period_s": self.health_check_period_s,
            "health_check_timeout_s": self.health_check_timeout_s,
            "graceful_shutdown_timeout_s": (self.graceful_shutdown_timeout_s
                                            if self.graceful_shutdown_timeout_s is not None
                                            else server_args.shutdown_timeout),
        }
        if self.autoscaling:
            options["autoscaling_config"] = self.autoscaling_config()
        else:
            options["num_replicas"] = self.replicas
        return options


@serve.ingress()
class DllmConstrainServer:
    """One replica: the server of `python -m dllm_constrain.serve` for `server_args` (that command's parsed
    options), built around an engine of its own."""

    def __init__(self, server_args: argparse.Namespace, stall_timeout: float) -> None:
        import logging

        from dllm_constrain.serve.__main__ import build_server_app

        logging.getLogger("dllm_constrain").setLevel(server_args.log_level.upper())
        self.stall_timeout = stall_timeout
        built = build_server_app(server_args)
        self.server_app, self.backend = built.app, built.backend

    async def __serve_build_asgi_app__(self) -> Any:
        return self.server_app

    def check_health(self) -> None:
        """Ray calls this every health_check_period_s; raising marks the replica unhealthy (Ray replaces it)."""
        self.backend.check_health(self.stall_timeout)


def build_application(server_args: argparse.Namespace, policy: ReplicaPolicy) -> Any:
    """The Ray Serve application (`serve.run` takes it): `policy.replicas` replicas of the server."""
    deployment = serve.deployment(DllmConstrainServer, name="DllmConstrainServer")
    return deployment.options(**policy.deployment_options(server_args)).bind(server_args, policy.stall_timeout)


@dataclass
class RayServeRunner:
    """Starts the replicas behind Ray's HTTP proxy on `host:port` and stops them (`with` block, or start/stop).

    ray_address: None starts a local Ray instance for this process (stopped with it); "auto" or an address joins a
    running cluster (whose nodes then host the replicas). ray_init: further `ray.init` keywords (e.g. num_cpus)."""

    server_args: argparse.Namespace
    policy: ReplicaPolicy = field(default_factory=ReplicaPolicy)
    ray_address: str | None = None
    ray_init: dict[str, Any] = field(default_factory=dict)
    _started_ray: bool = False

    @property
    def url(self) -> str:
        return f"http://{self.server_args.host}:{self.server_args.port}/v1"

    def start(self) -> None:
        """Start Ray (or join it), the proxy and the replicas; returns once every replica is up (raises
        RuntimeError with Ray's message when they cannot start, e.g. a bad checkpoint)."""
        import ray

        if not ray.is_initialized():
            if self.ray_address in (None, "local"):  # a Ray instance of ours: its proxy reads this environment
                os.environ.setdefault(ray_proxy.CALLBACK_ENV, ray_proxy.CALLBACK_PATH)
            # "local", not None: None would join a cluster `ray start` left on this machine
            ray.init(address=self.ray_address or "local", **({"include_dashboard": False} | self.ray_init))
            self._started_ray = True
        serve.start(http_options={"host": self.server_args.host, "port": self.server_args.port})
        app = build_application(self.server_args, self.policy)
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)

    def stop(self) -> None:
        """Delete the replicas (each lets its in-flight requests finish, up to graceful_shutdown_timeout_s, and
        closes its engine), stop the proxy, and the Ray instance if this runner started it."""
        import ray

        if ray.is_initialized():
            serve.shutdown()
            if self._started_ray:
                ray.shutdown()
                self._started_ray = False

    def __enter__(self) -> "RayServeRunner":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

