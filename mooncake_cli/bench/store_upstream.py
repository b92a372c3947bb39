"""The store workload through upstream's wheel: its `mooncake_master` and a
`MooncakeDistributedStore` (protocol tcp, P2PHANDSHAKE metadata), each in its own process.

    python -m mooncake_cli.bench.store_upstream client '{"master": ..., "segment": ...}'
    python -m mooncake_cli.bench.store_upstream holder '{"master": ..., "segment": ...}'

A client reads one job (a workload row as JSON) per stdin line and answers each with one
result line; a holder only contributes its segment (the "replica on the other client" mode).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import IO, Any

from mooncake_cli.bench.stats import Child, Progress, Result, await_line, emit
from mooncake_cli.bench.store_workload import Row, run_row
from mooncake_cli.interfaces import MooncakeError
from mooncake_cli.signals import stop_signals

QUIET = {"GLOG_minloglevel": "2"}
MODULE = "mooncake_cli.bench.store_upstream"
BUFFER = 256 << 20  # upstream's local_buffer_size: room to stage a 16 x 4 MiB batch


def master_binary() -> str | None:
    """Upstream's `mooncake_master`: next to the wheel's package, or on PATH."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("mooncake")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        path = os.path.join(os.path.dirname(spec.origin), "mooncake_master")
        if os.access(path, os.X_OK):
            return path
    return shutil.which("mooncake_master")


def available() -> tuple[bool, str]:
    """Whether upstream's store imports and its master binary exists (checked in a child)."""
    from mooncake_cli.bench.upstream import INSTALL

    if master_binary() is None:
        return False, f"upstream's mooncake_master is not installed; {INSTALL}"
    try:
        p = subprocess.run([sys.executable, "-c", "from mooncake.store import "
                            "MooncakeDistributedStore"], capture_output=True, text=True,
                           timeout=60, env={**os.environ, **QUIET})
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"cannot check for the upstream wheel: {e}"
    if p.returncode == 0:
        return True, ""
    last = (p.stderr.strip().splitlines() or ["import failed"])[-1]
    return False, f"upstream's mooncake.store does not import ({last}); {INSTALL}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class UpstreamMaster:
    """Upstream's `mooncake_master` on a free loopback port."""

    def __init__(self, *flags: str) -> None:
        """`flags`: more of upstream's master flags (--name=value)."""
        binary = master_binary()
        if binary is None:
            raise MooncakeError("upstream's mooncake_master is not installed")
        self.port = _free_port()
        argv = [binary, f"--rpc_port={self.port}", "--rpc_address=127.0.0.1",
                f"--metrics_port={_free_port()}", "--metrics_host=127.0.0.1",
                "--rpc_enable_tcp_no_delay=true", *flags]
        self.address = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env={**os.environ, **QUIET})
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise MooncakeError("upstream's mooncake_master did not start") from None
                time.sleep(0.05)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class UpstreamClient(Child):
    """A `MooncakeDistributedStore` in a child process that runs workload rows on request."""

    def __init__(self, master: str, segment: int, role: str = "client",
                 buffer: int = BUFFER) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="mooncake-bench-")
        fifo = os.path.join(self._dir.name, "jobs")
        os.mkfifo(fifo, 0o600)
        argv = [sys.executable, "-m", MODULE, role,
                json.dumps({"master": master, "segment": segment, "jobs": fifo,
                            "buffer": buffer})]
        super().__init__(argv, f"upstream's store {role}", QUIET)
        self._jobs: IO[str] | None = None
        try:
            self.info = self.line(timeout=60)
            if "error" in self.info:
                raise MooncakeError(f"upstream's store {role}: {self.info['error']}")
            if role == "client":  # the child opens the FIFO right after saying ready
                self._jobs = open(fifo, "w")  # noqa: SIM115 - closed in close()
        except BaseException:
            self.close()
            raise

    def close(self, grace: float = 5.0) -> None:
        if self._jobs is not None:
            try:
                self._jobs.close()
            except OSError:
                pass
            self._jobs = None
            try:  # EOF on the FIFO: the child unmounts and exits by itself
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        super().close(grace)
        self._dir.cleanup()

    def measure(self, row: Row, duration: float, iterations: int,
                progress: Progress | None = None, label: str = "upstream",
                via: str = "tcp") -> Result:
        jobs = self._jobs
        if jobs is None:
            raise MooncakeError("a holder runs no workload")
        jobs.write(json.dumps({**row.to_dict(), "duration": duration,
                               "iterations": iterations, "via": via}) + "\n")
        jobs.flush()
        got = await_line(lambda: self.line(timeout=duration + 300), duration, label, progress)
        if "error" in got:
            raise MooncakeError(f"upstream {row.op}: {got['error']}")
        return Result(**got)


