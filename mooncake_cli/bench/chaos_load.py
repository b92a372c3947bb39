"""The load `bench chaos` runs: a put/get/remove workload that books what was acknowledged, a
prober that says when gets work again after a kill, and the timed put rows.

Values are regenerated from their seed (random.Random(seed).randbytes(size)), so every read is
compared byte for byte without keeping the bytes."""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
import uuid
from typing import Any, Protocol

from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.errors import ObjectNotFound, StoreError

MAX_LIVE = 400  # keys the workload keeps; beyond it, it removes
PROBE_EVERY = 0.02  # seconds between the prober's gets


class Tally(Protocol):
    acked_puts: int
    acked_removes: int
    in_doubt: int
    lost: int
    resurrected: int
    wrong_bytes: int


def value(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


class Workload:
    """Puts, gets and removes by `client` in a thread of its own, a prober by `prober`."""

    def __init__(self, client: StoreClient, prober: StoreClient, seed: int) -> None:
        self.client, self.prober = client, prober
        self.rng = random.Random(seed)
        self.live: dict[str, tuple[int, int]] = {}  # acknowledged and not removed: (seed, size)
        self.removed: list[str] = []  # acknowledged removes not checked yet
        self.doubt: set[str] = set()
        self.puts = self.removes = self.wrong = self.misses = 0
        self._n = 0
        self._go, self._idle, self._stop = threading.Event(), threading.Event(), threading.Event()
        self._probes: list[tuple[float, float]] = []  # (start, end) of the prober's good gets
        self._probe_key = f"chaos-probe-{uuid.uuid4().hex[:8]}"
        self._threads = [threading.Thread(target=self._work, daemon=True),
                         threading.Thread(target=self._probe, daemon=True)]

    def start(self) -> None:
        self.prober.put(self._probe_key, value(-1, 4096))
        self._go.set()
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        self._go.set()
        for t in self._threads:
            t.join(30)

    # -- the workload ----------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._stop.is_set():
            if not self._go.is_set():
                self._idle.set()
                self._go.wait()
                continue
            self._idle.clear()
            roll = self.rng.random()
            if len(self.live) > MAX_LIVE or (roll > 0.85 and self.live):
                self._remove(self.rng.choice(list(self.live)))
            elif roll > 0.5 and self.live:
                self._get(self.rng.choice(list(self.live)))
            else:
                self._put()

    def _put(self) -> None:
        self._n += 1
        key = f"chaos-{self._n}"
        size = self.rng.choice((1, 100, 4096, self.rng.randint(1, 1 << 16)))
        try:
            self.client.put(key, value(self._n, size))
        except StoreError:
            self.doubt.add(key)
            return
        self.live[key] = (self._n, size)
        self.puts += 1

    def _get(self, key: str) -> None:
        try:
            got = self.client.get(key)
        except ObjectNotFound:
            self.misses += 1  # an acknowledged key missing, even for a moment
            return
        except StoreError:
            return  # the leader is away: no answer is not a wrong answer
        if got != value(*self.live[key]):
            self.wrong += 1

    def _remove(self, key: str) -> None:
        del self.live[key]
        try:
            self.client.remove(key, force=True)
        except StoreError:
            self.doubt.add(key)
            return
        self.removed.append(key)
        self.removes += 1

    def _probe(self) -> None:
        want = value(-1, 4096)
        while not self._stop.wait(PROBE_EVERY):
            start = time.monotonic()
            try:
                got = self.prober.get(self._probe_key)
            except StoreError:
                continue
            if got != want:
                self.wrong += 1
            else:
                self._probes.append((start, time.monotonic()))

    def probe_after(self, since: float, limit: float) -> float | None:
        """When the first probe sent after `since` succeeded (None after `limit` s)."""
        deadline = since + limit
        while time.monotonic() < deadline:
            done = [end for start, end in self._probes[-50:] if start > since]
            if done:
                return done[0]
            time.sleep(0.01)
        return None

    # -- checks ----------------------------------------------------------------------------------
    def check(self, tally: Tally) -> None:
        """Pause, read back every live key and every key removed since the last check."""
        self._go.clear()
        self._idle.wait(60)
        try:
            for key, (seed, size) in list(self.live.items()):
                got = _read(self.client, key)
                if got is None:
                    tally.lost += 1
                    del self.live[key]
                elif got != value(seed, size):
                    self.wrong += 1
            for key in self.removed:
                if _read(self.client, key, tries=1) is not None:
                    tally.resurrected += 1
            self.removed = []
        finally:
            self._go.set()

    def tally(self, tally: Tally) -> None:
        tally.acked_puts, tally.acked_removes = self.puts, self.removes
        tally.in_doubt, tally.wrong_bytes = len(self.doubt), self.wrong


def _read(client: StoreClient, key: str, tries: int = 3) -> bytes | None:
    """The value of `key`, None when the store says it has none (after `tries` asks)."""
    for n in range(tries):
        try:
            return client.get(key)
        except StoreError:
            if n + 1 < tries:
                time.sleep(0.2)
    return None


def throughput(clients: dict[str, StoreClient], size: int, duration: float, capacity: int,
               slices: int = 20) -> dict[str, dict[str, Any]]:
    """Sequential puts of `size` bytes through each client for `duration` s each, taken in
    `slices` turns that alternate between the clients (so drifts of a shared machine's load
    fall on each alike), at most what half of two nodes of `capacity` bytes hold. Per client
    ops/s, GB/s and latency percentiles. The keys are removed after."""
    data = os.urandom(size)
    tag = uuid.uuid4().hex[:8]
    for name, client in clients.items():
        for i in range(10):  # warm the connections up
            client.put(f"warm-{tag}-{name}-{i}", data)
    cap = max(20, capacity // size)
    lat: dict[str, list[float]] = {name: [] for name in clients}
    secs = dict.fromkeys(clients, 0.0)
    for _ in range(slices):
        for name, client in clients.items():
            mine = lat[name]
            start = time.monotonic()
            while time.monotonic() - start < duration / slices and len(mine) < cap:
                t = time.perf_counter()
                client.put(f"tp-{tag}-{name}-{len(mine)}", data)
                mine.append(time.perf_counter() - t)
            secs[name] += time.monotonic() - start
    out: dict[str, dict[str, Any]] = {}
    for name, client in clients.items():
        client.remove_all(force=True)
        got = sorted(lat[name])
        out[name] = {"puts": len(got), "seconds": round(secs[name], 3),
                     "ops_per_s": len(got) / secs[name],
                     "gb_per_s": len(got) * size / secs[name] / 1e9,
                     "p50_us": statistics.median(got) * 1e6,
                     "p99_us": got[min(len(got) - 1, int(len(got) * 0.99))] * 1e6}
    return out
