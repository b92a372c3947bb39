#!/usr/bin/env python3
"""CPU per request of the async client between the roles, against the one it replaced, in one run.

    python3 scripts/bench_peer_client.py --requests 3000 --concurrency 32

A uvicorn app in its own process answers every POST with a small JSON body; this process sends
`--requests` POSTs (a 100-token body, like a prefill request) at `--concurrency`: through
httpcore's async pools (shards of 2 connections, the first client), an aiohttp session set up
as the second one was (where aiohttp is installed: it is no longer a dependency), and
`jsonhttp.AsyncPeer` (h1pool, today's), twice each, alternating, on uvloop's loop where it is
installed (`--loop asyncio` for asyncio's own); it prints this process's CPU time per request
(user + system).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpcore  # noqa: E402

from mooncake_cli.http.jsonhttp import AsyncPeer  # noqa: E402

SERVER = """
import json, sys, uvicorn
BODY = json.dumps({"ok": True, "first_token": 5, "pad": "y" * 200}).encode()
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""
BODY = {"request_id": "r", "token_ids": list(range(100)), "sampling": {"max_tokens": 1}}


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(kind: str, url: str, n: int, conc: int) -> dict[str, Any]:
    if kind == "httpcore":  # as the old AsyncPeer: pools of 2 connections, the least busy one
        # (one pool of many connections scans them all on every request)
        shards: list[list[Any]] = []
        data = json.dumps(BODY).encode()

        async def one() -> None:
            shard = min(shards, key=lambda s: s[1], default=None)
            if shard is None or shard[1] >= 2:
                shard = [httpcore.AsyncConnectionPool(max_connections=2,
                                                      max_keepalive_connections=2), 0]
                shards.append(shard)
            shard[1] += 1
            try:
                resp = await shard[0].request("POST", url, content=data,
                                              headers=[(b"Content-Type", b"application/json")])
            finally:
                shard[1] -= 1
            json.loads(resp.content)
    elif kind == "aiohttp":  # as the second AsyncPeer
        import aiohttp
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=4096, limit_per_host=1024, keepalive_timeout=4),
            cookie_jar=aiohttp.DummyCookieJar(), skip_auto_headers=("User-Agent",),
            auto_decompress=False)
        data = json.dumps(BODY).encode()
        timeout = aiohttp.ClientTimeout(total=None, connect=30, sock_connect=5, sock_read=30)

        async def one() -> None:
            async with session.request("POST", url, data=data, timeout=timeout,
                                       headers={"Content-Type": "application/json"}) as resp:
                json.loads(await resp.read())
    else:
        peer = AsyncPeer()

        async def one() -> None:
            (await peer.call(url, BODY)).body  # noqa: B018
    for _ in range(100):
        await one()
    sem = asyncio.Semaphore(conc)

    async def limited() -> None:
        async with sem:
            await one()
    c0, t0 = cpu(), time.perf_counter()
    await asyncio.gather(*(limited() for _ in range(n)))
    used, took = cpu() - c0, time.perf_counter() - t0
    if kind == "httpcore":
        for pool, _ in shards:
            await pool.aclose()
    elif kind == "aiohttp":
        await session.close()
    else:
        await peer.close()
    return {"client": kind, "cpu_us_per_request": round(used / n * 1e6, 1),
            "requests_per_s": round(n / took, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    a = ap.parse_args()
    run = asyncio.run
    if a.loop == "uvloop":
        try:
            import uvloop
            run = uvloop.run
        except ImportError:
            print("uvloop is not installed: asyncio's loop", file=sys.stderr)
    kinds = ["httpcore", "h1pool"]
    try:
        import aiohttp  # noqa: F401
        kinds.insert(1, "aiohttp")
    except ImportError:
        print("aiohttp is not installed: its rows are left out", file=sys.stderr)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the test server did not start") from None
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/v1/prefill"
        rows = [run(measure(kind, url, a.requests, a.concurrency)) for kind in kinds * 2]
    finally:
        server.terminate()
        server.wait(10)
    print(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
