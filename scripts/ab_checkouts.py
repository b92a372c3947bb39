#!/usr/bin/env python3
"""One benchmark under two installs of mooncake-cli, alternately, in one run: the after/before
ratio of the figures it prints with --json.

    python3 scripts/ab_checkouts.py --before /tmp/basevenv/bin/mooncake --rounds 3 \\
        --field gbps -- bench transfer --transport tcp --block-size 64KiB --duration 3

Round 1 runs `BEFORE --json ARGS...` then `AFTER --json ARGS...` (AFTER: this checkout's
`python3 -m mooncake_cli`), round 2 the other way round, and so on: on this host the first run of
a pair is faster (shm, 64 KiB: 0.90 either way), so use an even number of rounds. Each runs from
a scratch directory so neither picks up the other's sources.
A field is a dotted path into the JSON answer (`rows.0.gbps`); a field given as a bare name is
looked up anywhere in the answer (the first match, depth first). Prints the median of each side
and after / before per field, and with --json one object of them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def find(answer: Any, field: str) -> float | None:
    """The value at a dotted path, or the first value of a bare key anywhere in the answer."""
    if "." in field:
        node = answer
        for part in field.split("."):
            node = node[int(part)] if isinstance(node, list) else node.get(part)
            if node is None:
                return None
        return float(node)
    if isinstance(answer, dict):
        if field in answer and isinstance(answer[field], (int, float)):
            return float(answer[field])
        children = list(answer.values())
    elif isinstance(answer, list):
        children = answer
    else:
        return None
    for child in children:
        got = find(child, field)
        if got is not None:
            return got
    return None


def run(command: list[str], cwd: str) -> Any:
    out = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {out.returncode}:\n{out.stderr[-2000:]}")
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError:  # progress lines first: the answer is the last line
        return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the other install's `mooncake` executable")
    ap.add_argument("--after", default=f"{sys.executable} -m mooncake_cli",
                    help="this side's command (default: this Python's mooncake_cli)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--field", action="append", required=True, help="a figure of the answer")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the benchmark's arguments")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    sides = {"before": a.before.split(), "after": a.after.split()}
    got: dict[str, dict[str, list[float]]] = {s: {f: [] for f in a.field} for s in sides}
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(a.rounds):
            order = list(sides.items())
            for side, command in order if r % 2 == 0 else order[::-1]:
                answer = run([*command, "--json", *args], scratch)
                for f in a.field:
                    value = find(answer, f)
                    if value is None:
                        sys.exit(f"{side}: no field {f!r} in the answer")
                    got[side][f].append(value)
                print(f"round {r + 1} {side}: "
                      + ", ".join(f"{f}={got[side][f][-1]:.4g}" for f in a.field), file=sys.stderr)
    report = {f: {"before": statistics.median(got["before"][f]),
                  "after": statistics.median(got["after"][f])} for f in a.field}
    for row in report.values():
        row["ratio"] = row["after"] / row["before"] if row["before"] else float("nan")
    if a.json:
        print(json.dumps({"command": args, "rounds": a.rounds, "figures": report}))
    else:
        for f, row in report.items():
            print(f"{f}: before {row['before']:.4g}, after {row['after']:.4g}, "
                  f"after/before {row['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
