"""What a server has done with the test's TCP connections, seen from outside it: which ones it
hung up on, and whether it has read every byte sent to it (the kernel's queues, /proc/net/tcp)."""

from __future__ import annotations

import selectors
import socket
from collections.abc import Iterable

from tests.conftest import wait_for

ESTABLISHED = "01"  # the state column of /proc/net/tcp


def wait_hung_up(socks: Iterable[socket.socket], n: int, timeout: float = 120.0) -> None:
    """Wait until the server has closed at least `n` of `socks` (each sees EOF or a reset);
    for sockets it sends nothing to unasked, so readable means closed."""
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    closed = 0

    def enough() -> bool:
        nonlocal closed
        for key, _ in sel.select(0):
            sel.unregister(key.fileobj)
            closed += 1
        return closed >= n
    try:
        wait_for(enough, timeout, what=f"the server to close {n} of its idle connections")
    finally:
        sel.close()


def unread(port: int, clients: set[int]) -> int:
    """Bytes sent on the open connections from local ports `clients` to the listener on
    `port` (127.0.0.1) that its process has not read yet: still in the sender's queue, or in
    its receive queue."""
    left = 0
    with open("/proc/net/tcp", encoding="ascii") as fh:
        next(fh)
        for line in fh:
            f = line.split()
            local, remote = int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16)
            if f[3] != ESTABLISHED:
                continue
            tx, rx = (int(x, 16) for x in f[4].split(":"))
            if local in clients and remote == port:
                left += tx
            elif local == port and remote in clients:
                left += rx
    return left


def wait_read(port: int, socks: Iterable[socket.socket], timeout: float = 60.0) -> None:
    """Wait until the listener on `port` has read every byte sent to it on `socks`."""
    clients = {s.getsockname()[1] for s in socks}
    wait_for(lambda: unread(port, clients) == 0, timeout,
             what=f"the server on port {port} to read what {len(clients)} connections sent")
