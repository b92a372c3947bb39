"""The master's side of the same-host lane (see fastlane.py): the engine's `Door` (the secret
handshake, a bounded table of served connections, one thread each) on a Unix socket."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

from mooncake_cli.store.wire import protocol
from mooncake_cli.store.wire.lane_frames import (
    IDLE_TIMEOUT,
    IO_TIMEOUT,
    MAGIC,
    MASTER_SPIN,
    MAX_LANES,
    frame,
    lane_name,
    read_frames,
    spin,
)
from mooncake_cli.transfer import wire
from mooncake_cli.transfer.door import Door
from mooncake_cli.transfer.served import Entry

log = logging.getLogger("mooncake.store")
MAX_SPINNERS = 1  # connection threads polling for their next request at once (they share a GIL)
CROWD = 0.005  # seconds: two connections' requests this close make the master poll for neither
Send = Callable[[bytes], None]


class LaneServer:
    """Serves `serve(frames, send)` on the lane of `address`: it answers each request by
    `send(reply body)` once (signed with `secret` here), and may work on after sending."""

    def __init__(self, address: str, serve: Callable[[list[bytes], Send], None],
                 secret: bytes | None, max_lanes: int = MAX_LANES) -> None:
        self._serve_one, self._secret = serve, secret
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(lane_name(address))
            sock.listen(256)
        except OSError:
            sock.close()
            raise
        self._spinners = threading.BoundedSemaphore(MAX_SPINNERS)
        self._last = (0, 0.0)  # (the connection, when) of the last request
        self._crowd_until = 0.0
        self._door = Door(sock, MAGIC, secret.decode() if secret else None, self._serve,
                          "mooncake-store-lane", limit=max_lanes, pending=64)
        self.served = self._door.served

    def _serve(self, entry: Entry) -> None:
        conn = entry.conn
        rest: list[bytes] = []

        def send(body: bytes) -> None:
            if data := self._send(conn, body):
                rest.append(data)
        try:
            wire.blocking_with_timeout(conn, IO_TIMEOUT)
            while True:
                self._await(conn)
                frames = read_frames(conn, idle_ok=True)
                if frames is None:
                    if self._door.idle_for(entry) > IDLE_TIMEOUT:
                        return
                    continue
                if not self._door.claim(entry):
                    return
                self._note(entry)
                self._serve_one(frames, send)
                for data in rest:  # what the socket did not take at once, sent now (the
                    conn.sendall(data)  # master's lock let go: a peer that does not read
                rest.clear()  # stalls its own lane only)
                self._door.release(entry)
        except (OSError, ConnectionError) as e:
            log.debug("store lane connection ends: %s", e)

    def _note(self, entry: Entry) -> None:
        now, (last, when) = time.monotonic(), self._last
        if last != id(entry) and now - when < CROWD:
            self._crowd_until = now + CROWD
        self._last = (id(entry), now)

    def _await(self, conn: socket.socket) -> None:
        """Poll for the next request a while (MASTER_SPIN) where no more than MAX_SPINNERS
        connections poll already and one client alone has been calling (for CROWD seconds):
        its next call often follows its last answer within that time, and this thread then
        needs no wakeup. Polling threads would hold up the others' (one GIL). The read that
        follows blocks."""
        if (MASTER_SPIN and time.monotonic() >= self._crowd_until
                and self._spinners.acquire(blocking=False)):
            try:
                spin(conn, MASTER_SPIN)
            finally:
                self._spinners.release()

    def _send(self, conn: socket.socket, body: bytes) -> bytes:
        """Send the frames of `body` as far as the socket takes them without waiting; the
        rest."""
        data = frame(body, protocol.mac(self._secret, body) if self._secret else b"")
        try:
            return data[conn.send(data, socket.MSG_DONTWAIT):]
        except BlockingIOError:
            return data

    def close(self) -> None:
        self._door.close()  # the name is free once it returns


def serve_lane(address: str, serve: Callable[[list[bytes], Send], None],
               secret: bytes | None) -> LaneServer | None:
    """A LaneServer for `address`, or None (logged) where Unix sockets or the name are not to
    be had: clients then use zmq."""
    try:
        return LaneServer(address, serve, secret)
    except (OSError, AttributeError) as e:
        log.info("no same-host store lane for %s: %s", address, e)
        return None


