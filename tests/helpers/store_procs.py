"""Real store processes for the store tests: a master (`python -m mooncake_cli.store.service`)
and store clients in their own processes (tests/helpers/store_node.py)."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
READY_TIMEOUT = 30.0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def read_line(proc: subprocess.Popen[bytes], timeout: float = READY_TIMEOUT) -> dict[str, Any]:
    """The next JSON line the child prints (AssertionError after `timeout` seconds)."""
    assert proc.stdout is not None
    line = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                chunk = proc.stdout.read1(1)  # type: ignore[attr-defined]
                if not chunk:
                    break
                line += chunk
    assert line.endswith(b"\n"), f"no line from pid {proc.pid} in {timeout} s: {line!r}"
    return dict(json.loads(line))


class Proc:
    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd=REPO, env=_env())
        self.ready = read_line(self.proc)
        assert self.ready.get("event") == "ready", self.ready

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd).encode() + b"\n")
        self.proc.stdin.flush()
        return read_line(self.proc, 20)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for name in os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []:
            if name.startswith(f"mooncake-{self.proc.pid}-"):
                try:
                    os.unlink(f"/dev/shm/{name}")
                except OSError:
                    pass

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def start_master(port: int, *extra: str) -> Proc:
    return Proc([sys.executable, "-m", "mooncake_cli.store.service", "--port", str(port),
                 *extra])


def start_node(master: str, segment_size: int = 8 << 20, secret: str | None = None) -> Proc:
    cmd = [sys.executable, str(HERE / "store_node.py"), "--master", master,
           "--segment-size", str(segment_size)]
    return Proc(cmd + (["--secret", secret] if secret else []))


def start_ha_master(ha: str, *extra: str) -> Proc:
    """A master on a free port campaigning for the leadership of the HA store `ha`
    (etcd://HOST:PORT/CLUSTER); its ready line comes before it is elected."""
    return Proc([sys.executable, "-m", "mooncake_cli.store.service", "--port", "0",
                 "--ha", ha, *extra])
