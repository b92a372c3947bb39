"""A testbed's shape: host names, links with a rate, one /30 per link, and each host's routes.

Hosts are `a, b, c, ...` (`--hosts 4`) or given names (`--hosts gpu1,gpu2`). Links are
`x-y=RATE` pairs, each optionally with `/mtu=N` (both ends) or `/mtu=N:M` (x's end, y's end);
with none given every pair is linked at DEFAULT_RATE (a full mesh) and MTU 1500. Link `i`
(in the order given) is 10.77.i.0/30: its first host gets .1, its second .2. A host reaches
each address of another host over their direct link when there is one, else along the path of
fewest hops (ties: the widest slowest link, then names), through hosts that forward.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from mooncake_cli.interfaces import ConfigError

DEFAULT_HOSTS = 3
DEFAULT_RATE = "10gbit"
SUBNET = "10.77"  # private: link i is 10.77.i.0/30
MTU = 1500
MIN_MTU, MAX_MTU = 576, 65535  # IPv4's smallest datagram every host takes; a veth's largest
MAX_LINKS = 256
_NAME = re.compile(r"^[a-z][a-z0-9]*$")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|bps)?$", re.IGNORECASE)
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


@dataclass(frozen=True)
class Link:
    """One veth pair between hosts `a` and `b` shaped to `rate_bps` each way; `mtu_a` is the
    MTU of a's end, `mtu_b` of b's."""

    index: int
    a: str
    b: str
    rate_bps: int
    mtu_a: int = MTU
    mtu_b: int = MTU

    def mtu(self, host: str) -> int:
        """The MTU of `host`'s end."""
        return self.mtu_a if host == self.a else self.mtu_b

    def addr(self, host: str) -> str:
        """`host`'s address on this link (no prefix length)."""
        return f"{SUBNET}.{self.index}.{1 if host == self.a else 2}"

    def peer(self, host: str) -> str:
        return self.b if host == self.a else self.a


@dataclass(frozen=True)
class Route:
    """On `host`: `dest`/32 via `via` (an address of the next hop on link `link`)."""

    host: str
    dest: str
    via: str
    link: int


def parse_rate(text: str) -> int:
    """Bits per second of `1gbit`, `100mbit`, `2.5gbit`, `500kbit` (tc's bit units, SI)."""
    m = _RATE.match(text.strip())
    if not m or m.group(3) and m.group(3).lower() == "bps":
        raise ConfigError(f"bad link rate '{text}': use e.g. 100mbit, 1gbit, 25gbit")
    bps = int(float(m.group(1)) * _SCALE[m.group(2).lower()])
    if bps < 8000:
        raise ConfigError(f"link rate '{text}' is below 8kbit")
    return bps


