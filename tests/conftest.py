"""Shared fixtures: a real etcd, transfer targets in real separate processes, an HTTP metadata
server, and a few helpers (wait-for-condition, free ports)."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.helpers import skips
from tests.helpers.procs import Child, child_env

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")


# -- helpers ----------------------------------------------------------------------------------
def wait_for(cond: Callable[[], T], timeout: float, interval: float = 0.02,
             what: str = "condition") -> T:
    """Poll `cond` until it returns something truthy (returned); fail the test after `timeout`
    seconds. The plugins' tests use it too (their pytest config puts the repository on
    sys.path)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)  # sleep: poll


async def async_wait_for(cond: Callable[[], T], timeout: float, interval: float = 0.005,
                         what: str = "condition") -> T:
    """wait_for inside an event loop: the loop runs (other tasks, callbacks) between looks."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)  # sleep: poll


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- etcd -------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real single-member etcd on free loopback ports; yields "etcd://127.0.0.1:PORT"."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("the `etcd` binary is not on PATH: install etcd-server (Debian) to run the "
                    "etcd metadata tests")
    data = tmp_path_factory.mktemp("etcd")
    log = open(data / "etcd.log", "wb")  # noqa: SIM115 - closed on teardown
    for _attempt in range(3):  # a free port can be taken between probing and binding
        client, peer = free_port(), free_port()
        curl, purl = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        proc = subprocess.Popen(
            [binary, "--name", "mooncake-test", "--data-dir", str(data / f"data-{client}"),
             "--listen-client-urls", curl, "--advertise-client-urls", curl,
             "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
             "--initial-cluster", f"mooncake-test={purl}",
             "--initial-cluster-state", "new", "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        healthy = False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{curl}/health", timeout=1) as resp:
                    healthy = json.loads(resp.read()).get("health") == "true"
            except OSError:
                pass
            if healthy:
                break
            time.sleep(0.05)  # sleep: poll
        if healthy:
            break
        proc.kill()
        proc.wait()
    else:
        log.close()
        pytest.fail(f"etcd did not start: see {data / 'etcd.log'}:\n"
                    f"{(data / 'etcd.log').read_text(errors='replace')[-2000:]}")
    try:
        yield f"etcd://127.0.0.1:{client}"
    finally:
        proc.kill()
        proc.wait()
        log.close()


# -- an HA store master in-process --------------------------------------------------------------
@pytest.fixture
def durable() -> Iterator[tuple[Any, Any]]:
    """An in-process store MasterService answering as an HA leader does (durable acks), on a
    free port, and a zmq context for peers of it: (service, ctx)."""
    import zmq

    from mooncake_cli.store import StoreMaster
    from mooncake_cli.store.service import MasterService

    service = MasterService(StoreMaster(), port=0)
    service.acks.durable = True  # as HaMaster sets it
    ctx: zmq.Context[Any] = zmq.Context()
    yield service, ctx
    ctx.destroy(linger=0)
    service.close()


# -- HTTP metadata server ---------------------------------------------------------------------
@pytest.fixture
def metadata_server() -> Iterator[object]:
    """An in-process MetadataServer on a free loopback port; `.url` is its metadata URL."""
    from mooncake_cli.transfer.metadata_http import MetadataServer

    server = MetadataServer("127.0.0.1", 0).start()
    try:
        yield server
    finally:
        server.close()


# -- transfer targets in separate processes ---------------------------------------------------
@dataclass
class Target:
    """A `mooncake transfer serve` child process and what its ready line said."""

    child: Child
    segment: str
    address: str
    offset: int
    size: int
    ready: dict[str, object] = field(default_factory=dict)

    def __iter__(self) -> Iterator[object]:
        """Unpacks as (segment name, process)."""
        return iter((self.segment, self.proc))

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.child.popen

    @property
    def pid(self) -> int:
        return self.child.pid

    def kill(self) -> None:
        """SIGKILL and reap (a zombie still answers kill(pid, 0)), then drop its shm files."""
        self.child.kill()

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM (the graceful way) and wait; the exit code (TimeoutExpired, the target
        killed, past `timeout` seconds)."""
        code = self.child.stop(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.child.cmd, timeout)
        return code


def start_target(buffer_size: int, metadata: str | None = None, secret: str | None = None,
                 name: str | None = None, env: dict[str, str] | None = None,
                 private: bool = False) -> Target:
    """Start `python -m mooncake_cli --json transfer serve` and wait for its ready line."""
    cmd = [sys.executable, "-m", "mooncake_cli", "--json", "transfer", "serve",
           "--buffer-size", str(buffer_size)]
    if metadata:
        cmd += ["--metadata", metadata]
    if secret:
        cmd += ["--secret", secret]
    if name:
        cmd += ["--name", name]
    if private:
        cmd += ["--private"]
    child = Child(cmd, child_env(**(env or {})))
    ready = child.ready_line()
    return Target(child, str(ready["segment"]), str(ready["address"]), int(ready["offset"]),
                  int(ready["size"]), ready)


@pytest.fixture
def spawn_target() -> Iterator[Callable[..., Target]]:
    """A factory of target processes; every one still running is terminated on teardown."""
    started: list[Target] = []

    def spawn(buffer_size: int = 8 << 20, **kw: object) -> Target:
        t = start_target(buffer_size, **kw)  # type: ignore[arg-type]
        started.append(t)
        return t

    yield spawn
    for t in started:
        t.child.stop(10)  # killed past that; its shm files and pipes go either way


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    """One 32 MiB target process shared by a module's tests (each test uses its own bytes)."""
    t = start_target(32 << 20)
    yield t
    t.child.stop(10)


# -- in-process engines -----------------------------------------------------------------------
@pytest.fixture
def make_engine() -> Iterator[Callable[..., object]]:
    """A factory of in-process TransferEngines (config as keywords); all closed on teardown."""
    from mooncake_cli.config import TransferConfig
    from mooncake_cli.registry import Registry
    from mooncake_cli.transfer.engine import TransferEngine

    engines: list[TransferEngine] = []

    def make(registry: Registry | None = None, **cfg: object) -> TransferEngine:
        engine = TransferEngine(TransferConfig(**cfg), registry or Registry())  # type: ignore[arg-type]
        engines.append(engine)
        return engine

    yield make
    for engine in reversed(engines):
        engine.close()


# -- skips: only those the host's hardware explains (tests/helpers/skips.py) --------------------
_SKIPPED: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append((report.nodeid, skips.reason_of(report.longrepr)))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a whole module skipped (importorskip at its top)
        _SKIPPED.append((report.nodeid, skips.reason_of(report.longrepr)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    bad = skips.unexpected(_SKIPPED)
    if not bad:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", f"{len(bad)} skip(s) not expected on any host (the set-up "
                                f"missed something): tests/helpers/skips.py", red=True)
        for line in bad:
            reporter.write_line(line)
    if exitstatus == 0:
        session.exitstatus = 1
