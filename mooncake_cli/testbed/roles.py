"""`mooncake` roles started inside testbed hosts, for the figure scripts (scripts/*_testbed.py).

    p = spawn("pft", "a", "store", "master", "--host", "10.77.0.1", "--port", "50051")
    ready(p)              # its ready (or serving) line, as a dict
    stop([p])             # SIGTERM, then SIGKILL after a minute
    run("pft", "b", sys.executable, "client.py")  # a command's last JSON line, once it ends

Each runs as `mooncake bench testbed exec --prefix PREFIX --bind HOST -- mooncake --json ...`:
in the host's namespace, its transfer engine listening on the host's address, over tcp.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TESTBED = [sys.executable, "-m", "mooncake_cli", "bench", "testbed"]


def spawn(prefix: str, host: str, *args: str) -> subprocess.Popen[bytes]:
    """`mooncake --json ARGS` in `host` of testbed `prefix`, its stdout piped."""
    return subprocess.Popen([*TESTBED, "exec", "--prefix", prefix, "--bind", host, "--",
                             sys.executable, "-m", "mooncake_cli", "--json", *args],
                            stdout=subprocess.PIPE, cwd=REPO)


def ready(p: subprocess.Popen[bytes], timeout: float = 300) -> dict[str, Any]:
    """The first line of `p` saying it is ready (or serving, or its address)."""
    assert p.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"exited with {p.wait()}")
        ev = json.loads(line)
        if ev.get("event") in ("ready", "serving") or "address" in ev:
            return dict(ev)
    raise TimeoutError("not ready")


def run(prefix: str, host: str, *argv: str) -> dict[str, Any]:
    """Run `argv` in `host` until it ends; the last line it printed, a JSON object
    (RuntimeError with the end of its stderr when it fails)."""
    done = subprocess.run([*TESTBED, "exec", "--prefix", prefix, host, "--", *argv],
                          capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv[:3])} failed in {host}: {done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop `procs`, the last started first."""
    for p in reversed(procs):
        p.terminate()
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
