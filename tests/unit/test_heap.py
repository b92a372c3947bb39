"""Settling a server's heap (mooncake_cli/heap.py): what survives is frozen out of every later
collection, and cyclic garbage still young at a settle is collected first, not frozen."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from mooncake_cli import heap
from mooncake_cli.signals import StopFlag


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # hand pytest's own objects back to the collector


def test_settle_freezes_what_lives_and_collects_young_cycles_first(unfrozen: None) -> None:
    kept = [Node() for _ in range(1000)]
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle only the collector can free
    dead = weakref.ref(a)
    del a, b
    before = gc.get_freeze_count()
    heap.settle()
    assert dead() is None, "young cyclic garbage was frozen instead of collected"
    assert gc.get_freeze_count() >= before + len(kept)
    assert not any(o is kept[0] for o in gc.get_objects())  # no collection walks it now
    kept.clear()  # frozen objects are still freed by reference counting


def test_a_cycle_frozen_while_alive_is_collected_once_the_frozen_objects_double(
        unfrozen: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_after_full", 0)
    monkeypatch.setattr(heap, "FULL_FLOOR", 10**9)  # no full collection yet
    a, b = Node(), Node()
    a.other, b.other = b, a
    dead = weakref.ref(a)
    heap.settle()  # alive: frozen with the rest
    del a, b
    heap.settle()
    assert dead() is not None, "a frozen cycle is not scanned by the young collections"
    monkeypatch.setattr(heap, "FULL_FLOOR", 0)
    heap.settle()  # the frozen objects more than doubled since the (never run) last full one
    assert dead() is None
    after = heap._after_full
    assert after > 0
    heap.settle()  # no growth since: no full collection, the count stays
    assert heap._after_full == after


def test_wait_settling_settles_until_the_server_is_told_to_stop(
        unfrozen: None, monkeypatch: pytest.MonkeyPatch) -> None:
    stop = StopFlag()
    calls: list[int] = []

    def settle() -> None:
        calls.append(1)
        if len(calls) == 3:
            stop.set()

    monkeypatch.setattr(heap, "settle", settle)
    heap.wait_settling(stop, every_s=0.01)
    assert calls == [1, 1, 1]
