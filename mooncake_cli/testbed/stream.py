"""Raw TCP between two testbed hosts: Python socket streams (the reference a transfer is
measured against) and a connect check.

The receiver counts bytes from the first byte of any stream to the last stream's close, so
what sits in socket buffers when the sender stops is counted only once it has crossed the
link. Peers run as
`python -m mooncake_cli.testbed.stream recv ADDR STREAMS` and
`... send ADDR PORT SECONDS STREAMS`; the check as `... listen ADDR` and
`... connect PORT TIMEOUT ADDR...`.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
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


def _recv(addr: str, streams: int) -> None:
    lsock = socket.create_server((addr, 0))
    lsock.settimeout(60)
    print(json.dumps({"port": lsock.getsockname()[1]}), flush=True)
    conns = [lsock.accept()[0] for _ in range(streams)]
    got = [0] * streams
    first: list[float] = []
    last: list[float] = []

    def drain(i: int) -> None:
        conn, buf = conns[i], bytearray(BLOCK)
        conn.settimeout(60)
        while True:
            k = conn.recv_into(buf)
            if not k:
                break
            if not got[i]:
                first.append(time.perf_counter())
            got[i] += k
        last.append(time.perf_counter())

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = max(last) - min(first) if first else 0.0
    print(json.dumps({"bytes": sum(got), "seconds": seconds}), flush=True)


def _send(addr: str, port: int, seconds: float, streams: int) -> None:
    conns = [socket.create_connection((addr, port), timeout=30) for _ in range(streams)]
    end = time.perf_counter() + seconds

    def pour(conn: socket.socket) -> None:
        block = bytes(BLOCK)
        while time.perf_counter() < end:
            conn.sendall(block)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # the receiver's close: everything sent has arrived
        conn.close()

    threads = [threading.Thread(target=pour, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _listen(addr: str) -> None:
    lsock = socket.create_server((addr, 0))
    print(json.dumps({"port": lsock.getsockname()[1]}), flush=True)
    while True:
        lsock.accept()[0].close()


def _connect(port: int, timeout: float, addrs: list[str]) -> None:
    result: dict[str, str] = {}
    for addr in addrs:
        try:
            socket.create_connection((addr, port), timeout=timeout).close()
            result[addr] = "ok"
        except OSError as e:
            result[addr] = str(e)
    print(json.dumps(result), flush=True)


def _in(bed: Testbed, host: str, args: list[str]) -> tuple[list[str], dict[str, str]]:
    return exec_argv(bed, host, [sys.executable, "-m", "mooncake_cli.testbed.stream", *args])


def measure(bed: Testbed, src: str, dst: str, seconds: float, streams: int = 1,
            dst_addr: str | None = None) -> StreamResult:
    """`streams` parallel streams from `src` to `dst`'s address (its first, or `dst_addr`)
    for `seconds`."""
    addr = dst_addr or bed.address(dst)
    argv, env = _in(bed, dst, ["recv", addr, str(streams)])
    with Child(argv, f"the stream receiver on {dst}", env) as rx:
        port = int(rx.line(timeout=30)["port"])
        argv, env = _in(bed, src, ["send", addr, str(port), str(seconds),
                                      str(streams)])
        with Child(argv, f"the stream sender on {src}", env) as tx:
            done = rx.line(timeout=seconds + 60)
            tx.proc.wait(timeout=30)
    return StreamResult(int(done["bytes"]), float(done["seconds"]))


class Listener:
    """A process in `host`'s namespace that accepts (and closes) connections on `addr`
    (default: every address), until closed."""

    def __init__(self, bed: Testbed, host: str, addr: str = "0.0.0.0") -> None:
        argv, env = _in(bed, host, ["listen", addr])
        self._child = Child(argv, f"the listener on {host}", env)
        try:
            self.port = int(self._child.line(timeout=30)["port"])
        except BaseException:
            self._child.close()
            raise

    def close(self) -> None:
        self._child.close()


def connect(bed: Testbed, src: str, port: int, addrs: list[str],
            timeout: float = 5.0) -> dict[str, str]:
    """From `src`, a TCP connect to `port` on each of `addrs`: "ok" or the error, per address."""
    argv, env = _in(bed, src, ["connect", str(port), str(timeout), *addrs])
    with Child(argv, f"the connect check on {src}", env) as child:
        return {str(k): str(v) for k, v in child.line(timeout=30 + timeout * len(addrs)).items()}


def main(argv: list[str]) -> None:
    what, addr = argv[0], argv[1]
    if what == "recv":
        _recv(addr, int(argv[2]))
    elif what == "send":
        _send(addr, int(argv[2]), float(argv[3]), int(argv[4]))
    elif what == "listen":
        _listen(addr)
    elif what == "connect":
        _connect(int(argv[1]), float(argv[2]), argv[3:])
    else:
        raise SystemExit(f"unknown stream role {what}")


if __name__ == "__main__":
    main(sys.argv[1:])
