"""The two implementations under the same vLLM: "ours" (mooncake-compat's `mooncake.store` and
`mooncake.engine`, `mooncake store master`, `mooncake store serve`) and "upstream" (the wheel
installed with `pip install --target .upstream`, put first on PYTHONPATH of the processes that
run it, its own `mooncake_master`, and a store client of its own holding the segment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from procs import Proc, port_open

from tests.conftest import free_port

PLUGIN = Path(__file__).resolve().parents[1]
UPSTREAM = Path(os.environ.get("MOONCAKE_VLLM_UPSTREAM", PLUGIN / ".upstream"))
READY_S = 120.0  # a master or store node on 2 shared, busy cores

# what the upstream side's store node runs: a client contributing its segment, until killed
_HOLDER = """
import json, signal, sys
from mooncake.store import MooncakeDistributedStore
a = json.loads(sys.argv[1])
s = MooncakeDistributedStore()
rc = s.setup("127.0.0.1", "P2PHANDSHAKE", a["segment"], 16 << 20, "tcp", "", a["master"])
if rc != 0:
    sys.exit(f"setup failed: {rc}")
open(a["ready"], "w").close()
signal.pause()
"""


def base_env() -> dict[str, str]:
    """This environment without PYTHONPATH and MOONCAKE_* (each side sets its own)."""
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("MOONCAKE_")}
    env.update(PYTHONUNBUFFERED="1", GLOG_minloglevel="1")
    return env


def upstream_missing() -> str:
    """Why the upstream side cannot run here ("" when it can)."""
    if not (UPSTREAM / "mooncake" / "mooncake_master").is_file():
        return (f"upstream's wheel is not installed in {UPSTREAM} (pip install --no-deps "
                "--target plugins/mooncake-vllm/.upstream "
                "mooncake-transfer-engine-non-cuda==0.3.13.post1; ci.sh does it)")
    p = subprocess.run([sys.executable, "-c", "import mooncake.engine, mooncake.store"],
                       env={**base_env(), "PYTHONPATH": str(UPSTREAM)}, capture_output=True,
                       text=True, timeout=120)
    if p.returncode != 0:
        return f"upstream's wheel does not import: {p.stderr.strip().splitlines()[-1:]}"
    return ""


class Side:
    """One implementation: the environment its processes run with, its master, its nodes."""

    def __init__(self, name: str, logs: Path) -> None:
        self.name, self.logs = name, logs
        self.procs: list[Proc] = []

    def env(self) -> dict[str, str]:
        env = base_env()
        if self.name == "upstream":
            env["PYTHONPATH"] = str(UPSTREAM)
        return env

    def _start(self, what: str, argv: list[str]) -> Proc:
        n = len(self.procs)
        proc = Proc(f"{self.name} {what}", argv, self.env(), self.logs / f"{what}-{n}.log")
        self.procs.append(proc)
        return proc

    def start_master(self) -> str:
        """A store master on a free loopback port; its address once it accepts connections."""
        port = free_port()
        if self.name == "ours":
            argv = [sys.executable, "-m", "mooncake_cli", "--json", "store", "master",
                    "--port", str(port), "--client-ttl", "3"]
        else:
            argv = [str(UPSTREAM / "mooncake" / "mooncake_master"), f"--rpc_port={port}",
                    "--rpc_address=127.0.0.1", f"--metrics_port={free_port()}",
                    "--client_ttl=3"]
        self._start("master", argv).wait_until(lambda: port_open(port), READY_S)
        return f"127.0.0.1:{port}"

    def start_node(self, master: str, segment: int) -> Proc:
        """A store node holding `segment` bytes for every client of `master`."""
        ready = self.logs / f"node-{len(self.procs)}.ready"
        if self.name == "ours":
            argv = [sys.executable, "-m", "mooncake_cli", "--json", "store", "serve",
                    "--master", master, "--segment-size", str(segment)]
            node = self._start("node", argv)
            node.wait_until(lambda: '"ready"' in node.tail(5), READY_S)
        else:
            args = json.dumps({"master": master, "segment": segment, "ready": str(ready)})
            node = self._start("node", [sys.executable, "-c", _HOLDER, args])
            node.wait_until(ready.exists, READY_S)
        return node

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop(grace=5)
