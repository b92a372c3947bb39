"""Keeping CPython's full garbage collections off a server's long-lived index.

A store master holds a handful of GC-tracked objects per key (the object's record, its
replicas, the policy's and the owner's journal entries), and a full collection walks every
one of them while the server answers nobody: at 480k keys (3.4M tracked objects) one took
about 1.7 s here, and at 32k keys the automatic collections were a third of the master's CPU
for 16-key batch puts. `settle()` collects the young generations, then freezes whatever
survived (`gc.freeze`): frozen objects are still freed by reference counting when their last
reference goes, but no collection scans them again. What that gives up: a reference cycle
among frozen objects that later becomes garbage is not reclaimed; the store's records hold
no cycles, and cyclic garbage still young at a settle is collected before the freeze.

Only for a server process's own main loop (`mooncake store master`, `mooncake store serve`):
freezing is process-wide, so a library never calls it in its caller's process.
"""

from __future__ import annotations

import gc

from mooncake_cli.signals import StopFlag

SETTLE_EVERY_S = 1.0


def settle() -> None:
    """Collect the young generations, then freeze every object still tracked."""
    gc.collect(1)
    gc.freeze()


def wait_settling(stop: StopFlag, every_s: float = SETTLE_EVERY_S) -> None:
    """Block until `stop` is set, settling the heap every `every_s` seconds."""
    while not stop.wait(every_s):
        settle()
