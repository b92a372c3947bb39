#!/usr/bin/env python3
"""Data-plane bounds and attacks (issue 12, part B) against real processes on this host.

    python scripts/data_plane.py                  # floods of 10,000 idle sockets + attacks
    python scripts/data_plane.py --idle 2000 --json
    python scripts/data_plane.py --cost           # tcp transfers: secret off / on / TLS

Started here, loopback only: a transfer target (`mooncake transfer serve`, with a secret and,
separately, without), a store master (`python -m mooncake_cli.store.service --secret`).
Floods: `--idle` sockets opened against the target's port, the master's zmq port and its Unix
lane, and held; meanwhile a legitimate client must still be served. Each row prints the
listener process's threads and RSS before and during the flood and the legitimate request's
latency. Attacks: each prints what the attacker got. Exit code 1 when a flood locked a
legitimate client out or an attack got through.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
import msgspec  # noqa: E402
import zmq  # noqa: E402

from mooncake_cli.config import TransferConfig  # noqa: E402
from mooncake_cli.registry import Registry  # noqa: E402
from mooncake_cli.store.wire import protocol  # noqa: E402
from mooncake_cli.store.wire.fastlane import Lane, lane_name  # noqa: E402
from mooncake_cli.transfer import wire  # noqa: E402
from mooncake_cli.transfer.batch import Op, State, TransferRequest  # noqa: E402
from mooncake_cli.transfer.engine import TransferEngine  # noqa: E402

SECRET = "data-plane-secret"
MiB = 1 << 20


def spawn(*cmd: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")}
    proc = subprocess.Popen([sys.executable, *cmd], stdout=subprocess.PIPE, cwd=REPO, env=env)
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def status(pid: int) -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) >> 10


def tcp_flood(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        out.append(s)
    return out


def unix_flood(name: str, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex(name)
        out.append(s)
    return out


def timed(fn: Any) -> str:
    t = time.perf_counter()
    try:
        fn()
    except Exception as e:  # the row says what failed
        return f"FAILED: {type(e).__name__}: {e}"[:90]
    return f"served in {(time.perf_counter() - t) * 1e3:.0f} ms"


def flood_row(name: str, pid: int, flood: Any, legit: Any, n: int) -> dict[str, Any]:
    legit()  # warm: connections and caches of the legitimate side exist before
    t0, r0 = status(pid)
    socks = flood(n)
    time.sleep(3)
    outcome = timed(legit)
    t1, r1 = status(pid)
    for s in socks:
        s.close()
    return {"listener": name, "idle": n, "threads": f"{t0} -> {t1}",
            "rss_mib": f"{r0} -> {r1}", "legitimate": outcome, "ok": "served" in outcome}


def transfer_legit(eng: TransferEngine, ready: dict[str, Any]) -> Any:
    src = eng.register(bytearray(b"\x11" * MiB))

    def go() -> None:
        eng.transfer(Op.WRITE, src, 0, ready["segment"], ready["offset"], MiB, timeout=30)
    return go


def floods(n: int) -> list[dict[str, Any]]:
    rows = []
    for secret in (SECRET, ""):
        argv = ["-m", "mooncake_cli", "--json", "transfer", "serve", "--buffer-size", "8MiB"]
        proc, ready = spawn(*argv, *(["--secret", secret] if secret else []))
        eng = TransferEngine(TransferConfig(secret=secret, transport="tcp", timeout=20),
                             Registry())
        try:
            port = int(ready["address"].rpartition(":")[2])
            rows.append(flood_row(f"transfer target ({'secret' if secret else 'no secret'})",
                                  proc.pid, lambda k, p=port: tcp_flood(p, k),
                                  transfer_legit(eng, ready), n))
        finally:
            eng.close()
            proc.kill()
            proc.wait()
    proc, ready = spawn("-m", "mooncake_cli.store.service", "--port", "0", "--secret", SECRET)
    address = ready["address"]
    ctx = zmq.Context()
    try:
        from mooncake_cli.store.wire.rpc import MasterConnection

        conn = MasterConnection(ctx, address, SECRET, 20)
        port = int(address.rpartition(":")[2])
        rows.append(flood_row("store master zmq", proc.pid, lambda k: tcp_flood(port, k),
                              lambda: conn.call(protocol.Exists("k"), bool), n))
        conn.close()

        def lane_call() -> None:
            lane = Lane(address, SECRET.encode(), 20)
            lane.call(protocol.Exists("k"), bool)
            lane.close()
        rows.append(flood_row("store master lane", proc.pid,
                              lambda k: unix_flood(lane_name(address), k), lane_call, n))
    finally:
        ctx.term()
        proc.kill()
        proc.wait()
    return rows


def attacks() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    proc, ready = spawn("-m", "mooncake_cli", "--json", "transfer", "serve", "--buffer-size",
                        "8MiB", "--secret", SECRET)
    eng = TransferEngine(TransferConfig(secret=SECRET, transport="tcp"), Registry())
    try:
        leftovers = [f for f in os.listdir("/dev/shm") if f.startswith(f"mooncake-{proc.pid}-")]
        rows.append({"attack": "open the target's shared memory by name",
                     "outcome": f"files: {leftovers or 'none'}", "ok": not leftovers})
        src = eng.register(bytearray(b"\x33" * 65536))
        eng.transfer(Op.WRITE, src, 0, ready["segment"], ready["offset"], 65536)
        host, port = ready["address"].rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=5)
        nonce = wire.HELLO.unpack(wire.recv_exact(s, wire.HELLO.size))[3]
        s.sendall(wire.prove(SECRET, nonce))
        wire.recv_exact(s, 1)
        s.sendall(wire.REQUEST.pack(wire.OP_WRITE, 0, 0, 1, ready["offset"], 65536)
                  + b"\xff" * 4096)
        s.close()
        time.sleep(0.5)
        back = eng.register(bytearray(65536))
        eng.transfer(Op.READ, back, 0, ready["segment"], ready["offset"], 65536)
        assert back.view is not None
        changed = sum(back.view[i] != 0x33 for i in range(0, 65536, 4096))
        rows.append({"attack": "truncated in-bounds write (1 of 16 pages sent)",
                     "outcome": f"{changed} pages changed", "ok": changed == 0})
    finally:
        eng.close()
        proc.kill()
        proc.wait()
    proc, ready = spawn("-m", "mooncake_cli.store.service", "--port", "0", "--secret", SECRET)
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://{ready['address']}")
        body = msgspec.msgpack.encode({"op": "mount_segment", "segment": {
            "name": "evil", "client_id": "evil", "host": "h", "base": 0, "size": 2**64 - 1,
            "tier": "dram"}})
        sock.send_multipart([body, protocol.mac(SECRET.encode(), body)])
        reply = protocol.decode_reply(sock.recv_multipart()[0]) if sock.poll(5000) else None
        sock.close()
        rows.append({"attack": "mount a 2^64-1 byte segment (insider, with the secret)",
                     "outcome": reply.message[:70] if reply else "no answer",
                     "ok": reply is not None and not reply.ok})
        _, rss0 = status(proc.pid)
        held = []
        for _ in range(4):
            u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            u.connect(lane_name(ready["address"]))
            u.settimeout(2)
            u.recv(wire.HELLO.size, socket.MSG_WAITALL)
            try:
                u.sendall(struct.pack("<II", 250 * MiB, 32) + b"\0" * (8 * MiB))
            except OSError:
                pass
            held.append(u)
        _, rss1 = status(proc.pid)
        rows.append({"attack": "4 lane connections announcing 250 MiB, no secret",
                     "outcome": f"master RSS {rss0} -> {rss1} MiB", "ok": rss1 - rss0 < 30})
        for u in held:
            u.close()
    finally:
        ctx.term()
        proc.kill()
        proc.wait()
    return rows


def capability_rows() -> list[dict[str, Any]]:
    """A write into a guarded region without, or outside, a capability (in one process)."""
    a = TransferEngine(TransferConfig(secret=SECRET, transport="tcp"), Registry())
    b = TransferEngine(TransferConfig(secret=SECRET, transport="tcp"), Registry())
    try:
        pool = a.register(bytearray(1 << 16))
        a.guard(pool)
        token = a.grants.issue("r1", [(pool.base, 4096)], 60)
        src = b.register(bytearray(b"\x55" * 4096))
        rows = []
        for what, off, cap in (("no capability", 8192, None),
                               ("a capability for other blocks", 8192, token),
                               ("the right capability", 0, token)):
            [st] = b.submit([TransferRequest(Op.WRITE, src, 0, a.name, pool.base + off, 4096,
                                             cap)]).wait(10)
            done = st.state is State.COMPLETED
            rows.append({"attack": f"write into a decode pool with {what}",
                         "outcome": "written" if done else st.reason.split(": ", 2)[-1][:70],
                         "ok": done == (what == "the right capability")})
        return rows
    finally:
        a.close()
        b.close()


def cost() -> list[dict[str, Any]]:
    """WRITEs between two engines of this process over tcp with no secret, a secret and TLS:
    GB/s of wall time and GB per CPU-second of the process (both ends: on a loaded machine
    the CPU cost is the steadier figure)."""
    rows = []
    for bs in (1 * MiB, 16 * MiB):
        for name, kw in (("off", {}), ("secret", {"secret": SECRET}),
                         ("tls", {"secret": SECRET, "encrypt": True})):
            a = TransferEngine(TransferConfig(transport="tcp", **kw), Registry())  # type: ignore[arg-type]
            b = TransferEngine(TransferConfig(transport="tcp", **kw), Registry())  # type: ignore[arg-type]
            try:
                r = a.allocate(64 * MiB, shared=False)
                src = b.register(bytearray(os.urandom(bs)))
                b.transfer(Op.WRITE, src, 0, a.name, r.base, bs)
                n = max(8, (256 * MiB) // bs)
                c0, w0 = time.process_time(), time.perf_counter()
                for _ in range(n):
                    b.transfer(Op.WRITE, src, 0, a.name, r.base, bs)
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                rows.append({"block": f"{bs // MiB} MiB", "mode": name,
                             "gbps": round(n * bs / wall / 1e9, 3),
                             "gb_per_cpu_s": round(n * bs / cpu / 1e9, 3)})
            finally:
                a.close()
                b.close()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=int, default=10_000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cost", action="store_true", help="only the throughput/CPU rows")
    args = ap.parse_args()
    if args.cost:
        rows = cost()
        for r in rows:
            print(json.dumps(r) if args.json else
                  f"write {r['block']:>6} {r['mode']:<7} {r['gbps']:6.2f} GB/s  "
                  f"{r['gb_per_cpu_s']:5.2f} GB per CPU-second (both ends)")
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * args.idle + 1024)),
                                                hard))
    rows = floods(args.idle)
    found = attacks() + capability_rows()
    if args.json:
        print(json.dumps({"floods": rows, "attacks": found}))
    else:
        for r in rows:
            print(f"{r['listener']:<30} {r['idle']} idle   threads {r['threads']:<12} "
                  f"RSS {r['rss_mib']:<12} MiB   legitimate: {r['legitimate']}")
        print()
        for r in found:
            print(f"{'as it must' if r['ok'] else 'GOT THROUGH':<12} {r['attack']:<56} "
                  f"{r['outcome']}")
    return 0 if all(r["ok"] for r in rows + found) else 1


if __name__ == "__main__":
    sys.exit(main())
