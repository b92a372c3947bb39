"""`bench testbed transfer`: for each link rate, a 2-host testbed (a-b=RATE); the transfer
engine's tcp transport writes from a to b (`transfer serve` bound to b's address,
`bench transfer --mode initiator` in a), then raw Python TCP streams a -> b (one by
default) on the same link, each reported as GB/s and as a fraction of the link rate."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from mooncake_cli.bench.stats import Child
from mooncake_cli.config import human_size
from mooncake_cli.interfaces import ConfigError, TransferError
from mooncake_cli.testbed import bed, stream
from mooncake_cli.testbed.state import Testbed
from mooncake_cli.testbed.topology import parse_rate, rate_text

MOONCAKE = [sys.executable, "-m", "mooncake_cli", "--json"]


def _engine_write(tb: Testbed, block: int, batch: int, threads: int,
                  seconds: float) -> dict[str, Any]:
    """Our engine's row of `bench transfer --mode initiator` (write, tcp) from a to b."""
    buffer = max(256 << 20, block * batch * threads)
    secret = {"MOONCAKE_SECRET": secrets.token_hex(16)}  # beyond loopback: a cluster secret
    argv, env = bed.exec_argv(tb, "b", MOONCAKE + [
        "transfer", "serve", "--host", tb.address("b"), "--transport", "tcp",
        "--buffer-size", str(buffer)], bind=True)
    with Child(argv, "the transfer target on b (mooncake transfer serve)",
               {**env, **secret}) as target:
        segment = str(target.line(timeout=60)["segment"])
        argv, env = bed.exec_argv(tb, "a", MOONCAKE + [
            "bench", "transfer", "--mode", "initiator", "--target", segment,
            "--transport", "tcp", "--op", "write", "--block-size", str(block),
            "--batch-size", str(batch), "--threads", str(threads), "--duration", str(seconds),
            "--buffer-size", str(buffer)], bind=True)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120,
                              env={**os.environ, **env, **secret})
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise TransferError(f"bench transfer in host a failed: {tail}")
    rows = json.loads(done.stdout)["reports"][0]["results"]
    ours = next(r for r in rows if r["name"] == "ours")
    return {"gbps": ours["gbps"], "p50_us": ours["p50_us"], "verified": ours["verified"],
            "segment": segment}


def run(rates: list[str], prefix: str, seconds: float, block: int, batch: int, threads: int,
        streams: int = 1, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure every rate in turn; the testbed is down again afterwards."""
    if not rates:
        raise ConfigError("--rates needs at least one rate, e.g. 1gbit,10gbit,25gbit")
    bps = [parse_rate(r) for r in rates]
    rows = []
    t0, load0 = time.time(), os.getloadavg()
    try:
        for rate in bps:
            tb = bed.up(bed.plan(prefix, "a,b", f"a-b={rate_text(rate)}"))
            link_gbyte = rate / 8 / 1e9
            if progress:
                progress(f"{rate_text(rate)}: transfer engine (tcp) a -> b")
            ours = _engine_write(tb, block, batch, threads, seconds)
            if progress:
                progress(f"{rate_text(rate)}: raw TCP ({streams} stream(s)) a -> b")
            raw = stream.measure(tb, "a", "b", seconds, streams)
            raw_gbyte = raw.bits_per_s / 8 / 1e9
            rows.append({"rate": rate_text(rate), "rate_bps": rate,
                         "link_gbyte_per_s": round(link_gbyte, 4),
                         "engine_gbyte_per_s": round(ours["gbps"], 4),
                         "engine_of_rate": round(ours["gbps"] / link_gbyte, 3),
                         "engine_p50_us": ours["p50_us"], "engine_verified": ours["verified"],
                         "raw_gbyte_per_s": round(raw_gbyte, 4),
                         "raw_of_rate": round(raw_gbyte / link_gbyte, 3),
                         "engine_of_raw": round(ours["gbps"] / raw_gbyte, 3)
                         if raw_gbyte else None})
    finally:
        bed.down(prefix)
    return {"workload": {"op": "write", "transport": "tcp", "block_size": block,
                         "block": human_size(block), "batch_size": batch, "threads": threads,
                         "seconds": seconds, "hosts": "a -> b", "mtu": bed.MTU,
                         "raw_streams": streams},
            "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0)),
            "load_average_start": [round(x, 2) for x in load0],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "cpus": os.cpu_count(), "rows": rows}
