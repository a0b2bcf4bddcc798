"""One engine in a subprocess, one schema at a time, so a schema that hangs or blows up memory costs only
that schema: the parent (`WorkerProcess`) kills the process group at the time / memory limit and starts a
fresh worker for the next schema.

Protocol: JSON lines. The worker writes on a private copy of its stdout (fd 1 itself is pointed at stderr,
so libraries printing to stdout cannot corrupt the stream):
    {"type": "ready", "version", "vocab_size", "eos_id", "setup_s"}
    per task: {"type": "compiled", "compile_s"}, {"type": "walked", "result": <result so far>},
              then {"type": "result", ...} (the same with "gen" when the task asked for generation)
A task: {"id", "schema", "instances": [{"valid", "data" | "text"}], "generate": bool, "prompt": str}
("text": a spelling that no Python value has, e.g. an object with a repeated name).
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

_OUT = None
REJECTED = ("mask_rejects", "advance_rejects", "eos_not_allowed")


def _send(obj: dict[str, Any]) -> None:
    _OUT.write(json.dumps(obj) + "\n")
    _OUT.flush()


def walk(adapter, compiled, ids: list[int], max_tokens: int) -> dict[str, Any]:
    """Left-to-right walk: before each token the full mask is computed (timed) and must allow the token,
    then the token is consumed; after the last token the mask must allow EOS."""
    pc = time.perf_counter_ns
    w: dict[str, Any] = {"n_tokens": len(ids)}
    truncated = len(ids) > max_tokens
    toks = ids[:max_tokens]
    mask_ns: list[int] = []
    status = "accepted"
    try:
        m = adapter.new_matcher(compiled)
        for i, tid in enumerate(toks):
            a = pc()
            m.fill_mask()
            mask_ns.append(pc() - a)
            if not m.is_allowed(tid):
                status, w["fail_at"] = "mask_rejects", i
                break
            if not m.advance(tid):
                status, w["fail_at"] = "advance_rejects", i
                break
        if status == "accepted":
            if truncated:
                status = "truncated"
            else:
                a = pc()
                m.fill_mask()
                mask_ns.append(pc() - a)
                if not m.is_allowed(adapter.eos_id):
                    status, w["fail_at"] = "eos_not_allowed", len(toks)
    except Exception as e:
        status = "walk_error"
        w["error"] = f"{type(e).__name__}: {e}"[:300]
    w["status"] = status
    w["mask_us"] = [round(x / 1e3, 1) for x in mask_ns]
    return w


def _single_thread_torch() -> None:
    import torch

    torch.set_num_threads(1)


class _Gen:
    """Generation with a checkpoint under the schema (loaded on first use)."""

    def __init__(self, model: str | None, params: dict[str, Any]):
        self.model_path = model
        self.params = params
        self.llm = None

    def run(self, schema: Any, prompt: str) -> dict[str, Any]:
        from dllm_constrain.api import LLM

        from .reference import is_valid, reference_validator

        if self.llm is None:
            _single_thread_torch()
            self.llm = LLM(self.model_path)
        g: dict[str, Any] = {}
        t0 = time.perf_counter()
        try:
            [res] = self.llm.generate([prompt], schema=schema, **self.params)
        except Exception as e:
            g["error_kind"] = type(e).__name__
            g["error"] = str(e)[:300]
            g["wall_s"] = time.perf_counter() - t0
            return g
        g.update(text=res.text[:4000], nfe=res.nfe, remasks=res.remasks, forced=res.forced_tokens,
                 n_tokens=len(res.token_ids), wall_s=res.wall_time, finish_reason=res.finish_reason,
                 backtracks=res.backtracks)
        dup: list[str] = []

        def pairs_hook(pairs):
            keys = [k for k, _ in pairs]
            if len(set(keys)) < len(keys):
                dup.extend(sorted({k for k in keys if keys.count(k) > 1}))
            return dict(pairs)

        try:
            value = json.loads(res.text, object_pairs_hook=pairs_hook)
            g["json_ok"] = True
        except ValueError:
            g["json_ok"] = False
            g["schema_valid"] = False
            return g
        # an object with a repeated name is not a valid answer, whatever json.loads keeps of it
        g["duplicate_keys"] = dup[:20]
        g["schema_valid"] = is_valid(reference_validator(schema), value) and not dup
        return g


def _exit_with_parent() -> None:
    """A worker never outlives its parent (e.g. the run was killed while a schema hangs in compilation)."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def worker_main(argv: list[str] | None = None) -> None:
    global _OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--tokdir", required=True)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--max-tokens", type=int, default=10000)
    ap.add_argument("--model", default=None)
    ap.add_argument("--gen-params", default="{}")
    args = ap.parse_args(argv)

    _OUT = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    _exit_with_parent()
    from .engines import make_adapter
    from .reference import compact_json  # noqa: F401  (imported before "ready": the compile clock starts after)
    from .tok import load_encoder

    t0 = time.perf_counter()
    try:
        ad = make_adapter(args.engine, args.tokdir, args.timeout)
        encode = load_encoder(args.tokdir)
    except Exception as e:
        _send({"type": "fatal", "error": f"{type(e).__name__}: {e}"[:2000]})
        return
    _send({"type": "ready", "setup_s": time.perf_counter() - t0, "version": ad.version,
           "vocab_size": ad.vocab_size, "eos_id": ad.eos_id})
    gen = _Gen(args.model, json.loads(args.gen_params))
    for line in sys.stdin:
        _send(process_task(ad, encode, gen, json.loads(line), args.max_tokens, _send))


