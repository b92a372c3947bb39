"""The transport service-provider interface is enough to write a transport: `Pipe`, below, is
written against mooncake_cli.transfer.spi alone. It serves reads and writes on a Unix socket
of its own behind the engine's door (the engine checks the secret, not the transport), and two
engines that have no other transport (no `tcp`) move bytes through it. A static check keeps
the built-in transports and mooncake_cli.testing on the same footing: they import nothing of
mooncake_cli but the SPI module."""

from __future__ import annotations

import ast
import importlib.metadata as md
import os
import socket
import struct
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from mooncake_cli.transfer.spi import (
    Connection,
    EngineSide,
    SegmentDescriptor,
    TransferError,
    prove,
)

REPO = Path(__file__).resolve().parents[2]
T, TIERS = "mooncake.transports", "mooncake.tiers"
MAGIC = b"MCP"
HEAD = struct.Struct("<BQQ")  # op (0 read, 1 write), offset, length
MiB = 1 << 20
SECRET = "pipe-secret"


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("closed")
        got += k


class PipeChannel:
    def __init__(self, address: str, secret: str | None, timeout: float) -> None:
        self.broken, self.spin = False, True
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(address)
            prove(self._sock, MAGIC, secret, "pipe")
        except (OSError, TransferError) as e:
            self._sock.close()
            raise TransferError(f"pipe: {e}") from e

    def _ask(self, op: int, off: int, n: int) -> None:
        self._sock.sendall(HEAD.pack(op, off, n))

    def _answer(self) -> None:
        status = self._sock.recv(1)
        if status != b"\x00":
            raise TransferError("pipe: the peer refused the request")

    def read(self, remote_offset: int, dst: memoryview) -> None:
        self._ask(0, remote_offset, len(dst))
        self._answer()
        recv_exact(self._sock, dst)

    def write(self, remote_offset: int, src: memoryview) -> None:
        self._ask(1, remote_offset, len(src))
        self._answer()
        self._sock.sendall(src)
        self._answer()

    def close(self) -> None:
        self._sock.close()


class PipeEndpoint:
    def __init__(self, engine: EngineSide) -> None:
        self._engine = engine
        self.address = f"\0mooncake-pipe-test/{uuid.uuid4().hex}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.address)
        sock.listen(16)
        self._door = engine.door(sock, MAGIC, self._serve, "pipe-test", limit=8)

    def _serve(self, c: Connection) -> None:
        conn, head = c.conn, memoryview(bytearray(HEAD.size))
        while True:
            try:
                recv_exact(conn, head)
            except (ConnectionError, OSError):
                return
            if not self._door.claim(c):
                return
            op, off, n = HEAD.unpack(head)
            try:
                region, start = self._engine.segment.locate(off, n)
            except TransferError:
                conn.sendall(b"\x01")
                return
            conn.sendall(b"\x00")
            if op == 0:
                conn.sendall(region.load(start, n))
            else:
                sink = region.sink(start, n)
                recv_exact(conn, sink)
                region.commit(start, sink)
                conn.sendall(b"\x00")
            self._door.release(c)

    def register(self, region: Any) -> Mapping[str, str]:
        return {}

    def unregister(self, region: Any) -> None:
        pass

    def fields(self) -> Mapping[str, str]:
        return {"pipe": self.address[1:]}

    def connect(self, peer: SegmentDescriptor, secret: str | None,
                timeout: float) -> PipeChannel:
        return PipeChannel("\0" + peer.extra["pipe"], secret, timeout)

    def close(self) -> None:
        self._door.close()


class PipeTransport:
    name = "pipe"
    priority = 50
    inline_bytes = 1 << 20
    max_slices = 1

    def available(self) -> tuple[bool, str]:
        return True, ""

    def reachable(self, peer: SegmentDescriptor, local: SegmentDescriptor) -> tuple[bool, str]:
        if peer.boot_id == local.boot_id and peer.extra.get("pipe"):
            return True, "same host, a pipe door"
        return False, "no pipe door on this host"

    def attach(self, engine: EngineSide) -> PipeEndpoint:
        return PipeEndpoint(engine)


