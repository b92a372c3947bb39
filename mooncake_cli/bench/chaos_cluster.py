"""The cluster `bench chaos` breaks: real processes on loopback, a local etcd when none is given.

    with ChaosCluster(etcd_url, ha=True, segment_size=256 << 20) as cluster:
        killed_at = cluster.kill_leader()      # SIGKILL, as a crash would
        cluster.add_master()                   # bring the count back

HA: `masters` x `python -m mooncake_cli.store.service --ha etcd://.../CLUSTER` and the store
nodes (`mooncake store serve`) following the leader through etcd. Without HA: one master and
the nodes on its address. Every child gets SIGTERM if the benchmark dies (stats.Child).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from typing import Any

from mooncake_cli.bench.stats import Child
from mooncake_cli.interfaces import ConfigError, MooncakeError
from mooncake_cli.store.errors import StoreError
from mooncake_cli.store.ha.leader import LeaderInfo, LeaderResolver

START_TIMEOUT = 60.0  # seconds a child has to say it is ready (cold caches, a loaded machine)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalEtcd:
    """A single-member etcd from PATH on free loopback ports, its data in a temporary folder."""

    def __init__(self) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise ConfigError("bench chaos needs etcd: install it (scripts/setup.sh does) or "
                              "give --etcd etcd://HOST:PORT")
        self._dir = tempfile.TemporaryDirectory(prefix="mooncake-chaos-etcd-")
        client, peer = _free_port(), _free_port()
        curl, purl = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        self._log = open(os.path.join(self._dir.name, "etcd.log"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [binary, "--name", "chaos", "--data-dir", os.path.join(self._dir.name, "data"),
             "--listen-client-urls", curl, "--advertise-client-urls", curl,
             "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
             "--initial-cluster", f"chaos={purl}", "--initial-cluster-state", "new",
             "--log-level", "warn"], stdout=self._log, stderr=subprocess.STDOUT)
        self.url = f"etcd://127.0.0.1:{client}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{curl}/health", timeout=1) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.close()
        raise MooncakeError("the local etcd did not become healthy within 30 s")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()
        self._dir.cleanup()


class ChaosCluster:
    """Masters and store nodes in child processes; `url` is what clients are given."""

    def __init__(self, etcd: str | None, ha: bool, segment_size: int, masters: int = 3,
                 nodes: int = 2) -> None:
        self.ha = ha
        self._etcd: LocalEtcd | None = None
        self.masters: dict[str, Child] = {}  # by address
        self._nodes: list[Child] = []
        try:
            if ha:
                if not etcd:
                    self._etcd = LocalEtcd()
                    etcd = self._etcd.url
                self.url = f"{etcd.rstrip('/')}/chaos{uuid.uuid4().hex[:8]}"
                self.resolver: LeaderResolver | None = LeaderResolver(self.url)
                for _ in range(masters):
                    self.add_master()
                self.leader(START_TIMEOUT)
            else:
                self.resolver = None
                self.url = self.add_master()
            for _ in range(nodes):
                self._nodes.append(self._start(
                    [sys.executable, "-m", "mooncake_cli", "--json", "store", "serve",
                     "--master", self.url, "--segment-size", str(segment_size)],
                    "a store node")[0])
        except BaseException:
            self.close()
            raise

    def _start(self, argv: list[str], what: str) -> tuple[Child, dict[str, Any]]:
        return self._ready(Child(argv, what), what)

    @staticmethod
    def _ready(child: Child, what: str) -> tuple[Child, dict[str, Any]]:
        try:
            info = child.line(START_TIMEOUT)
        except BaseException:
            child.close()
            raise
        if info.get("event") != "ready":
            child.close()
            raise MooncakeError(f"{what} did not start: {info}")
        return child, info

    def spawn_master(self) -> Child:
        """Start one more master (an HA candidate with HA); `adopt` it once it is up. Call
        from the thread that lives longest: a child dies with the thread that started it."""
        argv = [sys.executable, "-m", "mooncake_cli.store.service", "--port", "0"]
        return Child(argv + (["--ha", self.url] if self.ha else []), "a store master")

    def adopt(self, child: Child) -> str:
        """Wait for a spawned master's ready line; its address."""
        child, info = self._ready(child, "a store master")
        address = str(info["address"])
        self.masters[address] = child
        return address

    def add_master(self) -> str:
        return self.adopt(self.spawn_master())

    def leader(self, within: float = 10.0) -> LeaderInfo:
        """The leader etcd names, once one is named and it runs (HA only)."""
        assert self.resolver is not None
        deadline = time.monotonic() + within
        while True:
            try:
                info = self.resolver.lookup()
            except StoreError:
                info = None
            if info is not None and info.address in self.masters:
                return info
            if time.monotonic() > deadline:
                raise MooncakeError(f"no store leader within {within:g} s")
            time.sleep(0.02)

    def kill_leader(self) -> float:
        """SIGKILL the leading master; the time.monotonic() of the kill."""
        info = self.leader()
        child = self.masters.pop(info.address)
        child.proc.kill()
        killed = time.monotonic()
        child.proc.wait()
        child.close()
        return killed

    def describe(self) -> dict[str, Any]:
        return {"ha": self.ha, "masters": len(self.masters), "nodes": len(self._nodes),
                "url": self.url}

    def close(self) -> None:
        for child in [*self._nodes, *self.masters.values()]:
            child.close()
        self._nodes, self.masters = [], {}
        if self._etcd is not None:
            self._etcd.close()
            self._etcd = None

    def __enter__(self) -> ChaosCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
