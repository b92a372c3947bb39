#!/usr/bin/env python3
"""Wall time of a 16 x 4 KiB batch_put and of a single 4 KiB put, two checkouts taking turns.

    git worktree add /tmp/old 939c061
    python3 scripts/ab_store_put.py --old /tmp/old --pairs 5

Each turn starts a master of its own checkout in a child process and one client putting into
its own segment; three rounds of 400 calls per kind, the first 200 discarded, and the median
of the rest. The turns alternate, so the drift of a shared machine falls on both checkouts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TURN = """
import json, os, statistics, subprocess, sys, time
from mooncake_cli.config import TransferConfig
from mooncake_cli.heap import tune_heap
from mooncake_cli.registry import Registry
from mooncake_cli.store.client.store_client import StoreClient
from mooncake_cli.transfer.engine import TransferEngine
p = subprocess.Popen([sys.executable, "-m", "mooncake_cli.store.service", "--port", "0"],
                     stdout=subprocess.PIPE, text=True)
addr = json.loads(p.stdout.readline())["address"]
tune_heap()
eng = TransferEngine(TransferConfig(), Registry.from_env())
c = StoreClient(addr, eng, 256 << 20)
vals = [os.urandom(4096) for _ in range(16)]
out = {}
for batch in (16, 1):
    lat = []
    for rep in range(3):
        for i in range(400):
            keys = [f"{batch}-{rep}-{i}-{j}" for j in range(batch)]
            t = time.perf_counter()
            c.put(keys[0], vals[0]) if batch == 1 else c.batch_put(keys, vals)
            lat.append(time.perf_counter() - t)
        c.remove_all(force=True)
    out[batch] = round(statistics.median(lat[200:]) * 1e6, 1)
print(json.dumps(out))
c.close(); eng.close(); p.terminate(); p.wait()
"""


def turn(tree: str, script: Path, cwd: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")}
    env["PYTHONPATH"] = tree
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                         cwd=cwd, check=True, timeout=600).stdout
    got: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="a checkout of the commit to compare with")
    ap.add_argument("--new", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:  # not a checkout: `-m` would import from cwd
        script = Path(tmp) / "turn.py"
        script.write_text(TURN)
        for i in range(args.pairs):
            old, new = turn(args.old, script, tmp), turn(args.new, script, tmp)
            print(f"pair {i + 1}: batch_put 16 x 4 KiB {old['16']:.0f} -> {new['16']:.0f} us, "
                  f"put 4 KiB {old['1']:.0f} -> {new['1']:.0f} us (medians, old -> new)",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
