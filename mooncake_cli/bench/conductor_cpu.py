"""The conductor's own CPU time per request, in front of workers on each engine.

For each engine, a cluster of processes (role_procs.py): a store master, P prefill and D decode
workers, and the conductor in a process of its own. After two warm-up requests, the
conductor's CPU time (user + system, /proc/<pid>/stat) is read over `idle_s` seconds without
requests (what it spends on probes and its own loops), then before and after `requests`
streamed completions of distinct prompts sent `concurrency` at a time through its OpenAI API.
Per request: the CPU seconds in between over the requests, and the same less the idle rate
over the wall time of the requests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from mooncake_cli.bench.role_procs import RoleProcs, RoleSpec
from mooncake_cli.bench.trace_live import ReplayConfig, replay
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.sim.trace import TRACE_BLOCK_TOKENS, TraceRequest

BLOCK = 16  # synthesised tokens per hash id


@dataclass(frozen=True)
class CpuSpec:
    roles: RoleSpec
    prefill: int = 1
    decode: int = 1
    requests: int = 100
    prompt_tokens: int = 256
    max_tokens: int = 16
    concurrency: int = 4
    idle_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("prefill", "decode", "requests", "prompt_tokens", "max_tokens",
                     "concurrency"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")
        if self.idle_s < 0:
            raise ConfigError("--idle must be >= 0 seconds")


def _requests(n: int, tokens: int, first_id: int) -> list[TraceRequest]:
    """`n` prompts of `tokens` tokens sharing no block (hash ids from `first_id` on)."""
    blocks = -(-tokens // BLOCK)
    return [TraceRequest(i, 0.0, tokens * TRACE_BLOCK_TOKENS // BLOCK, 16,
                         tuple(range(first_id + i * blocks, first_id + (i + 1) * blocks)))
            for i in range(n)]


def measure(spec: CpuSpec, engine: str, first_id: int = 0) -> dict[str, Any]:
    """The figures of one engine's cluster."""
    cfg = ReplayConfig(block_tokens=BLOCK, max_input=spec.prompt_tokens,
                       max_output=spec.max_tokens, concurrency=spec.concurrency)
    with RoleProcs(replace(spec.roles, engine=engine)) as procs:
        pre = [procs.worker("prefill", f"prefill-{i}") for i in range(spec.prefill)]
        dec = [procs.worker("decode", f"decode-{i}") for i in range(spec.decode)]
        conductor = procs.conductor(pre, dec)
        warm = replay(conductor.url, _requests(2, spec.prompt_tokens, first_id), cfg)
        if warm["served"] != 2:
            raise ConfigError(f"the {engine} cluster did not answer its warm-up requests: "
                              f"{warm['first_error']}")
        idle0, t = conductor.cpu(), time.monotonic()
        time.sleep(spec.idle_s)  # a measuring window, not a wait for an event
        idle_rate = (conductor.cpu() - idle0) / max(time.monotonic() - t, 1e-9)
        reqs = _requests(spec.requests, spec.prompt_tokens, first_id + 10**6)
        before, t0 = conductor.cpu(), time.monotonic()
        run = replay(conductor.url, reqs, cfg)
        used, wall = conductor.cpu() - before, time.monotonic() - t0
    n = max(run["served"], 1)
    return {"engine": engine, "requests": spec.requests, "served": run["served"],
            "errors": run["errors"], "first_error": run["first_error"],
            "wall_s": round(wall, 3), "conductor_cpu_s": round(used, 4),
            "cpu_ms_per_request": round(used / n * 1e3, 3),
            "idle_cpu_per_s": round(idle_rate, 5),
            "cpu_ms_per_request_less_idle": round(max(0.0, used - idle_rate * wall) / n * 1e3,
                                                  3),
            "ttft_s": run["ttft_s"], "conductor_pid": conductor.pid}


def compare(spec: CpuSpec, engines: list[str]) -> dict[str, Any]:
    """Every engine's figures, in one run, with each one's per-request CPU over the first's
    (as measured, and less the idle rate)."""
    runs = {e: measure(spec, e, first_id=k * 10**7) for k, e in enumerate(engines)}
    base, ratios = runs[engines[0]], {}
    for e, r in runs.items():
        for key, label in (("cpu_ms_per_request", ""),
                           ("cpu_ms_per_request_less_idle", " less idle")):
            if e != engines[0] and base[key]:
                ratios[f"{e}/{engines[0]}{label}"] = round(r[key] / base[key], 3)
    return {"setup": {"model": spec.roles.model, "block_size": spec.roles.block_size,
                      "kv_blocks": spec.roles.kv_blocks, "policy": spec.roles.policy,
                      "prefill": spec.prefill, "decode": spec.decode,
                      "requests": spec.requests, "prompt_tokens": spec.prompt_tokens,
                      "max_tokens": spec.max_tokens, "concurrency": spec.concurrency,
                      "idle_s": spec.idle_s},
            "runs": runs, "ratios": ratios}
