"""Hit density (density.py): victims by expected hits per access of room, learnt online from
reuse odds per read count and the reuse gaps; prefix's default inner order."""

from __future__ import annotations

from mooncake_cli.store.eviction import PrefixPolicy
from mooncake_cli.store.eviction.density import PERIOD, HitDensityPolicy, bucket, length_class


def test_buckets_are_logarithmic_in_age() -> None:
    assert bucket(0) == 0
    assert bucket(1) < bucket(3) < bucket(15) < bucket(1 << 20)
    assert bucket(1 << 40) == bucket(1 << 60)  # the last bucket holds every older age


def test_oldest_first_within_a_class_and_untouched_keys_follow_their_class() -> None:
    p = HitDensityPolicy()
    for k in ("a", "b", "c"):
        p.admit(k)
    p.touch("a", False)  # renewed, not read: still class 0, now the youngest
    assert list(p.victims()) == ["b", "c", "a"]
    p.touch("b", True)  # read: class 1
    assert p.queues[1] and list(p.queues[1]) == ["b"]
    assert sorted(p.victims()) == ["a", "b", "c"] and len(p) == 3
    p.remove("c", evicted=False)
    p.remove("nope", evicted=True)  # unknown keys are ignored
    assert sorted(p.victims()) == ["a", "b"]


def test_keys_read_again_are_learnt_to_be_worth_more_than_one_shot_keys() -> None:
    p = HitDensityPolicy()
    hot = [f"h{i}" for i in range(8)]
    for k in hot:
        p.admit(k)
    n = 0
    while p.clock < 3 * PERIOD:  # hot keys read over and over, a stream of one-shot keys
        for k in hot:
            p.touch(k, True)
        for _ in range(8):
            p.admit(f"s{n}")
            n += 1
            if len(p) > 64:
                p.remove(next(p.victims()), evicted=True)
    for k in hot:  # just read: younger than their reuse gap
        p.touch(k, True)
    assert p.odds[p.queues.index(next(q for q in p.queues if "h0" in q))] > 100 * p.odds[0]
    got = list(p.victims())
    assert all(got.index(k) >= len(got) - len(hot) for k in hot), got[-12:]


def test_an_evicted_key_put_again_counts_as_reused() -> None:
    p = HitDensityPolicy()
    p.admit("x")
    p.remove("x", evicted=True)
    before = p._reused[0]
    p.admit("x")  # remembered as a ghost: a reuse of class 0, and back in class 1
    assert p._reused[0] == before + 1 and list(p.queues[1]) == ["x"]
    p.remove("x", evicted=False)
    p.admit("x")  # removed, not evicted: no ghost, a new key
    assert list(p.queues[0]) == ["x"]


def test_prefix_steers_hit_density_by_default() -> None:
    assert isinstance(PrefixPolicy().inner, HitDensityPolicy)


def test_an_unused_chain_is_classed_by_its_length_and_learnt_as_one() -> None:
    p = HitDensityPolicy()
    for n, name in ((3, "s"), (5, "m"), (20, "l"), (70, "x")):
        keys = [f"{name}{i}" for i in range(n)]
        for k in keys:
            p.admit(k)
        p.chain(keys)
    classes = {name: p._class[f"{name}0"] for name in "smlx"}
    assert classes["s"] == 0 and len({classes[n] for n in "mlx"}) == 3
    assert length_class(4) == length_class(15) != length_class(16) == length_class(63)
    assert length_class(64) == length_class(1000) and length_class(3) == 0
    assert p._entries[0] == 1.0 + 3  # the chained ones are counted in their own classes
    p.touch("m0", True)  # a read: read-count classes from then on
    assert p._class["m0"] == 1
    p.chain(["m0", "m1", "m2", "m3", "m4"])  # a used object keeps its class
    assert p._class["m0"] == 1 and p._class["m1"] == classes["m"]
    hot, cold = [f"h{i}" for i in range(64)], 0
    while p.clock < 3 * PERIOD:  # long chains never used again; short chains read back
        for k in hot[:4]:
            p.admit(k)
        p.chain(hot[:4])
        for k in hot[:4]:
            p.touch(k, True)
        for k in hot[:4]:
            p.remove(k, evicted=False)
        longs = [f"c{cold + i}" for i in range(64)]
        cold += 64
        for k in longs:
            p.admit(k)
        p.chain(longs)
        for k in longs:
            p.remove(k, evicted=True)
    assert p.odds[length_class(4)] > 10 * p.odds[length_class(64)]
