"""The shm transport's descriptor lane: shared memory handed over as file descriptors.

A shm-backed region is a memfd: it has no name in /dev/shm, so no other process can open it.
Each engine listens on an abstract Unix socket (its `shm.lane` field); a same-host peer
connects, passes the engine's secret handshake (an `Admission`, magic b"MCF"), names a region, and
gets two descriptors back by SCM_RIGHTS: the region's memfd and a one-page memfd whose first
byte is 1 while the region is registered (0 after: mappings of it must not be used). An engine
with a secret makes its process non-dumpable (`guard_process`), so its descriptors cannot be
taken from /proc/PID/fd either.

    request  u16 name length | name (the region's `shm` field)
    answer   u8 status (0 ok, 1 unknown) | fds [memory, alive] when ok
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import socket
import struct
import uuid

from mooncake_cli.interfaces import TransferError
from mooncake_cli.transfer import wire
from mooncake_cli.transfer.admission import Admission
from mooncake_cli.transfer.served import Entry, Served

log = logging.getLogger("mooncake.transfer.shm")
MAGIC = b"MCF"
NAME = struct.Struct("<H")
MAX_LANES = 64
IO_TIMEOUT = 5.0


PR_SET_DUMPABLE = 4


def guard_process() -> bool:
    """Make this process non-dumpable: its /proc/PID/fd (where a memfd could be opened from)
    and /proc/PID/mem become root's, and other processes of the same user cannot ptrace it.
    Without that, the secret could not guard shared memory from the same user. False where
    the system does not allow it."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Shared:
    """A registered region's descriptors: its memory and its alive page (`fd` None: private
    memory, reached by cma.py; the lane then sends the alive page twice)."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.alive_fd = os.memfd_create("mooncake-alive", os.MFD_CLOEXEC)
        os.ftruncate(self.alive_fd, mmap.PAGESIZE)
        self.alive = mmap.mmap(self.alive_fd, mmap.PAGESIZE)
        self.alive[0] = 1

    def retire(self) -> None:
        self.alive[0] = 0  # every mapping of it sees this at its next request
        self.alive.close()
        os.close(self.alive_fd)


class FdLane:
    """Serves the descriptors of `regions` (shm name -> Shared) to peers proving `secret`."""

    def __init__(self, regions: dict[str, Shared], secret: str | None) -> None:
        self._regions = regions
        self.name = f"\0mooncake-shm/{os.getpid()}-{uuid.uuid4().hex[:12]}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.name)
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        self._served = Served(MAX_LANES, MAX_LANES)
        self._admission = Admission(sock, MAGIC, secret, self._admit, max_pending=64,
                          per_peer_pending=64, handshake_timeout=IO_TIMEOUT,
                          name="mooncake-shm-lane")

    def _admit(self, conn: socket.socket, peer: str) -> None:
        self._served.serve(conn, peer, self._serve, "mooncake-shm-lane-conn")

    def _serve(self, entry: Entry) -> None:
        conn = entry.conn
        try:
            wire.blocking_with_timeout(conn, IO_TIMEOUT)
            while True:
                try:
                    (n,) = NAME.unpack(wire.recv_exact(conn, NAME.size))
                except wire.PeerClosed:
                    return
                if not self._served.claim(entry):
                    return
                name = wire.recv_exact(conn, n).decode(errors="replace")
                shared = self._regions.get(name)
                if shared is None:
                    conn.sendall(b"\x01")
                else:
                    memory = shared.alive_fd if shared.fd is None else shared.fd
                    socket.send_fds(conn, [b"\x00"], [memory, shared.alive_fd])
                self._served.release(entry)
        except (OSError, ConnectionError) as e:
            log.debug("shm lane connection ends: %s", e)
        finally:
            self._served.remove(entry)
            conn.close()

    def close(self) -> None:
        self._admission.close()
        self._served.shutdown_all()


def fetch(lane: str, shm: str, secret: str | None, timeout: float) -> tuple[int, int]:
    """(memory fd, alive fd) of region `shm` from the peer's lane; TransferError says why not."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(lane)
        magic, version, auth, nonce = wire.HELLO.unpack(wire.recv_exact(sock, wire.HELLO.size))
        if magic != MAGIC or version != wire.VERSION:
            raise TransferError(f"{lane[1:]} is not a shm lane")
        if auth:
            if not secret:
                raise TransferError("the peer requires a shared secret: pass --secret or set "
                                    "MOONCAKE_SECRET")
            sock.sendall(wire.prove(secret, nonce))
            if wire.recv_exact(sock, 1) != b"\x00":
                raise TransferError("the peer refused our secret (wrong --secret?)")
        name = shm.encode()
        sock.sendall(NAME.pack(len(name)) + name)
        msg, fds, _flags, _addr = socket.recv_fds(sock, 1, 2)
        if msg != b"\x00" or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            raise TransferError(f"the peer does not share {shm} (unregistered?)")
        return fds[0], fds[1]
    except (OSError, ConnectionError) as e:
        raise TransferError(f"cannot reach the shm lane of the peer: {e}") from e
    finally:
        sock.close()
