"""A host's relay: a buffer in its engine's segment that other hosts stage data in, and a
control listener that forwards what they staged to a third segment (or fetches from one).

    agent = RelayAgent(engine, host="10.77.0.2", secret=secret)   # listens at agent.address

Every connection proves the cluster secret first (the engine's HMAC challenge, magic MCR, at
its `Door`).
A connection `lease`s slots of the buffer and gets a write capability for just those bytes:
the buffer is guarded, so no one else writes there, whatever secret they hold. `forward`
writes one of its slots to a segment (or reads one into it); never to this engine's own
segment, whose guarded memory the engine's local copy would not check. `probe` measures this
host's link to a segment with reads; `info` tells the segment, free slots, the engine's link
statistics, the probes, and the MTU of the route to each host asked about.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from typing import Any

from mooncake_cli.interfaces import MooncakeError, TransferError
from mooncake_cli.transfer import relay_wire
from mooncake_cli.transfer.batch import Op, State, TransferRequest
from mooncake_cli.transfer.door import Door
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.served import Entry

log = logging.getLogger("mooncake.transfer.relay")

CHUNK = 4 << 20
SLOTS = 16
MAX_LEASE = 8  # slots one connection may hold
MAX_HOSTS = 256  # route MTUs one info asks for
IDLE_TIMEOUT = 120.0
IP_MTU = getattr(socket, "IP_MTU", 14)  # Linux's value; Python names it only on some builds
PROBE_SMALL = 4096


def route_mtu(host: str) -> int | None:
    """The MTU of the route to `host` (its first hop's interface), found without sending."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return int(s.getsockopt(socket.IPPROTO_IP, IP_MTU))
    except OSError:
        return None


class _Lease:
    def __init__(self, key: str, slots: list[int], offsets: list[int], token: bytes) -> None:
        self.key, self.slots, self.offsets, self.token = key, slots, offsets, token


class RelayAgent:
    def __init__(self, engine: TransferEngine, host: str = "127.0.0.1", port: int = 0,
                 secret: str | None = None, slots: int = SLOTS, chunk: int = CHUNK,
                 timeout: float = 30.0) -> None:
        self.engine, self.chunk, self.slots, self._timeout = engine, chunk, slots, timeout
        self.region = engine.allocate(slots * chunk)
        engine.guard(self.region)  # only a lease's capability writes here
        self._free = list(range(slots))
        self._lock = threading.Lock()
        self._keys = itertools.count()
        self.measured: dict[str, dict[str, float]] = {}  # segment -> this host's probe of it
        sock = socket.create_server((host, port), backlog=64)
        self.host, self.port = sock.getsockname()[:2]
        self.door = Door(sock, relay_wire.MAGIC, secret, self._serve, "mooncake-relay", limit=64,
                         per_peer=32, per_peer_pending=16)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _serve(self, entry: Entry) -> None:
        conn = entry.conn
        held: list[Any] = [None]  # this connection's lease
        try:
            conn.settimeout(IDLE_TIMEOUT)
            while True:
                msg = relay_wire.recv(conn)
                if not self.door.claim(entry):
                    return
                relay_wire.send(conn, self._handle(msg, held, entry.peer))
                self.door.release(entry)
        except (OSError, ConnectionError):
            pass  # the caller left (or stalled): its lease goes back below
        finally:
            self._give_back(held[0])

    def _handle(self, msg: dict[str, Any], held: list[Any], peer: str) -> dict[str, Any]:
        op = msg.get("op")
        try:
            if op == "info":
                hosts = [str(h) for h in msg.get("hosts", [])]
                if len(hosts) > MAX_HOSTS:
                    return {"error": f"info names at most {MAX_HOSTS} hosts"}
                return self.info(hosts)
            if op == "lease":
                self._give_back(held[0])
                held[0] = None
                held[0] = self._lease(int(msg.get("slots", 2)), peer)
                lease = held[0]
                return {"segment": self.engine.name, "offsets": lease.offsets,
                        "chunk": self.chunk, "cap": lease.token.hex()}
            if op in ("forward", "probe"):
                lease = held[0]
                if lease is None:
                    return {"error": f"{op} needs a lease first"}
                return (self._forward(msg, lease) if op == "forward"
                        else self._probe(msg, lease))
            return {"error": f"unknown relay op {op!r}"}
        except MooncakeError as e:
            return {"error": str(e)}
        except (KeyError, TypeError, ValueError) as e:
            return {"error": f"malformed {op} request: {type(e).__name__}: {e}"}

    def _lease(self, n: int, peer: str) -> _Lease:
        if not 1 <= n <= MAX_LEASE:
            raise TransferError(f"a lease holds 1 to {MAX_LEASE} slots, not {n}")
        with self._lock:
            if len(self._free) < n:
                raise TransferError(f"relay busy: {len(self._free)} of {self.slots} slots "
                                    f"free, {n} asked")
            slots, self._free = self._free[:n], self._free[n:]
        offsets = [self.region.base + s * self.chunk for s in slots]
        key = f"relay-{next(self._keys)}"
        token = self.engine.grants.issue(key, [(o, self.chunk) for o in offsets], 86400.0,
                                         holder=peer)
        return _Lease(key, slots, offsets, token)

    def _give_back(self, lease: _Lease | None) -> None:
        if lease is not None:
            self.engine.grants.revoke(lease.key)
            with self._lock:
                self._free += lease.slots

    def _slot(self, msg: dict[str, Any], lease: _Lease) -> tuple[int, int, str, int]:
        """(offset in the buffer region, length, target, target offset) of a request."""
        slot, n = int(msg.get("slot", 0)), int(msg["length"])
        target, toff = str(msg["target"]), int(msg.get("offset", 0))
        if not 0 <= slot < len(lease.offsets):
            raise TransferError(f"slot {slot} is not one of this lease's {len(lease.offsets)}")
        if not 0 < n <= self.chunk:
            raise TransferError(f"length {n} is outside 1-{self.chunk} (one slot)")
        if target == self.engine.name:
            raise TransferError("the relay forwards to other segments, not its own")
        return lease.offsets[slot] - self.region.base, n, target, toff

    def _forward(self, msg: dict[str, Any], lease: _Lease) -> dict[str, Any]:
        local, n, target, toff = self._slot(msg, lease)
        cap = bytes.fromhex(msg["cap"]) if msg.get("cap") else None
        op = Op.READ if msg.get("dir") == "read" else Op.WRITE
        start = time.perf_counter()
        status = self.engine.submit([TransferRequest(op, self.region, local, target, toff, n,
                                                     cap if op is Op.WRITE else None)]
                                    ).wait(self._timeout)[0]
        if status.state is not State.COMPLETED:
            raise TransferError(status.reason or f"{op.value} to {target} timed out")
        return {"ok": True, "seconds": time.perf_counter() - start}

    def _probe(self, msg: dict[str, Any], lease: _Lease) -> dict[str, Any]:
        local, n, target, toff = self._slot(msg, lease)
        got = probe(self.engine, self.region, local, target, toff, n, self._timeout)
        self.measured[target] = got
        return got

    def info(self, hosts: list[str]) -> dict[str, Any]:
        links: dict[str, dict[str, Any]] = {}
        for (peer, direction), t in self.engine.links.snapshot().items():
            links.setdefault(peer, {})[direction] = {"bytes": t.bytes, "seconds": t.seconds,
                                                     "bandwidth": t.bandwidth}
        for peer, got in self.measured.items():
            links.setdefault(peer, {})["probe"] = got
        with self._lock:
            free = len(self._free)
        return {"segment": self.engine.name, "engine": self.engine.address,
                "relay": self.address, "chunk": self.chunk, "slots": self.slots, "free": free,
                "links": links, "mtu": {h: route_mtu(h) for h in hosts}}

    def close(self) -> None:
        self.door.close()


def probe(engine: TransferEngine, region: Any, local: int, target: str, offset: int,
          length: int, timeout: float) -> dict[str, Any]:
    """Read PROBE_SMALL bytes three times (the least is the latency) and then `length`
    bytes twice (the faster is the bandwidth: the first may open connections, or lose the
    CPU) from `target` at `offset` into `region` at `local`."""
    rounds = []
    for _ in range(3):
        t0 = time.perf_counter()
        engine.transfer(Op.READ, region, local, target, offset, min(PROBE_SMALL, length),
                        timeout)
        rounds.append(time.perf_counter() - t0)
    took = []
    for _ in range(2):
        t0 = time.perf_counter()
        engine.transfer(Op.READ, region, local, target, offset, length, timeout)
        took.append(time.perf_counter() - t0)
    seconds = min(took)
    return {"bytes": length, "seconds": seconds, "bandwidth": length / seconds,
            "latency": min(rounds), "when": time.time()}
