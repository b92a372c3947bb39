"""Real store processes for the store tests: a master (`python -m mooncake_cli.store.service`)
and store clients in their own processes (tests/helpers/store_node.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.helpers.procs import Child, child_env, read_line

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


class Proc:
    """`cmd` started with a clean environment (plus `env`), ready once it says so; `ask` sends
    one JSON command on stdin and reads the JSON line that answers it."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.child = Child(cmd, child_env(**(env or {})), stdin=True)
        self.ready = self.child.ready_line()

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.child.popen

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd).encode() + b"\n")
        self.proc.stdin.flush()
        return read_line(self.proc, 20)

    def kill(self) -> None:
        self.child.kill()

    def stop(self, timeout: float = 10.0) -> int | None:
        return self.child.stop(timeout)


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


def proc_list() -> Iterator[list[Proc]]:
    """For a fixture: the processes a test starts, killed after it (the last started first)."""
    made: list[Proc] = []
    yield made
    for p in reversed(made):
        p.kill()
