#!/usr/bin/env python3
"""The master's own CPU time for a batch put, with no socket and no client in the way.

    python3 scripts/bench_master_batch.py --batch 16 --size 4096 --calls 3000

It mounts one 1 GiB DRAM segment on an in-process StoreMaster and times batch_put_start then
batch_put_end of `--batch` fresh keys into it as its own writer would (a local put), each with
the deferred work a served request runs after its answer (MasterState.defer), printing the
median µs per batch and per key, and how much of it came before the two answers (the rest
runs while the client goes on). Set it beside the
p50 of `mooncake bench store --compare-upstream --sizes 4KiB --batches 16`: what is left of our
p50 above this is the client and the two round trips.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

from mooncake_cli.store.master.facade import StoreMaster
from mooncake_cli.store.records import Mount, ReplicateConfig


def _served(m: StoreMaster, call: Callable[[], object]) -> float:
    """`call` as the service runs a request: the lock held, deferred work after it; the
    seconds until its answer was ready (what a client waits for)."""
    st = m.state
    later: list[Callable[[], None]] = []
    t = time.perf_counter()
    with st.lock:
        st.later = later
        try:
            call()
        finally:
            st.later = None
        answered = time.perf_counter() - t
        for work in later:
            work()
    return answered


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    m = StoreMaster()
    m.mount_segment(Mount("bench", "bench-client", "localhost", 0, 1 << 30, "dram"))
    cfg = ReplicateConfig(preferred_segment="bench")
    sizes, sums = [a.size] * a.batch, ["0" * 16] * a.batch
    lat: list[float] = []
    answers: list[float] = []
    for n in range(a.calls + a.calls // 5):  # the first fifth: warm-up
        keys = [f"k-{n}-{j}" for j in range(a.batch)]
        t = time.perf_counter()
        start = _served(m, partial(m.batch_put_start, keys, sizes, cfg))
        end = _served(m, partial(m.batch_put_end, keys, sums, "bench"))
        if n >= a.calls // 5:
            lat.append(time.perf_counter() - t)
            answers.append(start + end)
        if n % 1000 == 999:
            m.remove_all()
    total, answer = statistics.median(lat) * 1e6, statistics.median(answers) * 1e6
    out = {"batch": a.batch, "size": a.size, "calls": len(lat), "p50_us": round(total, 1),
           "answers_p50_us": round(answer, 1), "per_key_us": round(total / a.batch, 2)}
    print(json.dumps(out) if a.json else
          f"batch put of {a.batch} x {a.size} B: master p50 {total:.0f} µs a batch "
          f"({total / a.batch:.1f} µs a key), {answer:.0f} µs of it before the two answers "
          f"({len(lat)} calls)")


if __name__ == "__main__":
    main()
