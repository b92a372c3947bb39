"""The engine's side of every transport: one `Endpoint` per available transport plugin.

Every available transport is attached (peers may reach this engine by any of them, whatever
this engine itself prefers); each registers the engine's regions and adds its opaque fields to
the descriptors. A transport's fields are named after it (`shm`, `nixl`, `nixl.agent`): a
field of another name is dropped with a warning, so plugins cannot overwrite each other.
No transport is required by name (the listener is the engine's, transfer/listener.py); an
engine none of whose transports attaches does not start.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from mooncake_cli.interfaces import ConfigError, SegmentDescriptor
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.spi import Channel, Endpoint, EngineSide, Transport

log = logging.getLogger("mooncake.transfer")
GROUP = "mooncake.transports"


class PlainEndpoint:
    """The endpoint of a transport written before `attach` existed: it registers nothing."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def register(self, region: Any) -> Mapping[str, str]:
        return {}

    def unregister(self, region: Any) -> None:
        pass

    def fields(self) -> Mapping[str, str]:
        return {}

    def connect(self, peer: SegmentDescriptor, secret: str | None, timeout: float) -> Channel:
        return self._transport.connect(peer, secret, timeout)

    def close(self) -> None:
        pass


def _own(name: str, fields: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for k, v in fields.items():
        if k == name or k.startswith(name + "."):
            out[k] = str(v)
        else:
            log.warning("transport %s published field '%s' outside its namespace: dropped",
                        name, k)
    return out


class Endpoints:
    """Attached endpoints by transport name."""

    def __init__(self, registry: Registry, engine: EngineSide) -> None:
        self.by_name: dict[str, Endpoint] = {}
        self.skipped: dict[str, str] = {}  # transport -> why it could not attach
        transports: list[Transport] = registry.available(GROUP)
        try:
            for t in transports:
                try:
                    attach = getattr(t, "attach", None)
                    self.by_name[t.name] = attach(engine) if attach else PlainEndpoint(t)
                except Exception as e:  # one broken transport must not stop the engine
                    self.skipped[t.name] = f"{type(e).__name__}: {e}"
                    log.warning("transport %s could not attach: %s", t.name, e)
        except BaseException:
            self.close()
            raise
        if not self.by_name:
            why = "; ".join(f"{n}: {w}" for n, w in self.skipped.items())
            raise ConfigError("no data transport is available to this engine"
                              + (f" ({why})" if why else " (see `mooncake plugins`)"))

    def register(self, region: Any) -> None:
        """Register `region` with every endpoint; its fields land in `region.extra`. An
        endpoint that refuses it only leaves it unreachable through that transport (logged;
        the engine's listener serves it whatever the transports do)."""
        done: list[Endpoint] = []
        try:
            for name, ep in self.by_name.items():
                try:
                    region.extra.update(_own(name, ep.register(region)))
                except Exception as e:
                    log.warning("transport %s cannot register %d bytes at %d (%s): peers "
                                "reach them through the others", name, region.length,
                                region.base, e)
                    continue
                done.append(ep)
        except BaseException:
            for ep in done:
                try:
                    ep.unregister(region)
                except Exception:  # unwinding: keep going
                    log.exception("unregistering after a failed register")
            raise

    def withdraw(self, region: Any) -> None:
        """`region` is now guarded: endpoints that offer unchecked writes to it stop (those
        with a `withdraw`: shm's cross-memory copies)."""
        for ep in self.by_name.values():
            if hasattr(ep, "withdraw"):
                ep.withdraw(region)

    def unregister(self, region: Any) -> None:
        for ep in self.by_name.values():
            try:
                ep.unregister(region)
            except Exception:
                log.exception("unregistering a region")

    def fields(self, public: bool) -> dict[str, str]:
        """Segment-level fields; `public` leaves out those a transport keeps for peers that
        proved the secret (its `private_fields`)."""
        out: dict[str, str] = {}
        for name, ep in self.by_name.items():
            f = _own(name, ep.fields())
            if public and getattr(ep, "private_fields", False):
                continue
            out.update(f)
        return out

    def shown(self) -> None:
        """The engine's descriptor has left the process (published, or answered to a peer):
        tell each endpoint that has a `shown()`, as peers may now reach it."""
        for name, ep in self.by_name.items():
            if (hook := getattr(ep, "shown", None)) is not None:
                try:
                    hook()
                except Exception:
                    log.exception("transport %s: shown()", name)

    def close(self) -> None:
        for ep in reversed(list(self.by_name.values())):
            try:
                ep.close()
            except Exception:
                log.exception("closing a transport endpoint")