class _Upstream:
    """The workload's Store over `MooncakeDistributedStore` (return codes become errors)."""

    def __init__(self, master: str, segment: int, buffer: int) -> None:
        from mooncake.store import MooncakeDistributedStore

        self.s = MooncakeDistributedStore()
        rc = self.s.setup("127.0.0.1", "P2PHANDSHAKE", segment, buffer, "tcp", "", master)
        if rc != 0:
            raise RuntimeError(f"setup returned {rc}")

    def put(self, key: str, value: bytes) -> None:
        if (rc := self.s.put(key, value)) != 0:
            raise RuntimeError(f"put {key!r} returned {rc}")

    def batch_put(self, keys: list[str], values: list[bytes]) -> None:
        if (rc := self.s.put_batch(keys, values)) != 0:
            raise RuntimeError(f"put_batch returned {rc}")

    def get(self, key: str) -> bytes:
        return bytes(self.s.get(key))

    def batch_get(self, keys: list[str]) -> list[bytes]:
        return list(self.s.get_batch(keys))

    def exists(self, key: str) -> bool:
        return bool(self.s.is_exist(key) == 1)

    def put_tensor(self, key: str, tensor: Any) -> None:
        if (rc := self.s.put_tensor(key, tensor)) != 0:
            raise RuntimeError(f"put_tensor {key!r} returned {rc}")

    def batch_put_tensor(self, keys: list[str], tensors: list[Any]) -> None:
        rcs = self.s.batch_put_tensor(keys, tensors)
        if any(rcs):
            raise RuntimeError(f"batch_put_tensor returned {rcs}")

    def get_tensor(self, key: str) -> Any:
        return self.s.get_tensor(key)

    def batch_get_tensor(self, keys: list[str]) -> list[Any]:
        return list(self.s.batch_get_tensor(keys))

    def clear(self) -> None:
        self.s.remove_all(True)


def _serve(role: str, job: dict[str, Any]) -> None:
    with stop_signals((signal.SIGTERM,)) as stop:
        store = _Upstream(job["master"], int(job["segment"]), int(job["buffer"]))
        emit({"event": "ready", "segment": store.s.get_hostname()})
        try:
            if role == "holder":
                while not stop.wait(0.2):
                    pass
                return
            with open(job["jobs"]) as jobs:
                for line in jobs:
                    _job(store, json.loads(line))
        finally:  # unmount: a segment left mounted would take replicas it can no longer serve
            store.s.close()


def _job(store: _Upstream, w: dict[str, Any]) -> None:
    try:
        r = run_row(store, Row(w["op"], int(w["size"]), int(w["batch"])), w["duration"],
                    w["iterations"], "upstream", w["via"])
        emit(r.to_dict())
    except Exception as e:
        emit({"error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("client", "holder"):
        try:
            _serve(sys.argv[1], json.loads(sys.argv[2]))
        except Exception as e:
            emit({"error": f"{type(e).__name__}: {e}"})
    else:
        sys.exit(f"usage: python -m {MODULE} client|holder JSON")
