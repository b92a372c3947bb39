"""Sending a transfer through another host's relay when that is faster than the direct link.

    relays = Relays(engine, ["10.77.0.2:7100"], secret)
    plan, seconds = relays.write(region, 0, "10.77.1.2:7000", offset, 64 << 20)   # or read

Each link is known by a probe, reads of the target (the bytes the transfer will touch, or a
relay's buffer), or by what the engine moved over it (its link statistics, once at least
TRAFFIC_MIN bytes went that way) where that was faster. A relay's own link to the target
comes from the relay the same way (a probe it runs, its statistics). relay_plan.choose picks
the path. Through a relay the data is staged chunk by chunk in the slots it leased us and
forwarded while the next chunk comes, so both hops are busy at once.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from mooncake_cli.interfaces import TransferError
from mooncake_cli.transfer.batch import Op, State, TransferRequest
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.relay_agent import probe
from mooncake_cli.transfer.relay_plan import MIN_RELAY, Link, Plan, choose
from mooncake_cli.transfer.relay_wire import RelayConnection
from mooncake_cli.transfer.segment import Region

log = logging.getLogger("mooncake.transfer.relay")

SLOTS = 4
TRAFFIC_MIN = 16 << 20
MAX_AGE_S = 60.0


class Relays:
    def __init__(self, engine: TransferEngine, relays: list[str], secret: str | None,
                 timeout: float = 30.0, slots: int = SLOTS) -> None:
        self.engine, self.addresses, self._secret = engine, list(relays), secret
        self._timeout, self._slots = timeout, slots
        self._conns: dict[str, tuple[RelayConnection, dict[str, Any]]] = {}
        self._probed: dict[str, tuple[float, Link]] = {}  # segment -> (when, link)
        self._scratch: Region | None = None

    # -- measuring ----------------------------------------------------------------------------
    def _lease(self, address: str) -> tuple[RelayConnection, dict[str, Any]]:
        if address not in self._conns:
            conn = RelayConnection(address, self._secret, self._timeout)
            try:
                lease = conn.call({"op": "lease", "slots": self._slots})
            except TransferError:
                conn.close()
                raise
            self._conns[address] = (conn, lease)
        return self._conns[address]

    def _drop(self, address: str) -> None:
        conn, _ = self._conns.pop(address, (None, None))
        if conn is not None:
            conn.close()

    def link(self, segment: str, offset: int, length: int, op: Op) -> Link:
        """This engine's link to `segment`: a probe reading up to `length` bytes at `offset`
        (kept MAX_AGE_S seconds), or the engine's traffic that way when that was faster
        (once TRAFFIC_MIN bytes went over it: its average counts connection set-up and
        stalls, so alone it understates a link)."""
        when, probed = self._probed.get(segment, (0.0, None))
        if probed is None or time.monotonic() - when > MAX_AGE_S:
            n = min(length, 4 << 20)
            if self._scratch is None or self._scratch.length < n:
                self._scratch = self.engine.register(bytearray(max(n, 4 << 20)), guarded=True)
            got = probe(self.engine, self._scratch, 0, segment, offset, n, self._timeout)
            probed = Link(got["bandwidth"], got["latency"])
            self._probed[segment] = (time.monotonic(), probed)
        t = self.engine.links.snapshot().get((segment, op.value))
        if t is not None and t.bytes >= TRAFFIC_MIN and (t.bandwidth or 0) > probed.bandwidth:
            return Link(float(t.bandwidth or 0), probed.latency)
        return probed

    def _hop(self, address: str, conn: RelayConnection, target: str, offset: int,
             length: int, op: Op, chunk: int) -> Link:
        """The relay's link to `target`: a probe it runs (kept MAX_AGE_S seconds), or its
        traffic that way when that was faster."""
        when, probed = self._probed.get(f"{address}>{target}", (0.0, None))
        if probed is None or time.monotonic() - when > MAX_AGE_S:
            got = conn.call({"op": "probe", "slot": 0, "target": target, "offset": offset,
                             "length": min(length, chunk)})
            probed = Link(float(got["bandwidth"]), float(got["latency"]))
            self._probed[f"{address}>{target}"] = (time.monotonic(), probed)
        t = conn.call({"op": "info"}).get("links", {}).get(target, {}).get(op.value) or {}
        if t.get("bytes", 0) >= TRAFFIC_MIN and (t.get("bandwidth") or 0) > probed.bandwidth:
            return Link(float(t["bandwidth"]), probed.latency)
        return probed

    def plan(self, op: Op, target: str, offset: int, length: int) -> Plan:
        """The path for this transfer (`via`: a relay's address, or None: direct); one
        under MIN_RELAY bytes goes direct without measuring anything."""
        if length < MIN_RELAY:
            return Plan(None, 0.0, {}, f"{length} bytes: below {MIN_RELAY}, direct")
        direct = self.link(target, offset, length, op)
        hops: dict[str, tuple[Link, Link]] = {}  # by relay address
        chunk = 4 << 20
        for address in self.addresses:
            try:
                conn, lease = self._lease(address)
                seg, chunk = str(lease["segment"]), int(lease["chunk"])
                if seg in (target, self.engine.name):
                    continue
                first = self.link(seg, int(lease["offsets"][0]), chunk, op)
                hops[address] = (first, self._hop(address, conn, target, offset, length, op,
                                                  chunk))
            except TransferError as e:  # a relay that cannot help leaves the direct path
                log.warning("relay %s left out: %s", address, e)
                self._drop(address)
        return choose(length, direct, hops, chunk)

    # -- moving -------------------------------------------------------------------------------
    def write(self, region: Region, local: int, target: str, offset: int, length: int,
              via: str = "auto", cap: bytes | None = None) -> tuple[Plan, float]:
        """WRITE `length` bytes of `region` at `local` to `target` at `offset`, by `via`:
        "auto" (the plan's path), "direct", or a relay's address; (plan, seconds)."""
        return self._move(Op.WRITE, region, local, target, offset, length, via, cap)

    def read(self, region: Region, local: int, target: str, offset: int, length: int,
             via: str = "auto") -> tuple[Plan, float]:
        return self._move(Op.READ, region, local, target, offset, length, via, None)

    def _move(self, op: Op, region: Region, local: int, target: str, offset: int, length: int,
              via: str, cap: bytes | None) -> tuple[Plan, float]:
        if via == "auto":
            plan = self.plan(op, target, offset, length)
        elif via == "direct":
            plan = Plan(None, 0.0, {}, "direct, as asked")
        else:
            plan = Plan(via, 0.0, {}, "through the relay asked for")
        address = plan.via
        start = time.perf_counter()
        if address is None:
            status = self.engine.submit([TransferRequest(op, region, local, target, offset,
                                                         length, cap)]).wait(self._timeout)[0]
            if status.state is not State.COMPLETED:
                raise TransferError(status.reason or f"{op.value} timed out")
        else:
            try:
                self._through(address, op, region, local, target, offset, length, cap)
            except BaseException:
                self._drop(address)  # answers may still be on their way: start afresh
                raise
        return plan, time.perf_counter() - start

    def _through(self, address: str, op: Op, region: Region, local: int, target: str,
                 offset: int, length: int, cap: bytes | None) -> None:
        conn, lease = self._lease(address)
        seg, chunk = str(lease["segment"]), int(lease["chunk"])
        slots, token = [int(o) for o in lease["offsets"]], bytes.fromhex(lease["cap"])
        pieces = [(o, min(chunk, length - o)) for o in range(0, length, chunk)]

        def order(k: int) -> None:
            o, n = pieces[k]
            conn.post({"op": "forward", "slot": k % len(slots), "length": n, "target": target,
                       "offset": offset + o, "dir": op.value,
                       "cap": cap.hex() if cap else None})

        if op is Op.WRITE:  # stage piece k while the relay forwards piece k-1
            for k, (o, n) in enumerate(pieces):
                if k >= len(slots):
                    conn.answer()  # piece k-len(slots) left its slot: it may be reused
                self._hop_local(Op.WRITE, region, local + o, seg, slots[k % len(slots)], n,
                                token)
                order(k)
            for _ in range(min(len(slots), len(pieces))):
                conn.answer()
            return
        for k in range(min(len(slots), len(pieces))):  # READ: the relay fetches ahead
            order(k)
        for k, (o, n) in enumerate(pieces):
            conn.answer()
            self._hop_local(Op.READ, region, local + o, seg, slots[k % len(slots)], n, None)
            if k + len(slots) < len(pieces):
                order(k + len(slots))

    def _hop_local(self, op: Op, region: Region, local: int, seg: str, remote: int, n: int,
                   cap: bytes | None) -> None:
        status = self.engine.submit([TransferRequest(op, region, local, seg, remote, n, cap)]
                                    ).wait(self._timeout)[0]
        if status.state is not State.COMPLETED:
            raise TransferError(f"staging in the relay {seg}: {status.reason or 'timed out'}")

    def close(self) -> None:
        for address in list(self._conns):
            self._drop(address)
        if self._scratch is not None:
            self.engine.unregister(self._scratch)
            self._scratch = None
