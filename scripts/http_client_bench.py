#!/usr/bin/env python3
"""The HTTP clients the roles could talk through, side by side, against one of our servers.

    python scripts/http_client_bench.py --requests 2000 --concurrency 32 --rounds 3

A `mooncake_cli.http.server` edge in a child process (its own interpreter: the client's GIL and
the server's do not compete) answers POST /v1/echo with a small JSON object after reading the
body through the edge, as a worker reads /v1/prefill. Each client sends `--requests` small JSON
POSTs over loopback: one after another (sync clients from one thread, async ones from one task),
then `--concurrency` at once (async clients: tasks on one loop; sync clients: that many threads).
Prints one JSON line per client and mode: requests per second, p50 and p99 latency (ms) and the
client process's CPU time per request (us), the best of `--rounds` rounds (by requests per second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# each candidate at its best: a body goes out with its headers (aiohttp and h1pool do this)
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
BODY = {"model": "demo", "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 16}


def serve() -> None:
    from starlette.requests import Request
    from starlette.routing import Route

    from mooncake_cli.http.server import Server, body, edge_app

    async def echo(request: Request) -> Any:
        from starlette.responses import JSONResponse
        return JSONResponse({"ok": True, "bytes": len(await body(request))})

    server = Server(edge_app([Route("/v1/echo", echo, methods=["POST"])]), "127.0.0.1", 0,
                    "bench-edge").start()
    print(json.dumps({"port": server.port}), flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.close()


def figures(name: str, mode: str, lat: list[float], wall: float, cpu: float) -> dict[str, Any]:
    lat.sort()
    n = len(lat)
    return {"client": name, "mode": mode, "requests": n, "rps": round(n / wall),
            "p50_ms": round(lat[n // 2] * 1e3, 3), "p99_ms": round(lat[int(n * 0.99)] * 1e3, 3),
            "cpu_us": round(cpu / n * 1e6, 1)}


def sync_run(name: str, send: Callable[[], None], n: int, conc: int) -> list[dict[str, Any]]:
    out = []
    for mode, threads in (("sequential", 1), ("concurrent", conc)):
        lat: list[float] = []

        def one(_: int, lat: list[float] = lat) -> None:
            t = time.perf_counter()
            send()
            lat.append(time.perf_counter() - t)

        for _ in range(20):
            send()
        c0, w0 = time.process_time(), time.perf_counter()
        if threads == 1:
            for i in range(n):
                one(i)
        else:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, range(n)))
        out.append(figures(name, mode, lat, time.perf_counter() - w0, time.process_time() - c0))
    return out


async def async_run(name: str, send: Callable[[], Awaitable[None]], n: int,
                    conc: int) -> list[dict[str, Any]]:
    out = []
    for mode, width in (("sequential", 1), ("concurrent", conc)):
        lat: list[float] = []
        left = [n]

        async def lane(lat: list[float] = lat, left: list[int] = left) -> None:
            while left[0] > 0:
                left[0] -= 1
                t = time.perf_counter()
                await send()
                lat.append(time.perf_counter() - t)

        for _ in range(20):
            await send()
        c0, w0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(width)))
        out.append(figures(name, mode, lat, time.perf_counter() - w0, time.process_time() - c0))
    return out


def sync_clients(url: str) -> tuple[dict[str, Callable[[], None]],
                                  list[Callable[[], None]]]:
    import httpcore
    import httpx

    from mooncake_cli.http import jsonhttp

    pool = httpcore.ConnectionPool(max_connections=1024, max_keepalive_connections=256,
                                   socket_options=NODELAY)
    client = httpx.Client(transport=httpx.HTTPTransport(socket_options=NODELAY), trust_env=False)
    data, head = json.dumps(BODY).encode(), [(b"Content-Type", b"application/json")]

    def core() -> None:
        r = pool.request("POST", url, content=data, headers=head)
        json.loads(r.content)

    def full() -> None:
        client.post(url, content=data, headers={"Content-Type": "application/json"}).json()

    def ours() -> None:
        jsonhttp.call(url, BODY)

    return {"httpcore (sync pool)": core, "httpx.Client": full,
            "jsonhttp.call (h1pool, background loop)": ours}, [pool.close, client.close]


Sends = dict[str, Callable[[], Awaitable[None]]]


async def async_clients(url: str) -> tuple[Sends, list[Callable[[], Awaitable[Any]]]]:
    import aiohttp
    import httpcore
    import httpx

    from mooncake_cli.http import jsonhttp

    data, head = json.dumps(BODY).encode(), [(b"Content-Type", b"application/json")]
    pool = httpcore.AsyncConnectionPool(max_connections=1024, max_keepalive_connections=256,
                                        socket_options=NODELAY)
    client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(
        socket_options=NODELAY, limits=httpx.Limits(max_connections=1024)), trust_env=False)
    session = aiohttp.ClientSession()
    peer = jsonhttp.AsyncPeer()

    async def core() -> None:
        r = await pool.request("POST", url, content=data, headers=head)
        json.loads(r.content)

    async def full() -> None:
        (await client.post(url, content=data,
                           headers={"Content-Type": "application/json"})).json()

    async def aio() -> None:
        async with session.post(url, data=data,
                                headers={"Content-Type": "application/json"}) as r:
            await r.json()

    async def ours() -> None:
        await peer.call(url, BODY)

    sends: Sends = {"httpcore (async pool)": core, "httpx.AsyncClient": full,
             "aiohttp.ClientSession": aio, "jsonhttp.AsyncPeer (h1pool)": ours}
    return sends, [pool.aclose, client.aclose, session.close, peer.close]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve()
        return
    child = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert child.stdout is not None and child.stdin is not None
    url = f"http://127.0.0.1:{json.loads(child.stdout.readline())['port']}/v1/echo"
    best: dict[tuple[str, str], dict[str, Any]] = {}

    def keep(rows: list[dict[str, Any]]) -> None:
        for row in rows:
            key = (row["client"], row["mode"])
            if key not in best or row["rps"] > best[key]["rps"]:
                best[key] = row

    try:
        from mooncake_cli.http.server import run_loop
        for _ in range(args.rounds):  # clients alternate within a round: drift hits all alike
            sends, closers = sync_clients(url)
            for name, send in sends.items():
                keep(sync_run(name, send, args.requests, args.concurrency))
            for close in closers:  # now, not when collected: their sockets' numbers get reused
                close()

            async def rounds() -> None:
                tasks, stops = await async_clients(url)
                for name, task in tasks.items():
                    keep(await async_run(name, task, args.requests, args.concurrency))
                for stop in stops:
                    await stop()

            run_loop(rounds())  # uvloop where installed, as every role runs
    finally:
        child.stdin.close()
        child.wait(10)
    for row in best.values():
        print(json.dumps(row))


if __name__ == "__main__":
    main()