def process_task(ad, encode, gen: "_Gen", task: dict[str, Any], max_tokens: int, send) -> dict[str, Any]:
    """Compile, walk every instance, generate: the final result (progress messages go through `send`)."""
    from .reference import compact_json

    extra = getattr(ad, "extra_checks", None)
    res: dict[str, Any] = {"type": "result"}
    a = time.perf_counter()
    try:
        compiled = ad.compile(task["schema"])
        res["compile_ok"] = True
    except Exception as e:
        compiled = None
        res["compile_ok"] = False
        res["error_kind"], kw = ad.error_kind(e)
        if kw:
            res["error_keyword"] = kw
        res["error"] = str(e)[:400]
    res["compile_s"] = time.perf_counter() - a
    send({"type": "compiled", "compile_s": res["compile_s"]})
    walks = []
    if compiled is not None:
        for inst in task["instances"]:
            try:
                text = inst["text"] if "text" in inst else compact_json(inst["data"])
            except ValueError:
                walks.append({"status": "unencodable", "n_tokens": 0, "mask_us": []})
                continue
            ids = encode(text)
            w = walk(ad, compiled, ids, max_tokens)
            if extra is not None and w["status"] != "walk_error":
                try:
                    w.update(extra(compiled, text, ids, w["status"] == "accepted"))
                except Exception as e:  # pragma: no cover
                    w["extra_error"] = f"{type(e).__name__}: {e}"[:200]
            alt = inst.get("data_schema_order")
            if alt is not None and w["status"] in REJECTED:
                w2 = walk(ad, compiled, encode(compact_json(alt)), max_tokens)
                w["status_schema_order"] = w2["status"]
            walks.append(w)
    res["walks"] = walks
    send({"type": "walked", "result": res})
    if task.get("generate") and compiled is not None:
        res["gen"] = gen.run(task["schema"], task.get("prompt", ""))
    return res


class InProcessWorker:
    """The same interface as WorkerProcess, in this process: no time or memory limit beyond the compiler's
    own deadline (for debugging, and for small trusted runs such as the test fixtures)."""

    restarts = 0  # nothing is killed in process, so nothing restarts

    def __init__(self, engine: str, tokdir: str, timeout: float, max_tokens: int = 10000, model: str | None = None,
                 gen_params: dict | None = None, **_: Any):
        self.engine, self.tokdir, self.timeout, self.max_tokens = engine, str(tokdir), timeout, max_tokens
        self.gen = _Gen(model, gen_params or {})
        self.ad = None

    def start(self) -> dict[str, Any]:
        from .engines import make_adapter
        from .tok import load_encoder

        t0 = time.perf_counter()
        try:
            self.ad = make_adapter(self.engine, self.tokdir, self.timeout)
            self.encode = load_encoder(self.tokdir)
        except Exception as e:
            raise WorkerError(f"engine {self.engine} did not start: {type(e).__name__}: {e}") from None
        return {"type": "ready", "setup_s": time.perf_counter() - t0, "version": self.ad.version,
                "vocab_size": self.ad.vocab_size, "eos_id": self.ad.eos_id}

    def run(self, task: dict[str, Any]) -> dict[str, Any]:
        if self.ad is None:
            self.start()
        return process_task(self.ad, self.encode, self.gen, task, self.max_tokens, lambda msg: None)

    def close(self) -> None:
        self.ad = None


# ------------------------------------------------------------------------------------------------ parent
class WorkerError(RuntimeError):
    pass


