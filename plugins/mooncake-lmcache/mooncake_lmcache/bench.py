"""Retrieve throughput of LMCache's tier behind the local CPU cache, side by side in one run:
this plugin (a store master and a node in their own processes), LMCache's local-disk backend,
and its redis:// backend against a real `redis-server`.

    python -m mooncake_lmcache.bench                      # 4096 tokens, Llama-3.2-1B geometry
    python -m mooncake_lmcache.bench --tokens 8192 --rounds 20 --json

Each backend gets its own LMCache engine (LMCacheEngineBuilder, CPU KV connector). The KV
cache is stored once; then the engine's local CPU copies are dropped and kept off
(`set_hot_cache(False)`), so every retrieve reads the tier under test. Rounds alternate
between the backends (a noisy neighbour slows all of them alike); each round's KV is compared
bit for bit with what was stored, outside the timed part. Throughput is KV bytes over the
wall time of `engine.retrieve`; the medians are reported with their ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from mooncake_lmcache import harness as h
from mooncake_lmcache.procs import RedisServer, StoreProcs

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
NODE = "mooncake (node)"  # the engine contributes nothing: chunks live on the store node
OWN = "mooncake (own seg)"  # the engine contributes a segment and its chunks go there first
DISK = "lmcache local disk"
REDIS = "lmcache redis"


@dataclass
class Row:
    backend: str
    engine: Any
    seconds: list[float] = field(default_factory=list)
    verified: bool = True

    def summary(self, nbytes: int) -> dict[str, Any]:
        med = statistics.median(self.seconds)
        return {"backend": self.backend, "rounds": len(self.seconds), "verified": self.verified,
                "gbps": nbytes / med / 1e9, "p50_ms": med * 1e3,
                "best_gbps": nbytes / min(self.seconds) / 1e9}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(cond: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _holds(engine: Any, toks: torch.Tensor, n: int) -> bool:
    return bool(engine.lookup(toks) == n)


def _tiers(stack: ExitStack, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    size = args.tokens * h.KVLayout(args.layers, args.heads, args.head_size,
                                    DTYPES[args.dtype]).token_bytes()
    store = StoreProcs(_free_port())
    stack.callback(store.close)
    store.add_node(max(2 * size, 64 << 20))
    redis = RedisServer(maxmemory=str(max(4 * size, 256 << 20)))
    stack.callback(redis.close)
    disk = tempfile.mkdtemp(prefix="mooncake-lmcache-disk-")
    stack.callback(shutil.rmtree, disk, True)
    return {NODE: h.mooncake_config(store.master),
            # its own keys: under the node row's keys its puts would find the chunks there
            OWN: h.mooncake_config(store.master, segment_size=max(2 * size, 64 << 20),
                                   key_prefix="lmcache-own/"),
            DISK: h.disk_config(disk + "/", max_gb=max(1.0, 3 * size / 1e9)),
            REDIS: h.redis_config(redis.url)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    # the KV connector's copies stand in for a GPU copy; torch's spinning intra-op threads
    # would make them 10x slower on a busy machine and drown what is measured
    torch.set_num_threads(1)
    layout = h.KVLayout(args.layers, args.heads, args.head_size, DTYPES[args.dtype],
                        args.chunk_size)
    nbytes = args.tokens * layout.token_bytes()
    toks, kv = h.tokens(args.tokens, 7), layout.random(args.tokens, 7)
    cpu_gb = max(0.25, 3 * nbytes / 1e9)
    with ExitStack() as stack:
        rows = []
        for name, tier in _tiers(stack, args).items():
            engine = h.build("bench", layout, tier, cpu_gb=cpu_gb)
            if "remote_url" not in tier:  # LMCache 0.5.6's RedisConnector.close() deadlocks
                stack.callback(h.destroy, engine)  # on its own event loop: left to the exit
            engine.store(toks, kvcaches=kv)
            h.remote_only(engine)
            _wait(partial(_holds, engine, toks, args.tokens), f"{name} to hold the KV")
            rows.append(Row(name, engine))
        out = layout.empty(args.tokens)
        for r in range(args.rounds + 1):  # round 0 warms up and is not counted
            for row in rows:
                out.zero_()
                began = time.perf_counter()
                mask = row.engine.retrieve(toks, kvcaches=out)
                took = time.perf_counter() - began
                ok = bool(mask.all()) and torch.equal(out.view(torch.uint8), kv.view(torch.uint8))
                row.verified = row.verified and ok
                if r:
                    row.seconds.append(took)
        results = [row.summary(nbytes) for row in rows]
    gbps = {r["backend"]: r["gbps"] for r in results}
    return {"tokens": args.tokens, "kv_bytes": nbytes, "chunk_size": args.chunk_size,
            "layout": {"layers": args.layers, "kv_heads": args.heads,
                       "head_size": args.head_size, "dtype": args.dtype},
            "results": results,
            "ratios": {f"{ours} / {peer}": gbps[ours] / gbps[peer]
                       for ours in (NODE, OWN) for peer in (DISK, REDIS)}}


def _print(report: dict[str, Any]) -> None:
    print(f"retrieve of {report['tokens']} tokens ({report['kv_bytes'] / 2**20:.0f} MiB of KV, "
          f"chunks of {report['chunk_size']}), {report['results'][0]['rounds']} rounds")
    print(f"{'backend':<20} {'GB/s':>7} {'p50 ms':>8} {'best GB/s':>10} verified")
    for r in report["results"]:
        print(f"{r['backend']:<20} {r['gbps']:7.2f} {r['p50_ms']:8.1f} {r['best_gbps']:10.2f} "
              f"{'yes' if r['verified'] else 'NO'}")
    for name, ratio in report["ratios"].items():
        print(f"{name}: {ratio:.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mooncake_lmcache.bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096, help="tokens of KV (default 4096)")
    ap.add_argument("--layers", type=int, default=16, help="model layers (default 16)")
    ap.add_argument("--heads", type=int, default=8, help="KV heads (default 8)")
    ap.add_argument("--head-size", type=int, default=64, help="head size (default 64)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--chunk-size", type=int, default=256, help="LMCache chunk (default 256)")
    ap.add_argument("--rounds", type=int, default=10, help="timed retrieves per backend")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if min(args.tokens, args.layers, args.heads, args.head_size, args.chunk_size,
           args.rounds) < 1:
        ap.error("sizes and --rounds must be positive")
    try:
        report = run(args)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report))
    else:
        _print(report)
    return 0 if all(r["verified"] for r in report["results"]) else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # the redis engine's threads would keep the interpreter from exiting
