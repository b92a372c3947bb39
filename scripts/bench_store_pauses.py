"""Pauses of a store that holds many keys: one client fills its own segment through a real
`mooncake store master` with batch puts and reports the per-call latency tail and the wall time.

    python3 scripts/bench_store_pauses.py --keys 300000
    PYTHONPATH=/path/to/old/checkout python3 scripts/bench_store_pauses.py  # older code

A full garbage collection walks every GC-tracked object of its process while that process
answers nobody; the master's index and the client's holdings grow with the keys, so that is
what the tail shows (see mooncake_cli/heap.py and store/client/holdings.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from mooncake_cli.config import TransferConfig
from mooncake_cli.heap import tune_heap
from mooncake_cli.registry import Registry
from mooncake_cli.store.client import StoreClient
from mooncake_cli.transfer.engine import TransferEngine


def run(keys: int, batch: int, size: int) -> dict[str, float | int]:
    master = subprocess.Popen([sys.executable, "-m", "mooncake_cli", "--json", "store", "master",
                               "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert master.stdout is not None
        line = master.stdout.readline()
        if not line:
            raise RuntimeError("the store master did not start")
        address = json.loads(line)["address"]
        segment = max(64 << 20, 2 * keys * max(size, 4096))
        with TransferEngine(TransferConfig(host="127.0.0.1"), Registry.from_env()) as engine, \
                StoreClient(address, engine, segment) as client:
            values = [os.urandom(size)] * batch
            lat: list[float] = []
            began = time.perf_counter()
            for b in range(keys // batch):
                names = [f"key-{b}-{i}" for i in range(batch)]
                t = time.perf_counter()
                errors = client.batch_put(names, values)
                lat.append(time.perf_counter() - t)
                if any(errors):
                    raise RuntimeError(f"batch put {b} failed: {next(e for e in errors if e)}")
            wall = time.perf_counter() - began
    finally:
        master.terminate()
        master.wait(30)
    lat.sort()
    return {"keys": len(lat) * batch, "batch": batch, "value_bytes": size, "wall_s": wall,
            "p50_ms": lat[len(lat) // 2] * 1e3, "p999_ms": lat[int(len(lat) * 0.999)] * 1e3,
            "max_ms": lat[-1] * 1e3, "calls_over_100ms": sum(x > 0.1 for x in lat)}


def main() -> int:
    tune_heap()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=300_000, help="keys to put (default 300000)")
    ap.add_argument("--batch", type=int, default=64, help="keys per batch put (default 64)")
    ap.add_argument("--size", type=int, default=64, help="value bytes (default 64)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if min(args.keys, args.batch, args.size) < 1 or args.keys < args.batch:
        ap.error("--keys, --batch and --size must be positive, --keys at least --batch")
    try:
        r = run(args.keys, args.batch, args.size)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{r['keys']} keys in {r['wall_s']:.1f} s; {r['batch']}-key batch put p50 "
              f"{r['p50_ms']:.2f} ms, p99.9 {r['p999_ms']:.1f} ms, max {r['max_ms']:.0f} ms; "
              f"calls over 100 ms: {r['calls_over_100ms']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