class WorkerProcess:
    """Parent-side handle: run(task) -> result dict, or {"outcome": "timeout" | "oom" | "crash", "phase"}.

    Time limits per schema: compilation `timeout` (the compiler's own deadline for ours, a kill for every
    engine), then the walks of all its instances `timeout` more, then generation `gen_timeout`."""

    COMPILE_GRACE_S = 2.0
    COMPILE_GRACE_FRAC = 0.1  # deadlines are checked between steps: they overshoot a little, more on a loaded machine

    def __init__(self, engine: str, tokdir: str, timeout: float, max_tokens: int = 10000,
                 mem_limit_gb: float = 6.0, model: str | None = None, gen_params: dict | None = None,
                 gen_timeout: float = 600.0, start_timeout: float = 180.0):
        self.engine, self.tokdir = engine, str(tokdir)
        self.timeout, self.max_tokens, self.mem_limit_gb = timeout, max_tokens, mem_limit_gb
        self.model, self.gen_params, self.gen_timeout = model, gen_params or {}, gen_timeout
        self.start_timeout = start_timeout
        self.p: subprocess.Popen | None = None
        self.info: dict[str, Any] | None = None
        self.buf = b""
        self.restarts = 0

    def start(self) -> dict[str, Any]:
        from .engines import thread_env

        cmd = [sys.executable, "-m", "dllm_constrain.evals.worker", "--engine", self.engine, "--tokdir", self.tokdir,
               "--timeout", str(self.timeout), "--max-tokens", str(self.max_tokens),
               "--gen-params", json.dumps(self.gen_params)]
        if self.model:
            cmd += ["--model", self.model]
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  env=thread_env(1), start_new_session=True)
        self.buf = b""
        try:
            msg = self._read(self.start_timeout)
        except (TimeoutError, MemoryError) as e:
            self.kill()
            raise WorkerError(f"engine {self.engine} did not start: {type(e).__name__}") from None
        if msg is None or msg.get("type") != "ready":
            self.kill()
            raise WorkerError(f"engine {self.engine} did not start: {(msg or {}).get('error', 'no answer')}")
        self.info = msg
        return msg

    def kill(self) -> None:
        if self.p is not None and self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait()
        if self.p is not None:
            for f in (self.p.stdin, self.p.stdout):
                try:
                    f.close()
                except Exception:
                    pass
        self.p = None

    close = kill

    def _rss_gb(self) -> float:
        try:
            with open(f"/proc/{self.p.pid}/status") as f:
                for ln in f:
                    if ln.startswith("VmRSS:"):
                        return int(ln.split()[1]) / 1e6
        except (OSError, AttributeError):
            pass
        return 0.0

    def _read(self, timeout: float) -> dict[str, Any] | None:
        end = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line, self.buf = self.buf[:nl], self.buf[nl + 1:]
                return json.loads(line)
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError
            r, _, _ = select.select([fd], [], [], min(left, 0.25))
            if r:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return None
                self.buf += chunk
            elif self._rss_gb() > self.mem_limit_gb:
                raise MemoryError

    def run(self, task: dict[str, Any]) -> dict[str, Any]:
        if self.p is None or self.p.poll() is not None:
            self.restarts += self.info is not None
            try:
                self.start()
            except WorkerError:  # one more try (a loaded machine can be slow to start a process)
                self.start()
        t0 = time.monotonic()
        phase, compile_s, t_gen, t_walk, walked = "compile", None, t0, t0, {}
        try:
            self.p.stdin.write((json.dumps(task) + "\n").encode())
            self.p.stdin.flush()
            while True:
                if phase == "generate":
                    limit = self.gen_timeout - (time.monotonic() - t_gen)
                elif phase == "walk":
                    limit = self.timeout - (time.monotonic() - t_walk)
                else:  # the compiler's own deadline is `timeout`; some grace for its typed error to arrive
                    limit = self.timeout * (1 + self.COMPILE_GRACE_FRAC) + self.COMPILE_GRACE_S - (time.monotonic() - t0)
                msg = self._read(max(0.05, limit))
                if msg is None:
                    return self._failed("crash", phase, compile_s, walked)
                if msg["type"] == "compiled":
                    compile_s, phase, t_walk = msg["compile_s"], "walk", time.monotonic()
                elif msg["type"] == "walked":
                    phase, t_gen, walked = "generate", time.monotonic(), msg["result"]
                else:
                    return msg
        except TimeoutError:
            return self._failed("timeout", phase, compile_s, walked)
        except MemoryError:
            return self._failed("oom", phase, compile_s, walked)
        except (BrokenPipeError, OSError, ValueError):
            return self._failed("crash", phase, compile_s, walked)

    def _failed(self, outcome: str, phase: str, compile_s: float | None, walked: dict[str, Any]) -> dict[str, Any]:
        self.kill()
        if phase == "generate":  # the walks are done: keep them, only the generation failed
            limit = f" (limit {self.gen_timeout:g} s)" if outcome == "timeout" else ""
            walked["gen"] = {"error_kind": outcome.capitalize(), "error": f"generation: {outcome}{limit}"}
            return walked
        return {"outcome": outcome, "phase": phase, "compile_s": compile_s}

if __name__ == "__main__":
    worker_main()
