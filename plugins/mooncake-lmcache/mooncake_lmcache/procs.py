"""Real servers in their own processes, for the plugin's tests and bench: a store master and
store nodes (`mooncake store master` / `mooncake store serve`, as a user starts them) and a
`redis-server` (Debian's) on a free loopback port."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

READY_TIMEOUT = 60.0  # seconds a child gets to say it is ready (2 shared cores, cold caches)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _ready(proc: subprocess.Popen[bytes], what: str) -> dict[str, Any]:
    """The child's JSON ready line; RuntimeError with its output when it does not come."""
    assert proc.stdout is not None
    line = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + READY_TIMEOUT
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                line += chunk
    try:
        ready = dict(json.loads(line))
        if ready.get("event") == "ready":
            return ready
    except ValueError:
        pass
    _stop(proc)
    raise RuntimeError(f"{what} did not become ready: {line!r}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    for name in os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []:
        if name.startswith(f"mooncake-{proc.pid}-"):  # what a killed node leaves behind
            try:
                os.unlink(f"/dev/shm/{name}")
            except OSError:
                pass


class StoreProcs:
    """A store master on loopback `port` (extra master flags in `flags`) and its nodes."""

    def __init__(self, port: int, *flags: str) -> None:
        self.master = f"127.0.0.1:{port}"
        self._master = self._start("store master", "master", "--port", str(port), *flags)
        self.nodes: list[subprocess.Popen[bytes]] = []

    @staticmethod
    def _start(what: str, *args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "mooncake_cli", "--json", "store", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env())
        _ready(proc, what)
        return proc

    def add_node(self, segment_size: int) -> subprocess.Popen[bytes]:
        """A node contributing `segment_size` bytes of DRAM."""
        node = self._start("store node", "serve", "--master", self.master,
                           "--segment-size", str(segment_size))
        self.nodes.append(node)
        return node

    def kill(self) -> None:
        """The whole store goes away at once (SIGKILL: nothing is unmounted)."""
        for proc in [*self.nodes, self._master]:
            _stop(proc)

    def close(self) -> None:
        self.kill()


class RedisServer:
    """Debian's `redis-server` on a free loopback port, no persistence; `url` is redis://."""

    def __init__(self, maxmemory: str = "2gb") -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install "
                               "redis-server; plugins/mooncake-lmcache/ci.sh does it)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        self.dir = tempfile.mkdtemp(prefix="mooncake-lmcache-redis-")
        self.proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--maxmemory", maxmemory, "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._pong(port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"redis-server did not answer on port {port}")
            time.sleep(0.05)

    @staticmethod
    def _pong(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
