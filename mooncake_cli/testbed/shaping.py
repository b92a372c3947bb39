"""Rate limits: an `htb` root qdisc with one class at the link's rate on each veth end, so
each direction of a link carries at most its rate (no added delay: netem is not used)."""

from __future__ import annotations

import re

from mooncake_cli.testbed.netns import run
from mooncake_cli.testbed.topology import parse_rate

BURST_S = 0.002  # the bucket holds 2 ms at the rate; a short burst, nothing over seconds
MIN_BURST = 128 << 10  # two 64 KiB GSO segments, or slow links stall between packets


def burst_bytes(rate_bps: int) -> int:
    return max(MIN_BURST, int(rate_bps / 8 * BURST_S))


def shape(ns: str, dev: str, rate_bps: int) -> None:
    """Limit what `dev` (in `ns`) sends to `rate_bps`."""
    burst = str(burst_bytes(rate_bps))
    rate = f"{rate_bps}bit"
    run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb",
         "default", "1"])
    run(["tc", "-n", ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
         "rate", rate, "ceil", rate, "burst", burst, "cburst", burst, "quantum", "65536"])


def shaped_rate(ns: str, dev: str) -> int | None:
    """The rate in bits/s of `dev`'s htb class 1:1, or None when it has none."""
    # tc 6.1 prints htb classes as text even with -j
    raw = run(["tc", "-n", ns, "class", "show", "dev", dev], check=False)
    m = re.search(r"^class htb 1:1 .*?\brate (\S+)", raw, re.MULTILINE)
    return parse_rate(m.group(1)) if m else None
