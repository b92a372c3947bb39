#!/usr/bin/env python3
"""Many store clients at once, lane polling on and off in the same run.

    python3 scripts/bench_store_clients.py --clients 1,4,8 --seconds 3 --turns 2

Each turn starts a master (`python -m mooncake_cli.store.service`) and N client processes that
each put 16 x 4 KiB into their own segment (the preferred one) and read them back, as fast as
they can, for the same wall-clock window. It prints the rounds per second of all of them
together with `MOONCAKE_STORE_SPIN_US` / `MOONCAKE_STORE_MASTER_SPIN_US` at their defaults
("poll") and at 0 ("sleep"), the two taking turns so the drift of a shared machine falls on
both, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CLIENT = r"""
import json, os, sys, time
from mooncake_cli.config import TransferConfig
from mooncake_cli.heap import tune_heap
from mooncake_cli.registry import Registry
from mooncake_cli.store.client.store_client import StoreClient
from mooncake_cli.store.records import ReplicateConfig
from mooncake_cli.transfer.engine import TransferEngine
addr, name, start, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
tune_heap()
eng = TransferEngine(TransferConfig(), Registry.from_env())
c = StoreClient(addr, eng, 1 << 30)  # no eviction within a turn
vals = [os.urandom(4096) for _ in range(16)]
here = ReplicateConfig(preferred_segment=eng.name)  # into its own segment, as one client does
while time.time() < start:
    time.sleep(0.001)
n = 0
while time.time() < start + seconds:
    keys = [f"{name}-{n}-{j}" for j in range(16)]
    errors = [e for e in c.batch_put(keys, vals, here) if e is not None]
    got = c.batch_get(keys)
    if errors or got != vals:
        bad = [(i, type(g).__name__, g if not isinstance(g, bytes) else len(g))
               for i, g in enumerate(got) if g != vals[i]]
        sys.exit(f"round {n}: {errors[:1] or bad[:3]}")
    n += 1
print(json.dumps({"rounds": n}), flush=True)
time.sleep(max(0.0, start + seconds + 2 - time.time()))  # the others are done with theirs
c.close(); eng.close()
"""


def turn(clients: int, seconds: float, poll: bool) -> float:
    env = dict(os.environ)
    if not poll:
        env["MOONCAKE_STORE_SPIN_US"] = env["MOONCAKE_STORE_MASTER_SPIN_US"] = "0"
    master = subprocess.Popen([sys.executable, "-m", "mooncake_cli.store.service", "--port",
                               "0"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert master.stdout is not None
        address = json.loads(master.stdout.readline())["address"]
        start = time.time() + 3 + 0.3 * clients  # every client connected and registered
        kids = [subprocess.Popen([sys.executable, "-c", CLIENT, address, f"c{k}", str(start),
                                  str(seconds)], stdout=subprocess.PIPE, text=True, env=env)
                for k in range(clients)]
        rounds = 0
        for kid in kids:
            out, _ = kid.communicate(timeout=120 + seconds)
            if kid.returncode != 0:
                raise SystemExit(f"a client failed (exit {kid.returncode})")
            rounds += json.loads(out.strip().splitlines()[-1])["rounds"]
        return rounds / seconds
    finally:
        master.terminate()
        master.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,4,8", help="client process counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=3.0, help="window of each turn")
    ap.add_argument("--turns", type=int, default=2, help="turns of each setting per count")
    ap.add_argument("--json", action="store_true", help="one JSON object per count")
    args = ap.parse_args()
    for n in (int(c) for c in args.clients.split(",")):
        got: dict[str, list[float]] = {"poll": [], "sleep": []}
        for _ in range(args.turns):
            for mode in ("poll", "sleep"):
                got[mode].append(turn(n, args.seconds, mode == "poll"))
        poll, sleep = (statistics.median(got[m]) for m in ("poll", "sleep"))
        row = {"clients": n, "poll_rounds_s": [round(x) for x in got["poll"]],
               "sleep_rounds_s": [round(x) for x in got["sleep"]],
               "poll_over_sleep": round(poll / sleep, 2)}
        print(json.dumps(row) if args.json else
              f"{n} client(s): poll {row['poll_rounds_s']} rounds/s, sleep "
              f"{row['sleep_rounds_s']}, poll/sleep (medians) {row['poll_over_sleep']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
