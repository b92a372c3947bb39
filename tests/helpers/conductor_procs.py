"""Conductors in processes of their own (`mooncake --json conductor start ...`), for the tests
that kill one with SIGKILL; a load of clients over them; what etcd holds of their bookings."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import etcd3gw

from mooncake_cli.api.registration import parse
from mooncake_cli.conductor.peer_records import PREFIX
from mooncake_cli.http import jsonhttp
from tests.helpers.procs import Child, child_env


class ConductorProc:
    """A conductor started at once; `serving()` waits for its serving line (with --peers it
    prints it once caught up with the others)."""

    def __init__(self, *args: str) -> None:
        self.child = Child([sys.executable, "-m", "mooncake_cli", "--json", "conductor",
                            "start", "--port", "0", *args], child_env())
        self.url = ""

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.child.popen

    def serving(self, timeout: float = 120.0) -> ConductorProc:
        if not self.url:
            self.url = str(self.child.ready_line("serving", timeout)["url"])
        return self

    def health(self) -> dict[str, Any]:
        return dict(jsonhttp.call(self.url + "/health", timeout=10).body)

    def ok(self) -> bool:
        """Serving, caught up and seeing a live prefill and decode instance."""
        return self.health()["status"] == "ok"

    def peers(self) -> dict[str, Any]:
        return dict(self.health()["peers"])

    def queued(self) -> int:
        return int(jsonhttp.call(self.url + "/v1/instances", timeout=10).body["queue"]["length"])

    def kill(self) -> None:
        """SIGKILL: no lease revoked, no key deleted."""
        self.child.kill()

    def stop(self, timeout: float = 30.0) -> None:
        self.child.stop(timeout)


class Load:
    """Clients sending short requests to live conductors in turn until stopped; a client that
    cannot connect to a conductor stops using it (as a load balancer would)."""

    def __init__(self, conductors: list[ConductorProc], clients: int,
                 ask: Callable[[str, list[int]], jsonhttp.Answer]) -> None:
        self.live = list(conductors)
        self.ask = ask
        self.outcomes: list[tuple[str, int | None, Any]] = []  # (url, status or None, body)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,))
                         for i in range(clients)]
        for t in self._threads:
            t.start()

    def _client(self, i: int) -> None:
        n = i
        while not self._stop.is_set():
            live = list(self.live)
            url = live[n % len(live)].url
            n += 1
            prompt = [1 + i, *range(10, 30), n % 250]
            try:
                answer = self.ask(url, prompt)
                self.outcomes.append((url, answer.status, answer.body))
            except OSError as e:
                self.outcomes.append((url, None, str(e)))
                self.live = [c for c in self.live if c.url != url]

    def answered(self, url: str) -> int:
        return sum(1 for u, status, _ in list(self.outcomes) if u == url and status == 200)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)


def etcd_bookings(etcd: str, cluster: str) -> dict[str, int]:
    """Every conductor booking etcd holds for `cluster`: key -> KV tokens."""
    (host, port), *_ = parse(etcd)[0]
    client = etcd3gw.client(host=host, port=port)
    found = client.get_prefix(f"{PREFIX}{cluster}/bookings/")
    return {meta["key"].decode(): int(json.loads(value)["tokens"]) for value, meta in found}


def etcd_keys(etcd: str, prefix: str) -> list[str]:
    (host, port), *_ = parse(etcd)[0]
    client = etcd3gw.client(host=host, port=port)
    return sorted(meta["key"].decode() for _, meta in client.get_prefix(prefix))
