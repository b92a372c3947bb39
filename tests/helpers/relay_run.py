"""Run inside a testbed host: write SIZE random bytes to a segment directly, through a relay,
again each way, and as the plan chooses; print each run as JSON (path, seconds of the
transfer alone, plan, SHA-256 of what was written). Direct runs and the planned one write at
the target's OFFSET, relay runs at OFFSET + SIZE, so the last of each can be checked.

    python -m tests.helpers.relay_run TARGET OFFSET RELAY SIZE     (MOONCAKE_SECRET set)
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

from mooncake_cli.config import TransferConfig
from mooncake_cli.registry import Registry
from mooncake_cli.transfer.engine import TransferEngine
from mooncake_cli.transfer.relay_client import Relays


def main(target: str, offset: int, relay: str, size: int) -> None:
    secret = os.environ["MOONCAKE_SECRET"]
    cfg = TransferConfig(transport="tcp", secret=secret, timeout=30,
                         host=os.environ.get("MOONCAKE_TESTBED_ADDR", "127.0.0.1"))
    with TransferEngine(cfg, Registry.from_env()) as engine:
        region = engine.register(bytearray(size))
        relays = Relays(engine, [relay], secret, 60)
        runs = []
        try:
            for via in ("direct", relay, "direct", relay, "auto"):
                data = os.urandom(size)
                region.view[:] = data  # type: ignore[index]
                at = offset + (size if via == relay else 0)
                plan, seconds = relays.write(region, 0, target, at, size, via)
                runs.append({"via": via, "relay": plan.via, "seconds": seconds,
                             "plan": plan.to_dict(), "offset": at,
                             "sha256": hashlib.sha256(data).hexdigest()})
        finally:
            relays.close()
    print(json.dumps({"runs": runs}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
