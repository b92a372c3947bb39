#!/usr/bin/env python3
"""Control-plane attacks (issue 12) against a `--local` cluster and separately started roles.

    python scripts/attacks.py                 # both clusters, a table attack -> outcome
    python scripts/attacks.py --only local --json
    python scripts/attacks.py --repo DIR --pythonpath DIR2   # the roles of another checkout

Each cluster is started here (model demo, loopback): `conductor start --local 1,1`, and a store
master, conductor (--api-key), prefill and decode, each its own process with MOONCAKE_SECRET.
The attacker is another process of this host without the secret (or, where it says insider,
with it but not the worker's identity). A legitimate request must still be answered. Exit
code 1 when any attack got through or the legitimate request failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import zmq

REPO = Path(__file__).resolve().parent.parent
ROLES = REPO  # the checkout whose roles are attacked (--repo)
PYTHONPATH: list[str] = []  # where its packages are found first (--pythonpath)
sys.path.insert(0, str(REPO))
from mooncake_cli.http import jsonhttp  # noqa: E402
from mooncake_cli.http.auth import Signer  # noqa: E402
from mooncake_cli.store.wire import protocol  # noqa: E402
from mooncake_cli.store.wire.rpc import MasterConnection  # noqa: E402

SECRET, API_KEY = "attack-demo-secret", "attack-demo-key"
BODY = {"model": "demo", "prompt": "mooncake " * 6, "max_tokens": 4, "temperature": 0,
        "ignore_eos": True}
EVIL = "http://127.0.0.1:9"


def spawn(*args: str, **env: str) -> subprocess.Popen[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")}
    return subprocess.Popen([sys.executable, "-m", "mooncake_cli", "--json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROLES,
                            env={**base, "PYTHONUNBUFFERED": "1",
                                 "PYTHONPATH": os.pathsep.join(PYTHONPATH), **env})


def line(proc: subprocess.Popen[bytes], timeout: float = 120) -> dict[str, Any]:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise SystemExit(f"pid {proc.pid} printed nothing in {timeout} s")
    return dict(json.loads(proc.stdout.readline()))


def start_local(procs: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    procs.append(spawn("conductor", "start", "--local", "1,1", "--model", "demo", "--port",
                       "0", "--kv-blocks", "64"))
    events = [line(procs[-1]) for _ in range(4)]
    where = {m.group(1): m.group(2) for e in events[:3]
             if (m := re.match(r"(\S+)(?: master)? at (\S+)", e["what"]))}
    return {"url": events[-1]["url"], "master": where["store"], "prefill": where["prefill-0"],
            "decode": where["decode-0"], "pid": procs[-1].pid, "headers": {}}


def start_roles(procs: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    # the [transfer] table's variable too: what roles took before --secret (see --repo)
    env = {"MOONCAKE_SECRET": SECRET, "MOONCAKE_TRANSFER_SECRET": SECRET}
    procs.append(spawn("store", "master", "--port", "0", **env))
    master = line(procs[-1])["address"]
    # a checkout with --api-key (auth.py sat in the package root before mooncake_cli/http)
    keyed = any((ROLES / "mooncake_cli" / d / "auth.py").exists() for d in ("", "http"))
    procs.append(spawn("conductor", "start", "--port", "0", "--model", "demo",
                       *(("--api-key", API_KEY) if keyed else ()), **env))
    url, pid = line(procs[-1])["url"], procs[-1].pid
    urls = {}
    for role in ("prefill", "decode"):
        procs.append(spawn(role, "--model", "demo", "--store", master, "--conductor", url,
                           "--name", f"{role}-0", "--heartbeat", "0.3", "--kv-blocks", "64",
                           "--segment-size", "16MiB", **env))
        urls[role] = line(procs[-1])["url"]
    headers = {"Authorization": f"Bearer {API_KEY}"} if keyed else {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = httpx.get(url + "/v1/instances", headers=headers).json()["instances"]
        if sum(i["alive"] for i in got) == 2:
            break
        time.sleep(0.3)
    return {"url": url, "master": master, "pid": pid, "headers": headers, "insider": True,
            **urls}


def http(url: str, body: dict[str, Any] | None = None, method: str | None = None,
         auth: Signer | None = None) -> str:
    status = jsonhttp.call(url, body, method=method, auth=auth, timeout=30).status
    return ("refused" if status in (401, 403) else "GOT THROUGH") + f" ({status})"


def store(address: str, request: Any) -> str:
    ctx = zmq.Context()
    try:
        conn = MasterConnection(ctx, address, None, 3.0)
        try:
            result = conn.call(request, Any)
        except Exception as e:
            why = str(e)
            if "MAC" in why or "secret" in why:
                return "refused (bad MAC: no secret)"
            return f"GOT THROUGH (the master answered: {why[:40]})"
        finally:
            conn.close()
        return f"GOT THROUGH ({result!r:.40})"
    finally:
        ctx.term()


def replayed(c: dict[str, Any]) -> str:
    name, value = Signer(SECRET).header("GET", "/v1/load", b"")
    h = {name.decode(): value.decode()}
    # the attacker saw one signed request go by (it used the secret; here we make one)
    first = httpx.get(c["decode"] + "/v1/load", headers=h).status_code
    again = httpx.get(c["decode"] + "/v1/load", headers=h).status_code
    return ("refused" if again == 401 else "GOT THROUGH") + f" ({first} then {again})"


def rss(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) << 10  # type: ignore[union-attr]


def stalled_bodies(c: dict[str, Any]) -> str:
    before = rss(c["pid"])
    host, port, _ = jsonhttp.split(c["url"])
    size, chunk = 7 << 20, b"x" * (1 << 20)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Length: "
            f"{size + 4096}\r\nContent-Type: application/json\r\n\r\n").encode()
    socks, left = [], {}
    sel = selectors.DefaultSelector()
    for _ in range(100):
        s = socket.create_connection((host, port))
        s.sendall(head)
        s.setblocking(False)
        socks.append(s)
        left[s] = size
        sel.register(s, selectors.EVENT_WRITE)
    deadline = time.monotonic() + 20
    while left and time.monotonic() < deadline:
        for key, _ in sel.select(0.5):
            s = key.fileobj  # type: ignore[assignment]
            try:
                left[s] -= s.send(chunk[:left[s]])
            except OSError:
                left[s] = 0
            if left[s] <= 0:
                sel.unregister(s)
                del left[s]
    time.sleep(1)
    grown = (rss(c["pid"]) - before) >> 20
    ok = httpx.post(c["url"] + "/v1/completions", json=BODY, headers=c["headers"],
                    timeout=60).status_code
    for s in socks:
        s.close()
    sel.close()
    return ("bounded" if grown < 200 and ok == 200 else "GOT THROUGH") + \
        f" (+{grown} MiB RSS; a request meanwhile: {ok})"


def threads(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"Threads:\s+(\d+)", text).group(1))  # type: ignore[union-attr]


def idle_connections(c: dict[str, Any], n: int = 10_000) -> str:
    """`n` sockets that connect and say nothing, against the conductor; then a request."""
    before, t0 = rss(c["pid"]), threads(c["pid"])
    host, port, _ = jsonhttp.split(c["url"])
    socks = [socket.create_connection((host, port), timeout=10) for _ in range(n)]
    time.sleep(1)
    grown, more = (rss(c["pid"]) - before) >> 20, threads(c["pid"]) - t0
    ok = httpx.post(c["url"] + "/v1/completions", json=BODY, headers=c["headers"],
                    timeout=60).status_code
    for s in socks:
        s.close()
    return ("bounded" if ok == 200 and grown < 300 else "GOT THROUGH") + \
        f" (+{grown} MiB RSS, +{more} threads; a request meanwhile: {ok})"


def attacks(c: dict[str, Any]) -> list[tuple[str, Callable[[], str]]]:
    cu, p, d, wrong = c["url"], c["prefill"], c["decode"], Signer("guessed-secret")
    insider = Signer(SECRET)
    out: list[tuple[str, Callable[[], str]]] = [
        ("register a fake prefill worker", lambda: http(
            cu + "/v1/instances/register", {"name": "fake", "role": "prefill", "url": EVIL})),
        ("re-register prefill-0 with the attacker's URL", lambda: http(
            cu + "/v1/instances/register", {"name": "prefill-0", "role": "prefill",
                                            "url": EVIL})),
        ("deregister decode-0", lambda: http(cu + "/v1/instances/deregister",
                                             {"name": "decode-0"})),
        ("reserve all 64 decode KV blocks", lambda: http(
            d + "/v1/kv/reserve", {"request_id": "evil", "num_tokens": 1024})),
        ("prefill writing KV where a fake decode says", lambda: http(
            p + "/v1/prefill", {"request_id": "evil", "token_ids": [1, 2, 3], "decode": EVIL})),
        ("generate on the decode worker", lambda: http(
            d + "/v1/generate", {"request_id": "evil", "token_ids": [1, 2], "first_token": 3,
                                 "stream": False})),
        ("release another request's KV", lambda: http(d + "/v1/kv/release",
                                                      {"request_id": "someone"})),
        ("read a worker's load", lambda: http(d + "/v1/load")),
        ("sign with a guessed secret", lambda: http(d + "/v1/load", auth=wrong)),
        ("replay a signed request", lambda: replayed(c)),
        ("store: put a block (poison the prefix cache)", lambda: store(
            c["master"], protocol.PutStart("poison", 4096))),
        ("store: remove every object", lambda: store(c["master"], protocol.RemoveAll(True))),
        ("100 connections x 7 MiB stalled bodies", lambda: stalled_bodies(c)),
        ("10,000 idle connections to the conductor", lambda: idle_connections(c)),
    ]
    if c.get("insider"):
        out += [("insider: take over decode-0's name", lambda: http(
                    cu + "/v1/instances/register", {"name": "decode-0", "role": "decode",
                                                    "url": EVIL}, auth=insider)),
                ("insider: deregister decode-0", lambda: http(
                    cu + "/v1/instances/deregister", {"name": "decode-0"}, auth=insider)),
                ("OpenAI API without the API key", lambda: http(cu + "/v1/completions", BODY))]
    return out


def legit(c: dict[str, Any]) -> str:
    answers = [httpx.post(c["url"] + "/v1/completions", json=BODY, headers=c["headers"],
                          timeout=60) for _ in range(2)]
    texts = {a.json()["choices"][0]["text"] for a in answers if a.status_code == 200}
    ok = all(a.status_code == 200 for a in answers) and len(texts) == 1
    codes = ", ".join(str(a.status_code) for a in answers)
    return ("answered" if ok else "FAILED") + f" ({codes}, same text: {len(texts) == 1})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=("local", "roles"))
    ap.add_argument("--json", action="store_true", help="one JSON line per row")
    ap.add_argument("--repo", type=Path, default=REPO,
                    help="checkout whose roles to start [default: this one]")
    ap.add_argument("--pythonpath", action="append", default=[],
                    help="a directory searched first by the roles' interpreter (to run "
                         "another checkout's packages, mooncake_backends included)")
    args = ap.parse_args()
    global ROLES
    ROLES = args.repo.resolve()
    PYTHONPATH.extend(args.pythonpath)
    rows: list[dict[str, str]] = []
    for kind, start in (("local", start_local), ("roles", start_roles)):
        if args.only and args.only != kind:
            continue
        procs: list[subprocess.Popen[bytes]] = []
        try:
            c = start(procs)
            for name, attack in attacks(c):
                rows.append({"cluster": kind, "attack": name, "outcome": attack()})
            rows.append({"cluster": kind, "attack": "legitimate completion (twice)",
                         "outcome": legit(c)})
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(60)
    bad = [r for r in rows if "GOT THROUGH" in r["outcome"] or "FAILED" in r["outcome"]]
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        width = max(len(r["attack"]) for r in rows)
        print(f"{'cluster':8} {'attack':{width}}  outcome")
        for r in rows:
            print(f"{r['cluster']:8} {r['attack']:{width}}  {r['outcome']}")
        print(f"\n{len(rows) - len(bad)} of {len(rows)} rows as they should be")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
