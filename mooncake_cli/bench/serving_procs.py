"""The serving cluster `bench chaos --serving` breaks: every part a process of its own on loopback.

    with ServingCluster(ServingSpec(model="smollm2-135m", decode=3), tmpdir) as cluster:
        cluster.start_decodes(write_behind=True)
        victim = cluster.kill_busy_decode(rng)     # SIGKILL, a fresh decode worker spawned
        cluster.adopt_ready()                      # replacements that have come up

A store master (`python -m mooncake_cli.store.service`), the conductor (`mooncake conductor
start --config`, its [conductor] table written here: the explain file records every placement
and migration), one prefill and `decode` decode workers (`mooncake prefill|decode --store
--segment-size --conductor --threads 1`). Children are spawned by the calling thread (a child
gets SIGTERM when the thread that started it ends: stats.Child), so call from the main thread.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from mooncake_cli.bench.stats import Child
from mooncake_cli.http import jsonhttp
from mooncake_cli.interfaces import MooncakeError

START_TIMEOUT = 600.0  # seconds a worker may take to load its model on a loaded machine


@dataclass(frozen=True)
class ServingSpec:
    model: str
    decode: int  # decode workers kept running
    kv_blocks: int  # KV blocks per decode worker
    block_size: int = 16
    prefill_segment: str = "512MiB"
    decode_segment: str = "128MiB"


@dataclass
class Worker:
    """One worker process; `url` once its ready line came."""

    name: str
    child: Child
    url: str = ""
    failed: str = ""


def metrics(text: str) -> dict[str, float]:
    """Sample name (labels dropped, values of one name summed) -> value, of a /metrics text."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc; 0.0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # from field 3 (state) on
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ServingCluster:
    """The processes; `url` is the conductor's, `explain` its decision log."""

    def __init__(self, spec: ServingSpec, folder: Path) -> None:
        self.spec = spec
        self.explain = folder / "explain.jsonl"
        self._children: list[Child] = []
        self.decodes: list[Worker] = []
        self._pending: list[Worker] = []
        self._serial = 0
        self.write_behind = True
        try:
            master = self._ready(Child([sys.executable, "-m", "mooncake_cli.store.service",
                                        "--port", "0"], "the store master"), 60)
            self.store = str(master["address"])
            conf = folder / "conductor.toml"
            conf.write_text(f'[conductor]\nport = 0\nmodel = "{spec.model}"\n'
                            f"block_size = {spec.block_size}\n"
                            f'explain = "{self.explain}"\n', encoding="utf-8")
            self.conductor = Child([sys.executable, "-m", "mooncake_cli", "--json",
                                    "conductor", "start", "--config", str(conf)],
                                   "the conductor")
            info = self._ready(self.conductor, START_TIMEOUT, "serving")
            self.url, self.model = str(info["url"]), str(info["model"])
            self.prefill = self._worker("prefill", "prefill-0", spec.prefill_segment, [])
            self._wait([self.prefill])
        except BaseException:
            self.close()
            raise

    def _ready(self, child: Child, timeout: float, event: str = "ready") -> dict[str, Any]:
        self._children.append(child)
        while True:
            info = child.line(timeout)
            if info.get("event") == event:
                return info

    def _worker(self, role: str, name: str, segment: str, extra: list[str]) -> Worker:
        argv = [sys.executable, "-m", "mooncake_cli", "--json", role, "--model",
                self.spec.model, "--block-size", str(self.spec.block_size), "--store",
                self.store, "--segment-size", segment, "--conductor", self.url, "--threads",
                "1", "--heartbeat", "0.5", "--name", name, *extra]
        child = Child(argv, f"{role} worker {name}", {"OMP_NUM_THREADS": "1"})
        self._children.append(child)
        w = Worker(name, child)
        threading.Thread(target=self._read_ready, args=(w,), daemon=True).start()
        return w

    @staticmethod
    def _read_ready(w: Worker) -> None:
        try:
            info = w.child.line(START_TIMEOUT)
            while info.get("event") != "ready":
                info = w.child.line(START_TIMEOUT)
            w.url = str(info["url"])
        except (MooncakeError, OSError, ValueError) as e:
            w.failed = str(e)

    def _wait(self, workers: list[Worker]) -> None:
        """Until each worker printed its ready line and the conductor counts it alive."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            failed = [w for w in workers if w.failed]
            if failed:
                raise MooncakeError(f"{failed[0].name} did not start: {failed[0].failed}")
            if all(w.url for w in workers) and {w.name for w in workers} <= self.alive():
                return
            if time.monotonic() > deadline:
                raise MooncakeError(f"workers not up within {START_TIMEOUT:g} s")
            time.sleep(0.1)

    def alive(self) -> set[str]:
        """Names of the instances the conductor counts alive."""
        snap = jsonhttp.call(self.url + "/v1/instances").body["instances"]
        return {i["name"] for i in snap if i["alive"]}

    def _spawn_decode(self) -> Worker:
        self._serial += 1
        extra = ["--kv-blocks", str(self.spec.kv_blocks)]
        if not self.write_behind:
            extra.append("--no-write-behind")
        return self._worker("decode", f"decode-{self._serial}", self.spec.decode_segment, extra)

    def start_decodes(self, write_behind: bool) -> None:
        """Stop the decode workers there are (SIGTERM: they deregister) and start `decode`
        fresh ones, with or without write-behind; wait until the conductor routes to them."""
        for w in self.decodes + self._pending:
            w.child.close(grace=30)
        self.write_behind = write_behind
        self._pending = []
        self.decodes = [self._spawn_decode() for _ in range(self.spec.decode)]
        self._wait(self.decodes)

    def running(self, w: Worker) -> int:
        try:
            return int(jsonhttp.call(w.url + "/v1/load").body.get("running", 0))
        except (OSError, ValueError):
            return 0

    def kill_busy_decode(self, rng: random.Random) -> dict[str, Any] | None:
        """SIGKILL a decode worker running requests (chosen by `rng`) and spawn one in its
        place; what was killed, or None when no decode worker runs any."""
        busy = [(w, n) for w in self.decodes if (n := self.running(w)) > 0]
        if not busy:
            return None
        victim, running = rng.choice(busy)
        victim.child.proc.kill()
        victim.child.proc.wait()
        self.decodes.remove(victim)
        self._pending.append(self._spawn_decode())
        return {"name": victim.name, "running": running}

    def adopt_ready(self) -> bool:
        """Move replacements the conductor counts alive into `decodes`; whether all
        `decode` workers are up."""
        if self._pending:
            failed = [w for w in self._pending if w.failed]
            if failed:
                raise MooncakeError(f"{failed[0].name} did not start: {failed[0].failed}")
            alive = self.alive()
            up = [w for w in self._pending if w.url and w.name in alive]
            self.decodes += up
            self._pending = [w for w in self._pending if w not in up]
        return not self._pending

    def conductor_metrics(self) -> dict[str, float]:
        return metrics(jsonhttp.fetch(self.url + "/metrics").data.decode(errors="replace"))

    def decode_metrics(self) -> dict[str, float]:
        """The running decode workers' /metrics, summed."""
        total: dict[str, float] = {}
        for w in self.decodes:
            for k, v in metrics(jsonhttp.fetch(w.url + "/metrics").data.decode()).items():
                total[k] = total.get(k, 0.0) + v
        return total

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of the decode workers and of every process of the cluster."""
        return {"decode": sum(cpu_seconds(w.child.proc.pid) for w in self.decodes),
                "cluster": sum(cpu_seconds(c.proc.pid) for c in self._children
                               if c.running())}

    def conductor_errors(self, most: int = 40) -> list[str]:
        """The conductor's logged errors and tracebacks (its last `most` such lines)."""
        keep: list[str] = []
        trace = False  # inside a traceback: its indented lines and the exception's line
        for line in self.conductor.stderr_tail(1 << 20).splitlines():
            if line.startswith("Traceback"):
                trace = True
            elif trace and not line[:1].isspace():
                trace = False
                keep.append(line)  # the exception itself
                continue
            if trace or " ERROR " in line or line.startswith("ERROR"):
                keep.append(line)
        return keep[-most:]

    def migrations(self) -> list[dict[str, Any]]:
        """The explain log's placements of moved answers (request `<id>.m<N>`)."""
        if not self.explain.exists():
            return []
        records = [json.loads(line) for line in
                   self.explain.read_text(encoding="utf-8").splitlines()]
        return [r for r in records if ".m" in str(r.get("request", ""))]

    def close(self) -> None:
        for child in reversed(self._children):
            child.close(grace=30)
        self._children = []

    def __enter__(self) -> ServingCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
