"""The command line of `python -m dllm_constrain.serve.ray`: Ray's options here, the server's own options (every
option of `python -m dllm_constrain.serve`: --model, --host, --port, --max-batch-size, ...) parsed by that
command's parser, so the two commands never drift apart."""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

PROG = "python -m dllm_constrain.serve.ray"


def ray_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, add_help=False,
                                description="N replicas of the OpenAI-compatible server behind one endpoint (Ray "
                                            "Serve); every option of `python -m dllm_constrain.serve` applies to "
                                            "each replica.")
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("--replicas", type=int, default=1, help="replicas (fixed count; the initial count when "
                                                           "autoscaling)")
    p.add_argument("--min-replicas", type=int, default=None, help="autoscaling lower bound (default 1)")
    p.add_argument("--max-replicas", type=int, default=None, help="autoscaling upper bound: setting it turns "
                                                                  "Ray's autoscaling on")
    p.add_argument("--target-ongoing-requests", type=float, default=None,
                   help="autoscaling target: requests in flight per replica (Ray's default when unset)")
    p.add_argument("--upscale-delay-s", type=float, default=None)
    p.add_argument("--downscale-delay-s", type=float, default=None)
    p.add_argument("--max-ongoing-requests", type=int, default=None,
                   help="requests Ray hands one replica at once (default: 2 x --max-batch-size)")
    p.add_argument("--max-queued-requests", type=int, default=-1,
                   help="requests that may wait at Ray's router (-1: unbounded); more get HTTP 503")
    p.add_argument("--num-cpus-per-replica", type=float, default=1.0)
    p.add_argument("--num-gpus-per-replica", type=float, default=0.0, help="1 to give each replica a GPU of its own")
    p.add_argument("--health-check-period-s", type=float, default=10.0)
    p.add_argument("--health-check-timeout-s", type=float, default=30.0)
    p.add_argument("--graceful-shutdown-timeout-s", type=float, default=None,
                   help="seconds a stopping replica lets its in-flight requests finish (default: the server's "
                        "--shutdown-timeout)")
    p.add_argument("--stall-timeout", type=float, default=120.0,
                   help="seconds without an engine step (with requests in it) before a replica counts as "
                        "unhealthy and Ray replaces it")
    p.add_argument("--ray-address", default=None,
                   help="join a running Ray cluster ('auto' or host:port; default: start one for this command)")
    p.add_argument("--ray-num-cpus", type=float, default=None,
                   help="CPUs of the Ray instance this command starts (default: the machine's)")
    return p


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Any, dict[str, Any]]:
    """(server options, ReplicaPolicy, ray.init keywords) for a command line."""
    from dllm_constrain.serve.__main__ import parse_args as parse_server_args

    parser = ray_parser()
    ray_args, rest = parser.parse_known_args(argv)
    if ray_args.help:
        parser.print_help()
        print("\nserver options (each replica's):\n")
        parse_server_args(["--help"])  # prints the server's options and exits
    server_args = parse_server_args(rest)
    from dllm_constrain.serve.ray_serve import ReplicaPolicy

    try:
        policy = ReplicaPolicy(
            replicas=ray_args.replicas, min_replicas=ray_args.min_replicas, max_replicas=ray_args.max_replicas,
            target_ongoing_requests=ray_args.target_ongoing_requests, upscale_delay_s=ray_args.upscale_delay_s,
            downscale_delay_s=ray_args.downscale_delay_s, max_ongoing_requests=ray_args.max_ongoing_requests,
            max_queued_requests=ray_args.max_queued_requests, num_cpus=ray_args.num_cpus_per_replica,
            num_gpus=ray_args.num_gpus_per_replica, health_check_period_s=ray_args.health_check_period_s,
            health_check_timeout_s=ray_args.health_check_timeout_s,
            graceful_shutdown_timeout_s=ray_args.graceful_shutdown_timeout_s, stall_timeout=ray_args.stall_timeout)
    except ValueError as exc:
        parser.error(str(exc))
    ray_init: dict[str, Any] = {"address": ray_args.ray_address}
    if ray_args.ray_num_cpus is not None:
        ray_init["num_cpus"] = ray_args.ray_num_cpus
    return server_args, policy, ray_init


def main(argv: list[str] | None = None) -> int:
    server_args, policy, ray_init = parse_args(argv)
    try:
        from dllm_constrain.serve.ray_serve import RayServeRunner
    except ImportError as exc:
        print(f"replicas need Ray Serve ({exc}); pip install 'dllm-constrain[ray]'", file=sys.stderr)
        return 2
    logging.basicConfig(level=server_args.log_level.upper())
    stop = threading.Event()
    address = ray_init.pop("address")
    runner = RayServeRunner(server_args, policy, ray_address=address, ray_init=ray_init)
    try:
        runner.start()
        # after ray.init, which installs a SIGTERM handler of its own that aborts the process
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        print(f"serving {policy.replicas if not policy.autoscaling else 'autoscaled'} replica(s) at {runner.url}",
              flush=True)
        while not stop.wait(1.0):  # woken by SIGINT / SIGTERM
            pass
    finally:
        runner.stop()  # each replica drains its in-flight requests, then closes its engine
    return 0