class Broken(PipeTransport):
    def attach(self, engine: EngineSide) -> PipeEndpoint:
        raise RuntimeError("no pipes here")


def pipe_only() -> Any:
    from mooncake_cli.registry import Registry

    return Registry([md.EntryPoint("pipe", "tests.integration.test_transport_spi:PipeTransport", T),
                     md.EntryPoint("dram", "mooncake_backends.dram:DramTier", TIERS)])


def test_a_transport_written_against_the_spi_alone_moves_bytes(make_engine) -> None:
    from mooncake_cli.transfer.batch import Op, State

    tgt = make_engine(registry=pipe_only(), secret=SECRET)
    eng = make_engine(registry=pipe_only(), secret=SECRET)
    assert sorted(tgt.endpoints.by_name) == ["pipe"]  # no tcp: the engine starts anyway
    region = tgt.allocate(2 * MiB)
    data = os.urandom(MiB)
    src = eng.register(bytearray(data))
    assert eng.transfer(Op.WRITE, src, 0, tgt.name, region.base + MiB, MiB).state \
        is State.COMPLETED
    assert eng.transport_for(tgt.name) == "pipe"
    assert bytes(region.view[MiB:2 * MiB]) == data
    back = eng.register(bytearray(MiB))
    assert eng.transfer(Op.READ, back, 0, tgt.name, region.base + MiB, MiB).state \
        is State.COMPLETED
    assert bytes(back.view) == data


def test_the_engine_checks_the_secret_at_a_transports_door(make_engine) -> None:
    from mooncake_cli.transfer.batch import Op, State, TransferRequest

    tgt = make_engine(registry=pipe_only(), secret=SECRET)
    region = tgt.allocate(MiB)
    desc = tgt.descriptor()
    address = "\0" + desc.extra["pipe"]
    with pytest.raises(TransferError, match="refused our secret"):
        PipeChannel(address, "wrong", 5)
    with pytest.raises(TransferError, match="requires a shared secret"):
        PipeChannel(address, None, 5)
    eng = make_engine(registry=pipe_only(), secret="wrong")  # its DESCRIBE is refused too
    src = eng.register(bytearray(MiB))
    [st] = eng.submit([TransferRequest(Op.WRITE, src, 0, tgt.name, region.base, MiB)]).wait(10)
    assert st.state is State.FAILED and "refused our secret" in st.reason
    assert bytes(region.view) == bytes(MiB)


def test_an_engine_without_a_data_transport_says_so(make_engine) -> None:
    from mooncake_cli.interfaces import ConfigError
    from mooncake_cli.registry import Registry
    reg = Registry([md.EntryPoint("dram", "mooncake_backends.dram:DramTier", TIERS)])
    with pytest.raises(ConfigError, match="no transport plugin is available"):
        make_engine(registry=reg)
    reg = Registry([md.EntryPoint("broken", "tests.integration.test_transport_spi:Broken", T)])
    with pytest.raises(ConfigError, match="no data transport .*pipe: RuntimeError: no pipes"):
        make_engine(registry=reg)


SPI = "mooncake_cli.transfer.spi"
PROVIDERS = ["backends/tcp", "backends/shm", "backends/nixl", "mooncake_cli/testing"]


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


@pytest.mark.parametrize("folder", PROVIDERS)
def test_transports_import_nothing_of_mooncake_cli_but_the_spi(folder: str) -> None:
    files = sorted((REPO / folder).glob("*.py"))
    assert files
    for f in files:
        core = {n for n in imports_of(f) if n.split(".")[0] == "mooncake_cli"}
        assert core <= {SPI} | {n for n in core if n.startswith(SPI + ".")}, (f, core)
