"""TTFT of requests whose prefixes sit in a remote host's SSD tier, with and without prefetch.

Needs root. A 2-host testbed (prefix `pft`, link a-b at --rate). On a: the store master (its
object events on, promotion on hit off) and a store node with a small DRAM segment and an SSD
tier; a seeding prefill worker with no segment of its own prefills 2 x --rounds x --requests
prefixes of --prefix tokens, then filler prefixes: the node's DRAM overflows and the prefixes'
blocks go to its SSD tier, where they stay. Then per run, fresh on b: a prefill worker, a decode
worker and a conductor following the store's events, with --prefetch or --no-prefetch.
--requests requests (each its own prefix plus --suffix new tokens) arrive at once through the
OpenAI API; TTFT is the time to the first streamed token. The prefill worker runs one request
at a time; the others wait in its queue, and with prefetch it pulls their prefixes meanwhile.
The two modes alternate over --rounds rounds (each run its own prefixes). One JSON line per
run, then a summary: per mode the mean TTFT and the mean time the queued requests' first tokens came
after the first request's (the wait the requests ahead cost them), and their cuts.

    python3 scripts/prefetch_testbed.py --rate 1gbit --requests 12 --prefix 1024 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from mooncake_cli.testbed import roles

TB = [sys.executable, "-m", "mooncake_cli", "bench", "testbed"]
spawn = partial(roles.spawn, "pft")  # a mooncake role in a host of this testbed
A, B = "10.77.0.1", "10.77.0.2"
MODEL = ["--model", "smollm2-135m", "--dtype", "bfloat16", "--block-size", "16", "--threads", "1"]
FILLERS = 12


def prefix(i: int, n: int) -> list[int]:
    """Prefix `i`: `n` token ids of its own (no two prefixes share a block)."""
    return [1, *((i * 7919 + j * 31 + 11) % 40000 + 100 for j in range(n - 1))]


def suffix(i: int, n: int) -> list[int]:
    return [(i * 131 + j * 17 + 5) % 40000 + 100 for j in range(n)]


def behind_first(ttfts: list[float]) -> float:
    """The mean time the queued requests' first tokens came after the first request's: the
    wait the requests ahead of them cost."""
    first = min(ttfts)
    return statistics.mean(t - first for t in ttfts if t is not first) if len(ttfts) > 1 else 0.0


def _in(host: str, *args: str) -> dict[str, Any]:
    """This script, run with `args` in `host`: its last JSON line."""
    return roles.run("pft", host, sys.executable, __file__, *args)


def seed(args: argparse.Namespace) -> None:
    """Inside host a: prefill every prefix once on the seeding worker (no decode)."""
    from mooncake_cli.http.auth import signer
    from mooncake_cli.http.jsonhttp import call

    auth = signer(os.environ["MOONCAKE_SECRET"])
    stored = 0
    for i in range(2 * args.rounds * args.requests + FILLERS):
        ans = call(f"http://{A}:9300/v1/prefill", {
            "request_id": f"seed-{i}", "token_ids": prefix(i, args.prefix),
            "sampling": {"max_tokens": 1}}, timeout=600, auth=auth)
        assert ans.status == 200, ans.body
        stored += len(ans.body["stored_keys"])
    print(json.dumps({"stored_blocks": stored}))


def client(args: argparse.Namespace) -> None:
    """Inside host b: the requests of one mode, all at once; their TTFTs."""
    import httpx

    base = f"http://{B}:8000"
    name = httpx.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
    ttft: dict[int, float] = {}
    start = threading.Barrier(args.requests)

    def one(k: int) -> None:
        i = args.first + k
        body = {"model": name, "prompt": prefix(i, args.prefix) + suffix(i, args.suffix),
                "max_tokens": 2, "temperature": 0, "stream": True}
        start.wait()
        t = time.perf_counter()
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=600) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    ttft[k] = time.perf_counter() - t
                    break
            for _ in r.iter_lines():
                pass

    threads = [threading.Thread(target=one, args=(k,)) for k in range(args.requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    worker = httpx.get(f"http://{B}:9100/metrics", timeout=30).text
    conductor = httpx.get(base + "/metrics", timeout=30).text

    def metric(text: str, name: str) -> float:
        return sum(float(line.split()[-1]) for line in str(text).splitlines()
                   if line.startswith(name) and not line.startswith(name + "_created"))

    times = sorted(ttft.values())
    print(json.dumps({
        "ttft_mean_s": statistics.mean(times), "ttft_median_s": statistics.median(times),
        "behind_first_mean_s": behind_first(times),
        "ttft_p90_s": times[int(0.9 * (len(times) - 1))], "ttft_s": times,
        "prefetched_blocks": metric(worker, "mooncake_worker_prefetched_blocks_total"),
        "prefix_hit_tokens": metric(conductor, "mooncake_conductor_prefix_hit_tokens_total"),
        "prompt_tokens": metric(conductor, "mooncake_conductor_prompt_tokens_total")}))


def run_mode(args: argparse.Namespace, mode: str, first: int, tmp: Path) -> dict[str, Any]:
    procs = [spawn("b", "prefill", *MODEL, "--listen", f"{B}:9100", "--store", f"{A}:50051",
                   "--segment-size", "2GiB", "--kv-blocks", "256"),
             spawn("b", "decode", *MODEL, "--listen", f"{B}:9200", "--kv-blocks", "2048")]
    try:
        for p in procs:
            roles.ready(p)
        procs.append(spawn("b", "conductor", "start", *MODEL[:6], "--host", B, "--port",
                           "8000", "--prefill", f"http://{B}:9100", "--decode",
                           f"http://{B}:9200", "--store-events", f"tcp://{A}:5557",
                           "--explain", str(tmp / f"explain-{first}.jsonl"),
                           "--prefetch" if mode == "prefetch" else "--no-prefetch"))
        roles.ready(procs[-1])
        rep = _in("b", "--client", "--requests", str(args.requests), "--prefix",
                  str(args.prefix), "--suffix", str(args.suffix), "--first", str(first))
    finally:
        roles.stop(procs)
    explained = [json.loads(line) for line in (tmp / f"explain-{first}.jsonl").read_text()
                 .splitlines()]
    rep["decisions"] = {"fetch": sum(1 for r in explained if r["prefill"]["fetch_blocks"]),
                        "prefetch": sum(1 for r in explained if "prefetch" in r),
                        "first": {k: explained[0].get(k) for k in ("prefill", "kv_events")}
                        if explained else None}
    return {"mode": mode, "rate": args.rate, "requests": args.requests,
            "prefix_tokens": args.prefix, "suffix_tokens": args.suffix, **rep}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--suffix", type=int, default=32)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--client", action="store_true")
    ap.add_argument("--seed", action="store_true")
    args = ap.parse_args()
    if args.client:
        return client(args)
    if args.seed:
        return seed(args)
    os.environ.setdefault("MOONCAKE_SECRET", secrets.token_hex(16))
    subprocess.run([*TB, "up", "--prefix", "pft", "--hosts", "2", "--links", f"a-b={args.rate}"],
                   check=True, stdout=subprocess.DEVNULL)
    store: list[subprocess.Popen[bytes]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="mooncake-pft-") as d:
            tmp = Path(d)
            store.append(spawn("a", "store", "master", "--host", A, "--port", "50051",
                               "--kv-events", f"tcp://{A}:5557", "--promotion-on-hit", "false"))
            roles.ready(store[0])
            store.append(spawn("a", "store", "serve", "--master", f"{A}:50051", "--host", A,
                               "--segment-size", "256MiB", "--ssd-dir", str(tmp / "ssd"),
                               "--ssd-size", "2GiB"))
            roles.ready(store[1])
            seeder = spawn("a", "prefill", *MODEL, "--listen", f"{A}:9300", "--store",
                           f"{A}:50051", "--segment-size", "0", "--kv-blocks", "256")
            try:
                roles.ready(seeder)
                seeded = _in("a", "--seed", "--requests", str(args.requests), "--prefix",
                             str(args.prefix), "--rounds", str(args.rounds))
            finally:
                roles.stop([seeder])
            stat = roles.run("pft", "a", sys.executable, "-m", "mooncake_cli", "--json",
                             "store", "stat", "--master", f"{A}:50051")
            tiers = {t["tier"]: t["objects"] for t in stat["tiers"]}
            means: dict[str, list[float]] = {"prefetch": [], "no-prefetch": []}
            behind: dict[str, list[float]] = {"prefetch": [], "no-prefetch": []}
            for r in range(args.rounds):  # alternating, so that load drifts hit both alike
                modes = ("prefetch", "no-prefetch") if r % 2 == 0 else ("no-prefetch",
                                                                         "prefetch")
                for n, mode in enumerate(modes):
                    rep = run_mode(args, mode, (2 * r + n) * args.requests, tmp)
                    means[mode].append(rep["ttft_mean_s"])
                    behind[mode].append(rep["behind_first_mean_s"])
                    print(json.dumps({**rep, "round": r, "seeded_blocks":
                                      seeded["stored_blocks"], "objects_by_tier": tiers,
                                      "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                                      "load_average": os.getloadavg()}), flush=True)
            on, off = statistics.mean(means["prefetch"]), statistics.mean(means["no-prefetch"])
            w_on = statistics.mean(behind["prefetch"])
            w_off = statistics.mean(behind["no-prefetch"])
            print(json.dumps({"summary": True, "rate": args.rate, "rounds": args.rounds,
                              "ttft_mean_prefetch_s": on, "ttft_mean_no_prefetch_s": off,
                              "ratio": on / off, "cut": 1 - on / off,
                              "behind_first_prefetch_s": w_on,
                              "behind_first_no_prefetch_s": w_off,
                              "behind_first_cut": 1 - w_on / w_off}), flush=True)
    finally:
        roles.stop(store)
        subprocess.run([*TB, "down", "--prefix", "pft"], stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
