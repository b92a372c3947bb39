#!/usr/bin/env python3
"""Conductor replicas (issue 40's figure): one conductor against three (`--peers`), at the
same offered load, and the errors while one of three is killed with SIGKILL.

    python3 scripts/bench_conductor_peers.py --rate 12 --seconds 30

Starts its own etcd (the `etcd` binary), a store master, `--prefill` prefill and one decode
worker of `--model` (registered in etcd), then for each row the conductors in processes of
their own, and sends `--rate` requests a second (open loop: each at its planned time, whatever
the answers do; `--prompt` tokens, `--max-tokens` greedy tokens, non-streamed), spread over
the row's conductors in turn, for `--seconds`:

    one                one conductor, no --peers (as before)
    one-peers          one conductor with --peers (what sharing costs it)
    three-peers        three with --peers
    three-peers-kill   three with --peers; one SIGKILLed halfway through

Per row: answered requests per second (over the offered window), p50/p99 latency of the
answered ones, and errors: `lost` (the connection broke or was refused: a client stops
sending to a conductor it could not reach, as a load balancer would) and `refused` (an HTTP
error answer); with --peers, the p50/p99 wait of the conductors' booking checks (etcd's order,
`conductor/peer_order.py`) and the bookings given up. `--json` prints the rows as one JSON
object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from mooncake_cli.http.jsonhttp import AsyncPeer

HERE = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(*args: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """`python -m ARGS...` printing JSON lines: the process and its ready/serving line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")}
    proc = subprocess.Popen([sys.executable, "-m", *args], cwd=HERE, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        if event.get("event") in ("serving", "ready"):
            return proc, event
    raise RuntimeError(f"{args} exited with {proc.wait()}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_etcd(data: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("etcd")
    if binary is None:
        raise SystemExit("the `etcd` binary is not on PATH")
    client, peer = free_port(), free_port()
    curl, purl = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    proc = subprocess.Popen([binary, "--name", "bench", "--data-dir", str(data),
                             "--listen-client-urls", curl, "--advertise-client-urls", curl,
                             "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                             "--initial-cluster", f"bench={purl}", "--log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", client), 0.5).close()
            return proc, f"etcd://127.0.0.1:{client}"
        except OSError:
            time.sleep(0.1)
    raise SystemExit("etcd did not start")


async def offer(urls: list[str], args: argparse.Namespace,
                kill: tuple[float, subprocess.Popen[bytes], str] | None) -> dict[str, Any]:
    """Open-loop load over `urls`; `kill`: (seconds in, process, its url) to SIGKILL."""
    peer = AsyncPeer()
    live = list(urls)
    latencies: list[float] = []
    lost = refused = 0
    prompt = list(range(2, 2 + args.prompt))

    async def one(i: int) -> None:
        nonlocal lost, refused
        if not live:
            lost += 1
            return
        url = live[i % len(live)]
        body = {"model": args.model, "prompt": [1, *prompt[:-1], 2 + i % 250],
                "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
        t = time.monotonic()
        try:
            answer = await peer.call(url + "/v1/completions", body, timeout_s=120)
        except (OSError, ValueError):
            lost += 1
            if url in live:
                live.remove(url)
            return
        if answer.status == 200:
            latencies.append(time.monotonic() - t)
        else:
            refused += 1

    async def killer() -> None:
        if kill is not None:
            await asyncio.sleep(kill[0])
            kill[1].kill()

    t0 = time.monotonic()
    n = int(args.rate * args.seconds)
    tasks = [asyncio.ensure_future(killer())]
    for i in range(n):
        await asyncio.sleep(max(0.0, t0 + i / args.rate - time.monotonic()))
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
    await peer.close()
    latencies.sort()

    def pct(q: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 4) \
            if latencies else None

    return {"offered": n, "answered": len(latencies),
            "answered_per_s": round(len(latencies) / args.seconds, 2),
            "p50_s": pct(0.50), "p99_s": pct(0.99), "lost": lost, "refused": refused}


def row(name: str, n: int, peers: str, args: argparse.Namespace, kill: bool) -> dict[str, Any]:
    flags = ["mooncake_cli", "--json", "conductor", "start", "--port", "0", "--model",
             args.model, *(["--peers", peers] if peers else ["--registry", args.registry])]
    procs = [start(*flags) for _ in range(n)]
    urls = [event["url"] for _, event in procs]
    try:
        for url in urls:  # every worker seen (and, with --peers, caught up)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                        if json.loads(resp.read()).get("status") == "ok":
                            break
                except OSError:
                    pass
                time.sleep(0.2)
        victim = (args.seconds / 2, procs[0][0], urls[0]) if kill else None
        result = asyncio.run(offer(urls, args, victim))
        if peers:  # the booking checks of the conductors still up
            seen = []
            for url in urls[1:] if kill else urls:
                with urllib.request.urlopen(url + "/health", timeout=10) as resp:
                    seen.append(json.loads(resp.read())["peers"])
            result["bookings_yielded"] = sum(p["bookings_yielded"] for p in seen)
            result["check_p50_ms"] = max(p["booking_check_ms"]["p50"] or 0 for p in seen)
            result["check_p99_ms"] = max(p["booking_check_ms"]["p99"] or 0 for p in seen)
    finally:
        for proc, _ in procs:
            stop(proc)
    return {"row": name, "conductors": n, **result}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--prefill", type=int, default=2, help="prefill workers")
    ap.add_argument("--rate", type=float, default=12.0, help="requests offered per second")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds of load per row")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        etcd, url = start_etcd(Path(tmp) / "etcd")
        args.registry = f"{url}/bench"
        procs = []
        try:
            master, ready = start("mooncake_cli.store.service", "--port", "0")
            procs.append(master)
            common = ["mooncake_cli", "--json", "--model", args.model, "--store",
                      ready["address"], "--segment-size", "64MiB", "--conductor", args.registry,
                      "--heartbeat", "0.5"]
            roles = ["prefill"] * args.prefill + ["decode"]
            for i, role in enumerate(roles):
                procs.append(start(*common[:2], role, *common[2:], "--name", f"{role}-{i}")[0])
            rows = [row("one", 1, "", args, False),
                    row("one-peers", 1, args.registry, args, False),
                    row("three-peers", 3, args.registry, args, False),
                    row("three-peers-kill", 3, args.registry, args, True)]
        finally:
            for proc in reversed(procs):
                stop(proc)
            etcd.kill()
            etcd.wait()
    if args.json:
        print(json.dumps({"rate": args.rate, "seconds": args.seconds, "rows": rows}))
        return 0
    print(f"offered {args.rate:g} req/s for {args.seconds:g} s per row ({args.model}, "
          f"{args.prefill} prefill + 1 decode, prompt {args.prompt}, {args.max_tokens} tokens)")
    print(f"{'row':18} {'answered/s':>10} {'p50 s':>8} {'p99 s':>8} {'lost':>5} {'refused':>7}"
          f" {'check p50/p99 ms':>17} {'yielded':>7}")
    for r in rows:
        check = f"{r.get('check_p50_ms', '-')}/{r.get('check_p99_ms', '-')}"
        print(f"{r['row']:18} {r['answered_per_s']:>10} {r['p50_s']!s:>8} {r['p99_s']!s:>8} "
              f"{r['lost']:>5} {r['refused']:>7} {check:>17} {r.get('bookings_yielded', '-'):>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
