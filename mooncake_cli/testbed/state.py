"""What `testbed up` made, in /run/mooncake-testbed-PREFIX.json: hosts, namespaces, links,
addresses and routes, so `exec`, `status` and `down` can name them."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.testbed.topology import Link, Route, rate_text

DEFAULT_PREFIX = "mctb"
IFNAME_MAX = 15  # the kernel's interface name limit
_PREFIX = re.compile(r"^[a-z][a-z0-9]{1,7}$")


def check_prefix(prefix: str) -> str:
    if not _PREFIX.match(prefix):
        raise ConfigError(f"bad --prefix '{prefix}': 2-8 lower-case letters and digits, a "
                          "letter first")
    return prefix


def state_path(prefix: str) -> str:
    return os.environ.get("MOONCAKE_TESTBED_STATE") or f"/run/mooncake-testbed-{prefix}.json"


def netns_name(prefix: str, host: str) -> str:
    return f"{prefix}-{host}"


def ifname(prefix: str, peer: str) -> str:
    """The interface in a host's namespace that leads to `peer`."""
    return f"{prefix}-{peer}"


def name_limit(prefix: str) -> int:
    """The longest host name whose interface name fits IFNAME_MAX."""
    return IFNAME_MAX - len(prefix) - 1


@dataclass
class Testbed:
    """A testbed as made: `prefix` names its namespaces and interfaces."""

    __test__ = False  # not a pytest class

    prefix: str
    hosts: list[str]
    links: list[Link]
    routes: list[Route] = field(default_factory=list)
    forwarders: list[str] = field(default_factory=list)
    created: str = ""

    def netns(self, host: str) -> str:
        self.check_host(host)
        return netns_name(self.prefix, host)

    def check_host(self, host: str) -> None:
        if host not in self.hosts:
            raise ConfigError(f"no host '{host}' in the testbed (hosts: "
                              f"{', '.join(self.hosts)})")

    def addresses(self, host: str) -> list[dict[str, Any]]:
        """`host`'s address on each of its links, with the peer, the rate and its end's MTU."""
        return [{"link": k.index, "peer": k.peer(host), "address": k.addr(host),
                 "ifname": ifname(self.prefix, k.peer(host)), "rate": rate_text(k.rate_bps),
                 "rate_bps": k.rate_bps, "mtu": k.mtu(host)}
                for k in self.links if host in (k.a, k.b)]

    def address(self, host: str) -> str:
        """`host`'s first address (the one on its first link)."""
        self.check_host(host)
        mine = self.addresses(host)
        if not mine:
            raise ConfigError(f"host '{host}' has no link")
        return str(mine[0]["address"])

    def link_between(self, x: str, y: str) -> Link | None:
        for k in self.links:
            if {k.a, k.b} == {x, y}:
                return k
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "created": self.created, "hosts": self.hosts,
                "links": [asdict(k) for k in self.links],
                "routes": [asdict(r) for r in self.routes], "forwarders": self.forwarders}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Testbed:
        return cls(d["prefix"], list(d["hosts"]), [Link(**k) for k in d["links"]],
                   [Route(**r) for r in d.get("routes", [])], list(d.get("forwarders", [])),
                   d.get("created", ""))


def save(bed: Testbed) -> None:
    path = state_path(bed.prefix)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(bed.to_dict(), fh, indent=1)
    os.replace(tmp, path)


def load(prefix: str) -> Testbed | None:
    """The recorded testbed, or None when there is none."""
    try:
        with open(state_path(prefix)) as fh:
            return Testbed.from_dict(json.load(fh))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{state_path(prefix)} is not a testbed record ({e}): "
                          "`mooncake bench testbed down` clears it") from None


def require(prefix: str) -> Testbed:
    bed = load(prefix)
    if bed is None:
        raise ConfigError(f"no testbed is up (no {state_path(prefix)}): start one with "
                          "`mooncake bench testbed up`")
    return bed


def forget(prefix: str) -> None:
    try:
        os.unlink(state_path(prefix))
    except FileNotFoundError:
        pass
