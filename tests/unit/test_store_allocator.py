"""The per-segment allocator: alignment, refusals, coalescing, reservation, and property tests
(hypothesis) that allocations never overlap and that freed space is always reusable."""

from __future__ import annotations

from itertools import pairwise

import pytest

from mooncake_cli.store.allocator import Allocator
from mooncake_cli.store.errors import InvalidParams, StoreCode


def check_invariants(a: Allocator) -> None:
    used, free = a.blocks(), a.free_blocks()
    spans = sorted(used + free)
    pos = 0
    for off, length in spans:  # used and free blocks tile [0, capacity) exactly
        assert off == pos and length > 0 and off % a.alignment == 0
        pos = off + length
    assert pos == a.capacity
    assert a.used == sum(n for _, n in used)
    assert a.free_bytes == sum(n for _, n in free)
    for (o1, n1), (o2, _) in pairwise(free):  # fully coalesced: no two free blocks touch
        assert o1 + n1 < o2


def test_alignment_and_capacity_rounding() -> None:
    a = Allocator(1000, alignment=64)
    assert a.capacity == 960
    assert a.alloc(1) == 0 and a.alloc(65) == 64 and a.alloc(64) == 192
    assert a.used == 64 + 128 + 64
    assert a.size_of(64) == 128 and a.size_of(65) is None
    check_invariants(a)


@pytest.mark.parametrize("size", [0, -1, -(1 << 40), 961, 1 << 62, True, 1.5, "64", None])
def test_bad_sizes_are_refused_and_change_nothing(size: object) -> None:
    a = Allocator(960)
    a.alloc(100)
    before = (a.blocks(), a.free_blocks())
    with pytest.raises(InvalidParams) as e:
        a.alloc(size)  # type: ignore[arg-type]
    assert e.value.code == StoreCode.INVALID_PARAMS
    too_big = type(size) is int and size > a.capacity
    words = "exceeds the segment's capacity" if too_big else "must be a positive integer"
    assert words in str(e.value), str(e.value)
    assert (a.blocks(), a.free_blocks()) == before


@pytest.mark.parametrize("capacity,alignment", [(63, 64), (0, 64), (4096, 0), (4096, 48)])
def test_bad_geometry_is_refused(capacity: int, alignment: int) -> None:
    with pytest.raises(InvalidParams):
        Allocator(capacity, alignment)


def test_full_then_none_then_reusable() -> None:
    a = Allocator(64 * 10)
    offs = [a.alloc(64) for _ in range(10)]
    assert offs == [64 * i for i in range(10)]
    assert a.alloc(1) is None and a.free_bytes == 0
    a.free(128)
    assert a.alloc(64) == 128
    assert a.alloc(1) is None


def test_coalescing_both_sides() -> None:
    a = Allocator(64 * 8)
    offs = [a.alloc(64) for _ in range(8)]
    a.free(offs[1])
    a.free(offs[3])
    assert a.alloc(128) is None  # two holes of 64 do not make 128
    a.free(offs[2])  # merges with both neighbours
    assert a.free_blocks() == [(64, 192)]
    assert a.alloc(192) == 64
    for o in (0, 64, 256, 320, 384, 448):
        a.free(o)
    assert a.free_blocks() == [(0, 512)] and a.used == 0
    check_invariants(a)


def test_free_of_unknown_offsets_is_refused() -> None:
    a = Allocator(1024)
    off = a.alloc(100)
    assert off is not None
    with pytest.raises(InvalidParams):
        a.free(off + 64)
    a.free(off)
    with pytest.raises(InvalidParams):
        a.free(off)  # double free
    check_invariants(a)


def test_reserve_exact_ranges() -> None:
    a = Allocator(64 * 8)
    assert a.reserve(128, 100)  # [128, 256)
    assert not a.reserve(192, 64)  # taken
    assert not a.reserve(448, 128)  # runs past the end
    assert a.reserve(0, 128)
    assert a.alloc(64) == 256  # first fit skips the reserved ranges
    with pytest.raises(InvalidParams):
        a.reserve(65, 10)  # unaligned
    a.free(128)
    assert a.free_blocks() == [(128, 128), (320, 192)]
    check_invariants(a)


# -- property tests -----------------------------------------------------------------------------
hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")

CAP = 64 * 64
ops = st.lists(
    st.one_of(st.tuples(st.just("alloc"), st.integers(1, CAP // 3)),
              st.tuples(st.just("free"), st.integers(0, 1000))),
    max_size=120)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(ops)
def test_random_alloc_free_never_overlaps_and_reuses_space(seq: list[tuple[str, int]]) -> None:
    a = Allocator(CAP, alignment=64)
    live: dict[int, int] = {}  # offset -> requested size
    for op, n in seq:
        if op == "alloc":
            fits = any(length >= a.aligned(n) for _, length in a.free_blocks())
            off = a.alloc(n)
            assert (off is not None) == fits  # first fit finds a block whenever one exists
            if off is not None:
                assert off % 64 == 0 and off + n <= CAP
                assert all(off + n <= o or o + s <= off for o, s in live.items())
                live[off] = n
        elif live:
            off = sorted(live)[n % len(live)]
            length = a.free(off)
            del live[off]
            again = a.alloc(length)
            assert again is not None  # the freed space is reusable at once
            assert a.free(again) == length
        check_invariants(a)
    for off in list(live):
        a.free(off)
    assert a.free_blocks() == [(0, CAP)] and a.used == 0


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(st.lists(st.integers(1, 4 * 64), min_size=1, max_size=60), st.randoms())
def test_free_in_any_order_coalesces_back_to_one_block(sizes: list[int], rnd: object) -> None:
    a = Allocator(64 * 200)
    offs = [o for o in (a.alloc(s) for s in sizes) if o is not None]
    rnd.shuffle(offs)  # type: ignore[attr-defined]
    for o in offs:
        a.free(o)
        check_invariants(a)
    assert a.free_blocks() == [(0, a.capacity)]


def test_a_run_of_blocks_is_cut_at_once_and_each_frees_on_its_own() -> None:
    a = Allocator(64 * 10, alignment=64)
    first = a.alloc(64)
    assert first == 0
    run = a.alloc_run(100, 3)  # 100 bytes take 128 each
    assert run == [64, 192, 320]
    assert [a.size_of(o) for o in run] == [128, 128, 128] and a.used == 64 + 3 * 128
    check_invariants(a)
    assert a.alloc_run(64, 4) is None  # 192 bytes left in one block: nothing taken
    assert a.used == 64 + 3 * 128
    a.free(run[1])  # a block in the middle of the run
    check_invariants(a)
    assert a.alloc(128) == 192  # its hole is reused
    for off in (first, run[0], run[2], 192):
        a.free(off)
    assert a.free_blocks() == [(0, 640)] and a.used == 0
    with pytest.raises(InvalidParams):
        a.alloc_run(0, 2)
