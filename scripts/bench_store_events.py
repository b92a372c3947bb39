#!/usr/bin/env python3
"""What publishing object events costs the store master: puts and removes through one
in-process StoreMaster without events, with the hook alone (no publisher thread), and with the
publisher (store/master/events.py) attached, in alternating rounds.

    python scripts/bench_store_events.py --keys 51200 --batch 64 --rounds 5

Each round puts `--keys` keys in batches (put_start + put_end) and removes them; prints, per
variant, the ops/s (wall time of the master's calls) and the CPU time of the process per op
until every event is published (the master's work plus the hook's and the publisher's: less
sensitive than wall time to other load on a shared host), per round, their medians and the
best of each. In-process, the master does nothing but its metadata: the publisher thread's
share of the GIL shows whole (through the RPC service the master also waits on sockets).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mooncake_cli.store.master import StoreMaster  # noqa: E402
from mooncake_cli.store.master.events import ObjectEvents  # noqa: E402
from mooncake_cli.store.records import Mount  # noqa: E402


class HookOnly(ObjectEvents):
    """The master's side alone: changes queued, no thread publishing them."""

    def _run(self) -> None:
        return


def run(kind: type[ObjectEvents] | None, keys: list[str], batch: int) -> tuple[float, float]:
    """(ops/s, CPU microseconds per op)."""
    master = StoreMaster()
    master.mount_segment(Mount("seg", "c", "h", 4096, 1 << 40))
    events = None
    if kind is not None:
        events = kind("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", queue_size=1 << 30)
        events.attach(master)
    t, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(keys), batch):
        master.batch_put_start(keys[i:i + batch], [4096] * len(keys[i:i + batch]))
        master.batch_put_end(keys[i:i + batch])
    for i in range(0, len(keys), batch):
        master.batch_remove(keys[i:i + batch])
    took = time.perf_counter() - t
    if kind is ObjectEvents and events is not None:
        deadline = time.monotonic() + 60
        while events.counts["removed"] < len(keys) and time.monotonic() < deadline:
            time.sleep(0.001)
    cpu = time.process_time() - cpu
    if events is not None:
        events.close()
    ops = 3 * len(keys)  # put_start, put_end and remove per key
    return ops / took, cpu / ops * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=51200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    keys = [f"kv/m/float16/1x1x16x8/{i:032x}" for i in range(args.keys)]
    variants = {"off": None, "hook": HookOnly, "events": ObjectEvents}
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for r in range(args.rounds):
        for name, kind in variants.items():
            got[name].append(run(kind, keys, args.batch))
        print(f"round {r + 1}: " + "  ".join(f"{n} {v[-1][0]:,.0f} ops/s {v[-1][1]:.2f} us"
                                             for n, v in got.items()))
    print("median: " + "  ".join(
        f"{n} {statistics.median(x[0] for x in v):,.0f} ops/s "
        f"{statistics.median(x[1] for x in v):.2f} us CPU/op" for n, v in got.items()))
    print("best:   " + "  ".join(f"{n} {max(x[0] for x in v):,.0f} ops/s "
                                 f"{min(x[1] for x in v):.2f} us CPU/op"
                                 for n, v in got.items()))


if __name__ == "__main__":
    main()
