#!/usr/bin/env python3
"""The latency spread of 16-key batch puts (or gets) of 4 KiB values through a real master, as
`mooncake bench store` runs its put row: a pool of 8 batches, cleared with remove_all(force)
before each reuse (untimed), one client holding its own replicas.

    python3 scripts/bench_store_tail.py --op put --calls 4000
    MOONCAKE_PLUGINS=tcp,shm python3 scripts/bench_store_tail.py   # without the nixl plugin

Prints the mean and percentiles in µs of the timed calls (the first eighth discarded). The bench
store row's GB/s follows the mean, so a tail of slow calls costs as much as a slower median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from mooncake_cli.config import TransferConfig
from mooncake_cli.heap import tune_heap
from mooncake_cli.registry import Registry
from mooncake_cli.store.client import StoreClient
from mooncake_cli.transfer.engine import TransferEngine

QS = (0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.997)


def run(op: str, calls: int, batch: int, size: int) -> dict[str, float]:
    master = subprocess.Popen([sys.executable, "-m", "mooncake_cli.store.service", "--port", "0"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert master.stdout is not None
        address = json.loads(master.stdout.readline())["address"]
        with TransferEngine(TransferConfig(), Registry.from_env()) as engine, \
                StoreClient(address, engine, 1 << 30) as client:
            values = [os.urandom(size) for _ in range(batch)]
            pools = [[f"tail/{b}/{j}" for j in range(batch)] for b in range(8)]
            if op == "get":
                for keys in pools:
                    client.batch_put(keys, values)
            lat: list[float] = []
            for i in range(calls):
                gen, slot = divmod(i, 8)
                if op == "put" and slot == 0 and gen:
                    client.remove_all(force=True)
                keys = [f"{k}.{gen}" for k in pools[slot]] if op == "put" else pools[slot]
                t = time.perf_counter()
                client.batch_put(keys, values) if op == "put" else client.batch_get(keys)
                lat.append(time.perf_counter() - t)
    finally:
        master.terminate()
        master.wait()
    lat = sorted(lat[calls // 8:])
    out = {"mean_us": round(statistics.mean(lat) * 1e6, 1)}
    out.update({f"p{q * 100:g}_us": round(lat[int(len(lat) * q)] * 1e6, 1) for q in QS})
    return out


def main() -> int:
    tune_heap()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=("put", "get"), default="put")
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    got = run(a.op, a.calls, a.batch, a.size)
    print(json.dumps(got) if a.json else " ".join(f"{k[:-3]} {v:.0f}" for k, v in got.items())
          + " µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
