"""Raw TCP between two testbed hosts: one Python socket stream (the reference a transfer is
measured against) and a connect check.

The receiver counts bytes from the first byte to the sender's close, so what sits in socket
buffers when the sender stops is counted only once it has crossed the link. Peers run as
`python -m mooncake_cli.testbed.stream recv ADDR` and `... send ADDR PORT SECONDS`.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from dataclasses import dataclass

from mooncake_cli.bench.stats import Child
from mooncake_cli.testbed.bed import exec_argv
from mooncake_cli.testbed.state import Testbed

BLOCK = 1 << 20


@dataclass(frozen=True)
class StreamResult:
    """What the receiver counted."""

    bytes: int
    seconds: float

    @property
    def bits_per_s(self) -> float:
        return self.bytes * 8 / self.seconds if self.seconds > 0 else 0.0


def _recv(addr: str) -> None:
    lsock = socket.create_server((addr, 0))
    lsock.settimeout(60)
    print(json.dumps({"port": lsock.getsockname()[1]}), flush=True)
    conn, _ = lsock.accept()
    conn.settimeout(60)
    buf = bytearray(BLOCK)
    got, t0 = 0, 0.0
    while True:
        k = conn.recv_into(buf)
        if not k:
            break
        if not got:
            t0 = time.perf_counter()
        got += k
    print(json.dumps({"bytes": got, "seconds": time.perf_counter() - t0 if got else 0.0}),
          flush=True)


def _send(addr: str, port: int, seconds: float) -> None:
    conn = socket.create_connection((addr, port), timeout=30)
    block = bytes(BLOCK)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        conn.sendall(block)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)  # the receiver's close: everything sent has arrived
    conn.close()


def _connect(addr: str, port: int, timeout: float) -> None:
    socket.create_connection((addr, port), timeout=timeout).close()


def _in(bed: Testbed, host: str, args: list[str]) -> tuple[list[str], dict[str, str]]:
    return exec_argv(bed, host, [sys.executable, "-m", "mooncake_cli.testbed.stream", *args])


def measure(bed: Testbed, src: str, dst: str, seconds: float,
            dst_addr: str | None = None) -> StreamResult:
    """Stream from `src` to `dst`'s address (its first, or `dst_addr`) for `seconds`."""
    addr = dst_addr or bed.address(dst)
    argv, env = _in(bed, dst, ["recv", addr])
    with Child(argv, f"the stream receiver on {dst}", env) as rx:
        port = int(rx.line(timeout=30)["port"])
        argv, env = _in(bed, src, ["send", addr, str(port), str(seconds)])
        with Child(argv, f"the stream sender on {src}", env) as tx:
            done = rx.line(timeout=seconds + 60)
            tx.proc.wait(timeout=30)
    return StreamResult(int(done["bytes"]), float(done["seconds"]))


def main(argv: list[str]) -> None:
    what, addr = argv[0], argv[1]
    if what == "recv":
        _recv(addr)
    elif what == "send":
        _send(addr, int(argv[2]), float(argv[3]))
    elif what == "connect":
        _connect(addr, int(argv[2]), float(argv[3]))
    else:
        raise SystemExit(f"unknown stream role {what}")


if __name__ == "__main__":
    main(sys.argv[1:])
