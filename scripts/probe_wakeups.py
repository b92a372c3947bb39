#!/usr/bin/env python3
"""How much of a small store put is this machine's idle wake-ups: batch-16 puts of 4 KiB into
a master process (`mooncake store master`), timed with the other cores idle and then with a
busy loop holding one of them (a vCPU that never halts wakes at once).

    python3 scripts/probe_wakeups.py --batches 1000

Prints the p50 of each request type (put start, put end) and of the whole batch put, per
condition, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mooncake_cli.config import TransferConfig  # noqa: E402
from mooncake_cli.heap import tune_heap  # noqa: E402
from mooncake_cli.registry import Registry  # noqa: E402
from mooncake_cli.store.client import StoreClient  # noqa: E402
from mooncake_cli.transfer.engine import TransferEngine  # noqa: E402


def run(address: str, batches: int, tag: str) -> dict[str, float]:
    times: dict[str, list[float]] = defaultdict(list)
    with TransferEngine(TransferConfig(host="127.0.0.1"), Registry.from_env()) as engine, \
            StoreClient(address, engine, 256 << 20) as client:
        call = client._call

        def timed(req: Any, kind: Any = None, meanwhile: Any = None) -> Any:
            t = time.perf_counter()
            try:
                return call(req, kind, meanwhile)
            finally:
                times[type(req).__name__].append(time.perf_counter() - t)
        client._call = timed  # type: ignore[method-assign, assignment]
        values = [os.urandom(4096) for _ in range(16)]
        for b in range(batches):
            keys = [f"{tag}-{b}-{i}" for i in range(16)]
            t = time.perf_counter()
            errors = client.batch_put(keys, values)
            times["batch_put"].append(time.perf_counter() - t)
            if any(errors):
                raise SystemExit(f"batch put failed: {errors}")
    return {k: round(statistics.median(v) * 1e6, 1) for k, v in times.items()}


def main() -> None:
    tune_heap()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=1000)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    master = subprocess.Popen([sys.executable, "-m", "mooncake_cli", "--json", "store", "master",
                               "--port", str(port)], stdout=subprocess.PIPE)
    busy = None
    try:
        assert master.stdout is not None
        ready = json.loads(master.stdout.readline())
        address = ready["address"]
        out = {"idle_p50_us": run(address, a.batches, "idle")}
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
        out["one_core_busy_p50_us"] = run(address, a.batches, "busy")
    finally:
        if busy is not None:
            busy.kill()
        master.terminate()
        master.wait(30)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
