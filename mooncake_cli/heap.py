"""Keeping CPython's full garbage collections off a server's long-lived index.

A store master holds a handful of GC-tracked objects per key (the object's record, its
replicas, the policy's and the owner's journal entries), and a full collection walks every
one of them while the server answers nobody: at 480k keys (3.4M tracked objects) one took
about 1.7 s here, and at 32k keys the automatic collections were a third of the master's CPU
for 16-key batch puts. `settle()` collects the young generations, then freezes whatever
survived (`gc.freeze`): frozen objects are still freed by reference counting when their last
reference goes, but no collection scans them again. Cyclic garbage still young at a settle is
collected before the freeze; a cycle among frozen objects that becomes garbage later (the
store's records hold none) waits for the next full collection, which a settle runs once the
frozen objects have doubled since the last one (and number at least FULL_FLOOR): like
CPython's own rule for full passes (a quarter more long-lived objects), but rarer, and never
while the heap merely stays the size it is.

Only for a server process's own main loop (`settle` for `mooncake store master` and `store serve`,
`freeze_startup` for the other roles):
freezing is process-wide, so a library never calls it in its caller's process. The same holds for
`tune_heap` (glibc's allocator), which the roles that read store values call at start-up.
"""

from __future__ import annotations

import ctypes
import gc

from mooncake_cli.signals import StopFlag

SETTLE_EVERY_S = 1.0
FULL_FLOOR = 4_000_000  # frozen objects (about 600k keys on a master) below which no full
# collection runs: one over that many takes about 2 s here, so it waits for real growth
_after_full = 0  # frozen objects after the last full collection
KEEP_FREED = 512 << 20  # free heap bytes glibc may keep (see tune_heap)


def tune_heap() -> None:
    """Let glibc serve blocks under 64 MiB from the heap and keep up to KEEP_FREED bytes of it
    free for reuse: the values a store get returns are fresh multi-MiB `bytes`, and glibc hands
    each freed one back to the kernel, so the next lands in fresh pages and page-faults its way
    through the copy (1.5 GB/s instead of memcpy speed). For a role's own process only (the
    store node and CLI, the workers, the benchmarks), never a host's. Idempotent; a no-op off
    glibc."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, KEEP_FREED)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def settle() -> None:
    """Collect the young generations, then freeze every object still tracked; a full
    collection first when the frozen objects have doubled since the last one."""
    global _after_full
    gc.collect(1)
    gc.freeze()
    frozen = gc.get_freeze_count()
    if frozen > max(2 * _after_full, FULL_FLOOR):
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        _after_full = gc.get_freeze_count()


def freeze_startup() -> None:
    """Once a server has started: collect, then freeze what start-up left (modules, the
    served model's tokenizer and tables), so that no later collection scans it. On the
    conductor a full collection walked 200k such objects in 90 ms, every ten seconds or so
    under load (4% of its CPU); what requests make is collected as before."""
    gc.collect()
    gc.freeze()


def wait_settling(stop: StopFlag, every_s: float = SETTLE_EVERY_S) -> None:
    """Block until `stop` is set, settling the heap every `every_s` seconds."""
    while not stop.wait(every_s):
        settle()