def rate_text(bps: int) -> str:
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= scale and bps % (scale // 10) == 0:
            return f"{bps / scale:g}{unit}"
    return f"{bps}bit"


def parse_mtu(text: str, item: str) -> tuple[int, int]:
    """(x's, y's) MTU of `N` or `N:M`."""
    parts = text.split(":")
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(f"bad MTU in link '{item}': write /mtu=N or /mtu=N:M (x's end, "
                          "y's end)")
    mtus = [int(p) for p in parts]
    for m in mtus:
        if not MIN_MTU <= m <= MAX_MTU:
            raise ConfigError(f"MTU {m} in link '{item}' is outside {MIN_MTU}-{MAX_MTU}")
    return mtus[0], mtus[-1]


def parse_hosts(text: str, name_limit: int) -> list[str]:
    """`4` -> a, b, c, d; `x,y,z` -> those names (lower case, a letter first, <= name_limit)."""
    text = text.strip()
    if text.isdigit():
        n = int(text)
        if not 2 <= n <= 26:
            raise ConfigError(f"--hosts {n}: a testbed has 2 to 26 hosts")
        return [chr(ord("a") + i) for i in range(n)]
    names = [h.strip() for h in text.split(",") if h.strip()]
    for h in names:
        if not _NAME.match(h) or len(h) > name_limit:
            raise ConfigError(f"bad host name '{h}': lower-case letters and digits, a letter "
                              f"first, at most {name_limit} characters")
    if len(names) < 2 or len(set(names)) != len(names):
        raise ConfigError(f"--hosts '{text}': give at least 2 distinct names")
    return names


def parse_links(text: str | None, hosts: list[str]) -> list[Link]:
    """Links of `a-b=1gbit,a-c=10gbit/mtu=1500:1400` (RATE optional: DEFAULT_RATE; MTU
    optional: 1500 at both ends), or the full mesh."""
    pairs: list[tuple[str, str, str, tuple[int, int]]] = []
    if not text or not text.strip():
        pairs = [(x, y, DEFAULT_RATE, (MTU, MTU)) for i, x in enumerate(hosts)
                 for y in hosts[i + 1:]]
    for item in (p.strip() for p in (text or "").split(",") if p.strip()):
        head, slash, opt = item.partition("/")
        ends, _, rate = head.partition("=")
        x, sep, y = ends.strip().partition("-")
        if not sep or not x or not y:
            raise ConfigError(f"bad link '{item}': write HOST-HOST=RATE, e.g. a-b=1gbit")
        mtus = (MTU, MTU)
        if slash:
            opt_name, eq, value = opt.partition("=")
            if opt_name.strip() != "mtu" or not eq:
                raise ConfigError(f"bad link '{item}': after the rate only /mtu=N or "
                                  "/mtu=N:M")
            mtus = parse_mtu(value.strip(), item)
        pairs.append((x.strip(), y.strip(), rate.strip() or DEFAULT_RATE, mtus))
    links: list[Link] = []
    seen: set[frozenset[str]] = set()
    for x, y, rate, (mtu_x, mtu_y) in pairs:
        for h in (x, y):
            if h not in hosts:
                raise ConfigError(f"link {x}-{y}: no host '{h}' (hosts: {', '.join(hosts)})")
        key = frozenset((x, y))
        if x == y or key in seen:
            raise ConfigError(f"link {x}-{y}: " + ("a host cannot link to itself" if x == y
                                                   else "given twice"))
        seen.add(key)
        links.append(Link(len(links), x, y, parse_rate(rate), mtu_x, mtu_y))
    if len(links) > MAX_LINKS:
        raise ConfigError(f"{len(links)} links: at most {MAX_LINKS}")
    return links


def _paths(hosts: list[str], links: list[Link], src: str) -> dict[str, list[Link]]:
    """The links from `src` to every host it can reach: fewest hops, then widest bottleneck."""
    best: dict[str, tuple[int, int, list[Link]]] = {src: (0, 0, [])}
    frontier = deque([src])
    while frontier:
        here = frontier.popleft()
        hops, _, path = best[here]
        for link in sorted(links, key=lambda k: k.index):
            if here not in (link.a, link.b):
                continue
            there = link.peer(here)
            width = min([k.rate_bps for k in path] + [link.rate_bps])
            old = best.get(there)
            if old is None:
                best[there] = (hops + 1, width, path + [link])
                frontier.append(there)
            elif old[0] == hops + 1 and width > old[1]:
                best[there] = (hops + 1, width, path + [link])
    return {h: p for h, (_, _, p) in best.items() if h != src}


def routes(hosts: list[str], links: list[Link]) -> list[Route]:
    """Every /32 route a host needs to reach every address of every other host; raises
    ConfigError when some pair has no path at all."""
    out: list[Route] = []
    for src in hosts:
        paths = _paths(hosts, links, src)
        lost = [h for h in hosts if h != src and h not in paths]
        if lost:
            raise ConfigError(f"host {src} has no path to {', '.join(lost)}: add a link")
        for dst, path in paths.items():
            first = path[0]
            for link in links:
                if dst not in (link.a, link.b) or link is first:
                    continue  # the first link's subnet is connected already
                out.append(Route(src, link.addr(dst), first.addr(first.peer(src)),
                                 first.index))
    return out


def forwarders(hosts: list[str], links: list[Link]) -> set[str]:
    """Hosts some path passes through (they forward; the others need not)."""
    mids: set[str] = set()
    for src in hosts:
        for path in _paths(hosts, links, src).values():
            here = src
            for link in path[:-1]:
                here = link.peer(here)
                mids.add(here)
    return mids
