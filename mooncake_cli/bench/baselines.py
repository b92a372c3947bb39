"""Physical references measured in the same run as the engine: a plain one-socket Python
stream between two processes (for tcp) and single-thread numpy memcpy (for shm).

The socket reference uses default socket options and `sendall`/`recv_into` of whole blocks:
what a Python program gets from a loopback TCP stream with no protocol on top. The peer runs
as `python -m mooncake_cli.bench.baselines socket PORT OP BLOCK DURATION`.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time

import numpy as np

from mooncake_cli.bench.stats import Child, Progress, Result, pump, summarize


def memcpy(block: int, duration: float, progress: Progress | None = None,
           op: str = "copy", label: str = "memcpy") -> Result:
    """Copy one `block`-byte numpy array into another for `duration` seconds, one thread."""
    src = np.full(block, 0x5A, dtype=np.uint8)
    dst = np.zeros(block, dtype=np.uint8)
    np.copyto(dst, src)
    lat: list[float] = []
    done = threading.Event()

    def loop() -> None:
        clock, copy, add = time.perf_counter, np.copyto, lat.append
        now = t0[0] = clock()
        deadline = now + duration
        while now < deadline:
            copy(dst, src)
            end = clock()
            add(end - now)
            now = end
        t0.append(now)
        done.set()

    t0 = [0.0]
    th = threading.Thread(target=loop, name="bench-memcpy", daemon=True)
    th.start()
    pump(done.is_set, duration, label, progress)
    th.join()
    ok = bool((dst == src).all())
    return summarize("memcpy", "numpy", op, block, 1, 1, len(lat) * block, len(lat),
                     t0[1] - t0[0], lat, ok, "single-thread numpy.copyto")


def _recv_block(sock: socket.socket, view: memoryview) -> int:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            return got
        got += k
    return got


def socket_stream(op: str, block: int, duration: float, progress: Progress | None = None,
                  label: str = "socket") -> Result:
    """One loopback TCP stream to a child process: we send (write) or receive (read) blocks."""
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    lsock.settimeout(30)
    argv = [sys.executable, "-m", "mooncake_cli.bench.baselines", "socket", str(port), op,
            str(block), str(duration)]
    with Child(argv, "the plain-socket peer") as child:
        conn, _ = lsock.accept()
        lsock.close()
        conn.settimeout(max(30.0, duration * 4))
        buf = memoryview(bytearray(block))
        lat: list[float] = []
        result: dict[str, float] = {}

        def loop() -> None:
            clock = time.perf_counter
            now = start = clock()
            nbytes = 0
            if op == "write":
                deadline = start + duration
                while now < deadline:
                    conn.sendall(buf)
                    end = clock()
                    lat.append(end - now)
                    now = end
                conn.shutdown(socket.SHUT_WR)
                (nbytes,) = struct.unpack("<Q", conn.recv(8))  # the peer got them all
            else:
                while True:
                    k = _recv_block(conn, buf)
                    end = clock()
                    nbytes += k
                    if k < block:
                        break
                    lat.append(end - now)
                    now = end
            result.update(bytes=nbytes, seconds=clock() - start)

        th = threading.Thread(target=loop, name="bench-socket", daemon=True)
        th.start()
        pump(lambda: not th.is_alive(), duration, label, progress)
        conn.close()
        if "bytes" not in result:
            raise OSError("the plain-socket reference failed" + (
                f": {child.stderr_tail()}" if child.stderr_tail() else ""))
    n = int(result["bytes"])
    return summarize("socket", "tcp", op, block, 1, 1, n, n // block, result["seconds"], lat,
                     None, "one plain Python socket, default options")


def _peer(port: int, op: str, block: int, duration: float) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    buf = memoryview(bytearray(block))
    if op == "write":  # we receive everything, then say how much arrived
        total = 0
        while (k := _recv_block(sock, buf)) > 0:
            total += k
        sock.sendall(struct.pack("<Q", total))
    else:  # we send for `duration`
        deadline = time.perf_counter() + duration
        while time.perf_counter() < deadline:
            sock.sendall(buf)
        sock.shutdown(socket.SHUT_WR)
    sock.close()


if __name__ == "__main__":
    if len(sys.argv) != 6 or sys.argv[1] != "socket":
        sys.exit("usage: python -m mooncake_cli.bench.baselines socket PORT OP BLOCK DURATION")
    _peer(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
