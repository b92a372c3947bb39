"""The relay figure on a testbed (root): hosts a, b, c, each serving a segment and a relay
(`transfer serve --relay-port`); a writes SIZE bytes to c directly and through b's relay, twice
each, then as the plan chooses (tests/helpers/relay_run.py); then `doctor --group topology`
from a. One testbed per --links value; each is down again afterwards.

    python3 scripts/relay_testbed.py 'a-b=1gbit,a-c=100mbit,b-c=1gbit' \
        'a-b=1gbit,a-c=10gbit,b-c=1gbit'
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mooncake_cli.bench.stats import Child  # noqa: E402
from mooncake_cli.testbed import bed  # noqa: E402

PREFIX = "mctf"
SIZE = 32 << 20
MOONCAKE = [sys.executable, "-m", "mooncake_cli", "--json"]
ENV = {"MOONCAKE_SECRET": secrets.token_hex(16)}


def _in(tb: Any, host: str, argv: list[str]) -> dict[str, Any]:
    argv, env = bed.exec_argv(tb, host, argv, bind=True)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env, **ENV})
    if not done.stdout.strip():
        raise SystemExit(f"{' '.join(argv)}: {done.stderr.strip()}")
    return dict(json.loads(done.stdout))


def one(links: str) -> dict[str, Any]:
    tb = bed.up(bed.plan(PREFIX, "3", links))
    children = []
    try:
        ready = {}
        for h in tb.hosts:
            argv, env = bed.exec_argv(tb, h, MOONCAKE + [
                "transfer", "serve", "--host", tb.address(h), "--port", "7000", "--transport",
                "tcp", "--buffer-size", str(2 * SIZE), "--relay-port", "7100"], bind=True)
            children.append(Child(argv, f"transfer serve on {h}", {**env, **ENV}))
            ready[h] = children[-1].line(timeout=60)
        relay, c = ready["b"]["relay"], ready["c"]
        runs = _in(tb, "a", [sys.executable, "-m", "tests.helpers.relay_run", c["segment"],
                             str(c["offset"]), relay, str(SIZE)])["runs"]
        doctor = _in(tb, "a", MOONCAKE + ["doctor", "--group", "topology"] + [
            x for h in tb.hosts for x in ("--relay", ready[h]["relay"])])
    finally:
        for child in children:
            child.close()
        bed.down(PREFIX)
    best = {p: min(r["seconds"] for r in runs if r["via"] == v)
            for p, v in (("direct", "direct"), ("relay", relay))}
    checks = {x["check"]: x for x in doctor["checks"]}
    return {"links": links, "bytes": SIZE, "direct_s": best["direct"],
            "relay_s": best["relay"], "auto": runs[-1],
            "matrix": checks["link matrix"]["data"]["matrix"],
            "mtu": [(x["data"]["hosts"], x["data"]["mtu"], x["status"])
                    for x in doctor["checks"] if x["check"].startswith("MTU")]}


def main(configs: list[str]) -> None:
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    t0, load0 = time.time(), os.getloadavg()
    rows = [one(links) for links in configs]
    print(json.dumps({"started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0)),
                      "load_average_start": load0, "load_average_end": os.getloadavg(),
                      "cpus": os.cpu_count(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:] or ["a-b=1gbit,a-c=100mbit,b-c=1gbit/mtu=1500:1400",
                          "a-b=1gbit,a-c=10gbit,b-c=1gbit/mtu=1500:1400"])
