"""The store client's heartbeat: long polls to the master, one after the other (the master
holds each until there is news for this client, up to LONG_POLL s), so a segment owner confirms
a change at once (HA); `interval` s apart with a master that answers at once."""

from __future__ import annotations

import logging
import threading
import time

from mooncake_cli.store.client.keeper import HoldingsKeeper
from mooncake_cli.store.errors import StoreError

log = logging.getLogger("mooncake.store")
LONG_POLL = 0.15  # seconds the master may hold a heartbeat (under the rpc's 0.2 s etcd checks)
RETRY_AFTER = 0.1  # seconds before the next heartbeat after one failed


def heartbeat(stop: threading.Event, keeper: HoldingsKeeper, polls: bool,
              interval: float) -> None:
    """Beat until `stop` is set; `polls`: this client owns a segment, so it long-polls."""
    wait, pause, failed = min(interval, LONG_POLL), interval, False
    while not stop.wait(pause):
        sent = time.monotonic()
        try:
            news = keeper.beat(wait if polls else 0.0)
        except StoreError as e:  # e.g. the lane to a leader just killed: look again soon
            log.warning("store heartbeat: %s", e)
            pause = interval if failed else min(interval, RETRY_AFTER)
            failed = True
            continue
        except Exception:  # the heartbeat must outlive any one bad round
            log.exception("store heartbeat")
            news = False
        failed = False
        took = time.monotonic() - sent
        held = wait > 0 and took >= wait / 2  # the master holds polls: poll again at once
        pause = 0.0 if news or held else max(0.0, interval - took)
