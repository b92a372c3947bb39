#!/usr/bin/env python3
"""The conductor's HTTP edge, old stack against new, in one run (issue 10's figures).

    git worktree add /tmp/old-stack 316679e          # the last commit on ThreadingHTTPServer
    python3 scripts/bench_edge.py --old /tmp/old-stack --clients 2000 --idle 10000

For each checkout (the old one first, then this one): `mooncake conductor start --local 2,1
--model demo` in its own process; `--clients` keep-alive connections each sending
/v1/completions (max_tokens 1) back to back for `--seconds` -> requests/s and p50/p99 latency;
then `--idle` connections opened and held -> the conductor's threads and RSS. With
`--instances N`, N/2 prefill and N/2 decode worker processes are started once and both
conductors are measured in front of them: the conductor process's CPU time (user + system,
from /proc) per request, less its idle rate (the poller), at `--cpu-clients` concurrency.

The load generator is a minimal asyncio HTTP/1.1 client (one connection per client, the
request written whole, the answer read by Content-Length), so it costs the 2 shared cores as
little as possible; its numbers bound the server's from below.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def start(root: Path, args: list[str]) -> tuple[subprocess.Popen[bytes], dict]:
    env = dict(os.environ, PYTHONPATH=str(root))
    env = {k: v for k, v in env.items() if not k.startswith("MOONCAKE_")}
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_cli", "--json", *args], cwd=root,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        if event.get("event") in ("serving", "ready"):
            return proc, event
    raise RuntimeError(f"{args} exited with {proc.wait()}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 60 s (the old stack may still be closing 10,000 threads)."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(60)


def proc_stats(pid: int) -> dict[str, float]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines() if ":" in line)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return {"threads": int(status["Threads"]), "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
            "cpu_s": (int(fields[11]) + int(fields[12])) / TICK}


def request(port: int, body: bytes) -> bytes:
    return (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: "
            b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (port, len(body), body))


async def one_answer(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n")
                  if h.lower().startswith(b"content-length:"))
    await reader.readexactly(length)
    return status


async def load(port: int, clients: int, seconds: float, warmup: float = 3.0) -> dict:
    body = json.dumps({"model": "demo", "prompt": "hi", "max_tokens": 1}).encode()
    req = request(port, body)
    lat: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    t0 = time.monotonic()
    measure_from, stop_at = t0 + warmup, t0 + warmup + seconds

    async def client() -> None:
        nonlocal errors
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            errors += 1
            return
        try:
            while (now := time.monotonic()) < stop_at:
                writer.write(req)
                status = await one_answer(reader)
                done = time.monotonic()
                if now >= measure_from:
                    lat.append(done - now)
                    statuses[status] = statuses.get(status, 0) + 1
        except (OSError, asyncio.IncompleteReadError, ValueError, StopIteration):
            errors += 1
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    ok = sorted(lat)
    pct = (lambda q: round(ok[min(len(ok) - 1, int(q * len(ok)))] * 1000, 1)) if ok else \
        (lambda q: None)
    return {"requests_per_s": round(statuses.get(200, 0) / seconds, 1), "p50_ms": pct(0.5),
            "p99_ms": pct(0.99), "statuses": statuses, "client_errors": errors}


async def hold_idle(port: int, n: int, pid: int, hold: float) -> dict:
    conns = []
    for i in range(0, n, 250):  # the old server's accept backlog is 256
        got = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port)
                                     for _ in range(min(250, n - i))), return_exceptions=True)
        conns += [c for c in got if not isinstance(c, BaseException)]
        await asyncio.sleep(0.05)
    await asyncio.sleep(2.0)
    held = proc_stats(pid)
    await asyncio.sleep(hold)
    closed = sum(1 for r, _ in conns if r.at_eof() or r.exception() is not None)
    for _, w in conns:
        w.close()
    return {"opened": len(conns), "threads": held["threads"], "rss_mib": round(held["rss_mib"]),
            f"closed_by_server_after_{hold:g}s": closed}


def cpu_per_request(port: int, pid: int, clients: int, seconds: float) -> dict:
    before = proc_stats(pid)["cpu_s"]
    time.sleep(5.0)
    idle_rate = (proc_stats(pid)["cpu_s"] - before) / 5.0
    before = proc_stats(pid)["cpu_s"]
    t = time.monotonic()
    result = asyncio.run(load(port, clients, seconds, warmup=0.0))
    used = proc_stats(pid)["cpu_s"] - before - idle_rate * (time.monotonic() - t)
    served = result["requests_per_s"] * seconds
    return {"cpu_ms_per_request": round(used / served * 1000, 3) if served else None,
            "idle_cpu_s_per_s": round(idle_rate, 4), **result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, help="checkout of the old stack (for --stacks old)")
    ap.add_argument("--clients", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--instances", type=int, default=0, help="also: CPU/request at N workers")
    ap.add_argument("--cpu-clients", type=int, default=32)
    ap.add_argument("--only", choices=("load", "cpu"), help="one part only")
    ap.add_argument("--stacks", default="old,new", help="which of old,new to measure")
    a = ap.parse_args()
    if "old" in a.stacks.split(",") and a.old is None:
        ap.error("--old CHECKOUT is needed to measure the old stack (or --stacks new)")
    cfg = Path(tempfile.mkdtemp()) / "edge.toml"  # room for every client: measure HTTP, not 429
    cfg.write_text("[prefill]\nmax_waiting = 100000\nkv_blocks = 8192\n"
                   "[decode]\nmax_waiting = 100000\nkv_blocks = 8192\n")
    report: dict = {"clients": a.clients, "seconds": a.seconds, "idle": a.idle}
    for label, root in stacks(a) if a.only != "cpu" else ():
        proc, ev = start(root, ["--config", str(cfg), "conductor", "start", "--local", "2,1",
                                "--model", "demo", "--port", "0", "--kv-blocks", "8192"])
        port = int(ev["url"].rsplit(":", 1)[1])
        try:
            report[label] = {"load": asyncio.run(load(port, a.clients, a.seconds)),
                             "idle": asyncio.run(hold_idle(port, a.idle, proc.pid, 20.0))}
        finally:
            stop(proc)
        print(json.dumps({label: report[label]}), file=sys.stderr, flush=True)
    if a.instances and a.only != "load":
        report["cpu"] = cpu_section(a)
    if "old" in report and "new" in report and report["old"]["load"]["requests_per_s"]:
        report["new_over_old_requests_per_s"] = round(
            report["new"]["load"]["requests_per_s"] / report["old"]["load"]["requests_per_s"], 2)
    print(json.dumps(report, indent=1))


def stacks(a: argparse.Namespace) -> list[tuple[str, Path]]:
    roots = {"old": a.old.resolve() if a.old else HERE, "new": HERE}
    return [(label, roots[label]) for label in a.stacks.split(",")]


def cpu_section(a: argparse.Namespace) -> dict:
    workers = []
    try:
        for i in range(a.instances):
            role = "prefill" if i % 2 == 0 else "decode"
            workers.append(start(HERE, [role, "--model", "demo", "--kv-blocks", "2048"]))
        urls = {r: ",".join(ev["url"] for p, ev in workers if ev["role"] == r)
                for r in ("prefill", "decode")}
        out = {}
        for label, root in stacks(a):
            proc, ev = start(root, ["conductor", "start", "--model", "demo", "--port", "0",
                                    "--prefill", urls["prefill"], "--decode", urls["decode"]])
            try:
                out[label] = cpu_per_request(int(ev["url"].rsplit(":", 1)[1]), proc.pid,
                                             a.cpu_clients, a.seconds)
            finally:
                stop(proc)
            print(json.dumps({f"cpu_{label}": out[label]}), file=sys.stderr, flush=True)
        return {"instances": a.instances, **out}
    finally:
        for p, _ in workers:
            p.terminate()
        for p, _ in workers:
            p.wait(60)


if __name__ == "__main__":
    main()
