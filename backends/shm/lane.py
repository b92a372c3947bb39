"""The shm transport's descriptor lane: shared memory handed over as file descriptors.

A shm-backed region is a memfd: it has no name in /dev/shm, so no other process can open it.
Each engine listens on an abstract Unix socket (its `shm.lane` field); a same-host peer
connects, passes the engine's secret handshake (`EngineSide.door`, magic b"MCF"), names a
region, and gets two descriptors back by SCM_RIGHTS: the region's memfd and a one-page memfd
whose first byte is 1 while the region is registered (0 after: mappings of it must not be
used). An engine with a secret makes its process non-dumpable (`guard_process`), so its
descriptors cannot be taken from /proc/PID/fd either.

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

from mooncake_cli.transfer.spi import Connection, EngineSide, TransferError, prove

log = logging.getLogger("mooncake.transfer.shm")
MAGIC = b"MCF"
NAME = struct.Struct("<H")
MAX_LANES = 64
IO_TIMEOUT = 5.0


PR_SET_DUMPABLE = 4


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


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
    """Serves the descriptors of `regions` (shm name -> Shared) to peers proving the engine's
    secret."""

    def __init__(self, regions: dict[str, Shared], engine: EngineSide) -> None:
        self._regions = regions
        self.name = f"\0mooncake-shm/{os.getpid()}-{uuid.uuid4().hex[:12]}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.name)
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        self._door = engine.door(sock, MAGIC, self._serve, "mooncake-shm-lane", MAX_LANES,
                                 IO_TIMEOUT)

    def _serve(self, entry: Connection) -> None:
        conn = entry.conn
        try:
            conn.settimeout(IO_TIMEOUT)
            while True:
                head = conn.recv(NAME.size)
                if not head:
                    return  # the peer closed between requests
                head += recv_exact(conn, NAME.size - len(head))
                (n,) = NAME.unpack(head)
                if not self._door.claim(entry):
                    return
                name = recv_exact(conn, n).decode(errors="replace")
                shared = self._regions.get(name)
                if shared is None:
                    conn.sendall(b"\x01")
                else:
                    memory = shared.alive_fd if shared.fd is None else shared.fd
                    socket.send_fds(conn, [b"\x00"], [memory, shared.alive_fd])
                self._door.release(entry)
        except (OSError, ConnectionError) as e:
            log.debug("shm lane connection ends: %s", e)

    def close(self) -> None:
        self._door.close()


def fetch(lane: str, shm: str, secret: str | None, timeout: float) -> tuple[int, int]:
    """(memory fd, alive fd) of region `shm` from the peer's lane; TransferError says why not."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(lane)
        prove(sock, MAGIC, secret, f"shm lane ({lane[1:]})")
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
