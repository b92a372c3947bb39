"""The live registry of prefill and decode workers, kept in step with the scheduler's Cluster.

Workers come from the static config (polled: GET /health then /v1/load) or register themselves
(POST /v1/instances/register, repeated as a heartbeat). An instance silent for `ttl` seconds, or
one a request could not reach, is marked dead: the scheduler stops choosing it; a registered
instance silent for 3 x ttl is dropped with its cached blocks. A static one stays and is polled
again, so it comes back when it answers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mooncake_cli.api.errors import ServingError, bad
from mooncake_cli.api.roles import Registration
from mooncake_cli.api.schema import validate
from mooncake_cli.conductor.event_routing import EventRouting
from mooncake_cli.http import jsonhttp
from mooncake_cli.http.auth import Signer
from mooncake_cli.scheduler.state import Cluster

log = logging.getLogger(__name__)


@dataclass
class Instance:
    name: str
    role: str
    url: str
    static: bool = False
    last_seen: float = 0.0
    load: dict[str, Any] = field(default_factory=dict)
    dead_reason: str = ""

    def to_dict(self, now: float) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "url": self.url, "static": self.static,
                "alive": not self.dead_reason, "dead_reason": self.dead_reason or None,
                "seen_s_ago": round(now - self.last_seen, 3), "load": self.load}


class Instances:
    """Registry of workers; `lock` guards it together with the cluster it updates."""

    def __init__(self, cluster: Cluster, ttl: float, block_size: int,
                 on_decode_step: Callable[[float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster = cluster
        self.ttl = ttl
        self.block_size = block_size
        self.clock = clock
        self.lock = threading.RLock()
        self._by_name: dict[str, Instance] = {}
        self._on_decode_step = on_decode_step
        self.events: EventRouting | None = None  # follows the KV events workers publish

    def register(self, reg: Registration | dict[str, Any], static: bool = False) -> Instance:
        """Add or refresh an instance from a registration (or a polled /health + load);
        ServingError 400 for a bad one, before anything changes."""
        if not isinstance(reg, Registration):
            reg = validate(Registration, reg)
        name, role, url = reg.name, reg.role, reg.url.rstrip("/")
        try:
            _, port, _ = jsonhttp.split(url)
            if not url.startswith("http://") or urllib.parse.urlsplit(url).port is None or \
                    port < 1:
                raise ValueError("no port")
        except ValueError:
            raise bad(f"the 'url' {url!r} must be http://HOST:PORT", "url") from None
        load = reg.load.model_dump(exclude_unset=True)
        if self.events is not None:
            self.events.follow(name, role, reg.kv_events)
        with self.lock:
            inst = self._by_name.get(name)
            if inst is None or inst.role != role:
                if inst is not None:
                    self.cluster.remove(name)
                inst = self._by_name[name] = Instance(name, role, url, static)
                self.cluster.add(name, role)
                log.info("%s instance %s at %s joined", role, name, url)
            inst.url, inst.static = url, inst.static or static
            inst.last_seen, inst.load, inst.dead_reason = self.clock(), load, ""
            self._apply_load(inst)
            return inst

    def _apply_load(self, inst: Instance) -> None:
        state = self.cluster.by_name[inst.name]
        state.alive = True
        if inst.role != "decode" or not inst.load:
            return
        ld = inst.load
        total = int(ld.get("total_blocks", 0) or 0)
        if total:
            state.kv_capacity_tokens = total * self.block_size
            state.context_tokens = (total - int(ld.get("free_blocks", 0) or 0)) * self.block_size
        state.batch = int(ld.get("running", 0) or 0) + int(ld.get("waiting", 0) or 0)
        step = float(ld.get("recent_step_s", 0) or 0)
        if step > 0 and self._on_decode_step is not None:
            self._on_decode_step(step)

    def deregister(self, name: str) -> bool:
        with self.lock:
            if self._by_name.pop(name, None) is None:
                return False
            self.cluster.remove(name)
            if self.events is not None:
                self.events.forget(name)
            log.info("instance %s left", name)
            return True

    def mark_dead(self, name: str, why: str) -> None:
        with self.lock:
            inst = self._by_name.get(name)
            if inst is not None and not inst.dead_reason:
                inst.dead_reason = why
                self.cluster.by_name[name].alive = False
                log.warning("instance %s is dead: %s", name, why)

    def expire(self) -> None:
        """Mark silent instances dead; drop registered ones silent for 3 x ttl."""
        now = self.clock()
        with self.lock:
            for inst in list(self._by_name.values()):
                silent = now - inst.last_seen
                if not inst.static and silent > 3 * self.ttl:
                    self.deregister(inst.name)
                elif silent > self.ttl:
                    self.mark_dead(inst.name, f"silent for {silent:.1f} s")

    def url(self, name: str) -> str:
        with self.lock:
            return self._by_name[name].url

    def get(self, name: str) -> Instance | None:
        with self.lock:
            return self._by_name.get(name)

    def snapshot(self) -> list[dict[str, Any]]:
        now = self.clock()
        with self.lock:
            return [i.to_dict(now) for i in sorted(self._by_name.values(),
                                                   key=lambda i: (i.role, i.name))]


async def poll(peer: jsonhttp.AsyncPeer, url: str, timeout: float = 2.0) -> dict[str, Any]:
    """A static worker's registration body, read from its /health and /v1/load (both at once,
    through `peer`'s pooled connections)."""
    health, load = await asyncio.gather(peer.call(url + "/health", timeout_s=timeout),
                                        peer.call(url + "/v1/load", timeout_s=timeout))
    if health.status != 200 or load.status != 200:
        raise OSError(f"{url} answered {health.status}/{load.status}")
    return {"name": health.body.get("name"), "role": health.body.get("role"), "url": url,
            "load": load.body, "kv_events": health.body.get("kv_events")}


class Poller:
    """Polls the static URLs (every one at once) and expires silent instances: once when
    started, then every `interval` seconds as a task on the HTTP server's event loop (`run`,
    cancelled when the server stops). (A thread of its own contended for the GIL with the loop
    serving requests: under load it cost the conductor 2.5 times its idle CPU.)"""

    def __init__(self, instances: Instances, urls: tuple[str, ...], interval: float,
                 auth: Signer | None = None) -> None:
        self.instances, self.urls, self.interval = instances, urls, interval
        self.auth = auth

    def start(self) -> Poller:
        """The first round, before the server serves (on a loop of its own)."""
        asyncio.run(self.run(first_only=True))
        return self

    async def _poll(self, peer: jsonhttp.AsyncPeer, url: str) -> None:
        try:
            self.instances.register(await poll(peer, url, self.interval * 2), static=True)
        except (OSError, ValueError, ServingError) as e:
            log.debug("poll %s: %s", url, e)

    async def run(self, first_only: bool = False) -> None:
        """A round every `interval` seconds until cancelled (`first_only`: one round, now)."""
        peer = jsonhttp.AsyncPeer(self.auth)
        try:
            while True:
                if not first_only:
                    await asyncio.sleep(self.interval)
                await asyncio.gather(*(self._poll(peer, url) for url in self.urls))
                self.instances.expire()
                if first_only:
                    return
        finally:
            await peer.close()
