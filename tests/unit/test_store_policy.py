"""Each eviction policy's victim order on small hand-built sequences: LRU, LFU (frequency
buckets, ties least recently used first), ARC (capacity re-split by ghost hits), adaptive
(follows whichever expert has been hitting lately, and switches back), prefix (chain ends
first, tails before heads, standing passed down a chain in use)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from mooncake_cli.interfaces import ConfigError, EvictionPolicy
from mooncake_cli.store.eviction import (
    BUILTIN,
    AdaptivePolicy,
    ArcPolicy,
    LfuPolicy,
    LruPolicy,
    PrefixPolicy,
    make_policy,
    policy_names,
)


def order(p: EvictionPolicy) -> list[str]:
    return list(p.victims())


def admit(p: EvictionPolicy, keys: Iterable[str]) -> None:
    for k in keys:
        p.admit(k)


class Cache:
    """Drives a policy as a cache of `room` keys: a miss admits (evicting the first victim)."""

    def __init__(self, policy: EvictionPolicy, room: int) -> None:
        self.policy, self.room, self.held = policy, room, set[str]()
        self.hits = 0

    def access(self, key: str) -> None:
        if key in self.held:
            self.hits += 1
            self.policy.touch(key, True)
            return
        if len(self.held) >= self.room:
            victim = next(self.policy.victims())
            self.policy.remove(victim, True)
            self.held.discard(victim)
        self.policy.admit(key)
        self.held.add(key)


def test_every_builtin_is_an_eviction_policy_and_unknown_names_are_refused() -> None:
    for name in BUILTIN:
        p = make_policy(name)
        assert isinstance(p, EvictionPolicy) and p.name == name
    assert set(BUILTIN) <= set(policy_names())
    with pytest.raises(ConfigError, match="unknown eviction policy 'mru'.*lru"):
        make_policy("mru")


def test_lru_renewal_and_reads_both_move_to_the_back() -> None:
    p = LruPolicy()
    admit(p, "abcd")
    p.touch("a", True)
    p.touch("b", False)
    p.remove("c", True)
    assert order(p) == ["d", "a", "b"]


def test_lfu_counts_reads_only_and_breaks_ties_least_recently_used_first() -> None:
    p = LfuPolicy()
    admit(p, "abcd")
    for k in ("a", "a", "b", "c"):
        p.touch(k, True)
    assert [p.frequency(k) for k in "abcd"] == [3, 2, 2, 1]
    assert order(p) == ["d", "b", "c", "a"]  # b and c tie at 2: b was read first
    p.touch("b", False)  # a renewal: same count, now the more recent of the tie
    assert order(p) == ["d", "c", "b", "a"]
    p.remove("d", True)
    p.admit("d")  # back at one use
    assert p.frequency("d") == 1 and order(p)[0] == "d"


def test_arc_recent_side_first_then_a_ghost_hit_grows_its_share() -> None:
    p = ArcPolicy()
    admit(p, "abc")
    p.touch("a", True)  # read again: to the frequency side
    assert list(p.recent) == ["b", "c"] and list(p.frequent) == ["a"]
    assert order(p) == ["b", "c", "a"]  # share 0: recency side above it goes first
    p.remove("b", True)  # evicted from the recency side: remembered as its ghost
    assert p.share == 0
    p.admit("b")  # recency would have kept it: its share grows, b joins the frequent side
    assert p.share > 0 and "b" in p.frequent
    share = p.share
    p.touch("c", True)
    p.remove("a", True)  # evicted from the frequency side: its ghost
    p.admit("a")
    assert p.share < share  # a frequency ghost hit gives capacity back to that side


def test_adaptive_follows_lfu_through_scans_then_lru_when_the_working_set_moves() -> None:
    cache = Cache(AdaptivePolicy(), room=3)
    p = cache.policy
    assert isinstance(p, AdaptivePolicy)
    for _ in range(3):  # two hot keys, then a scan that would flush an LRU cache of 3
        for k in ("h1", "h2", "h1", "h2", "h1", "h2", "s1", "s2", "s3", "s4"):
            cache.access(k)
    assert p.leader.name == "lfu" and order(p) == order(p.experts[1])
    for _ in range(20):  # a new working set of three, which LFU's old favourites crowd out
        for k in ("w1", "w2", "w3"):
            cache.access(k)
    assert p.leader.name in ("lru", "arc")
    assert p.scores[0] > p.scores[1]  # LRU's shadow has been hitting more than LFU's lately
    assert order(p) == order(p.leader)


def chain(p: EvictionPolicy, keys: list[str], held: set[str]) -> None:
    """What a prefill does: look the chain up, put what was missing, both as batches."""
    for k in keys:
        if k in held:
            p.touch(k, True)
    p.chain(keys)
    new = [k for k in keys if k not in held]
    for k in new:
        p.admit(k)
        held.add(k)
    for k in new:
        p.touch(k, False)  # put_end
    if new:
        p.chain(new)


def test_prefix_cuts_chains_from_their_ends_and_tails_and_keeps_heads() -> None:
    p, held = PrefixPolicy(LruPolicy()), set[str]()
    chain(p, ["sys", "a1", "a2", "a3"], held)
    chain(p, ["sys", "b1", "b2"], held)
    assert p.parent("a3") == "a2" and p.parent("b1") == "sys"
    # the chain ends first (oldest first), then tails before heads; sys, the shared head, last
    assert order(p) == ["a3", "b2", "a2", "a1", "b1", "sys"]
    chain(p, ["sys", "a1", "a2", "a4"], held)  # a's next turn: a2 continued by a4, a3 left
    assert order(p)[:3] == ["a3", "b2", "a4"]
    assert order(p).index("b1") < order(p).index("a2")  # b is the older chain


def test_prefix_never_puts_a_parent_before_its_held_children() -> None:
    p, held = PrefixPolicy(LruPolicy()), set[str]()
    chain(p, ["r", "x", "y", "z"], held)
    chain(p, ["q"], held)
    p.touch("z", True)  # a lone read of the tail: by recency alone z outlives y, x and r
    got = order(p)
    for child, parent in (("z", "y"), ("y", "x"), ("x", "r")):
        assert got.index(child) < got.index(parent), got
    p.remove("z", True)
    p.remove("y", True)
    assert order(p).index("x") < order(p).index("r")
    p.admit("y")  # put again: its remembered link comes back
    assert p.parent("y") == "x"


def test_prefix_passes_a_chain_in_use_its_standing_unless_the_parent_is_shared() -> None:
    p, held = PrefixPolicy(LfuPolicy()), set[str]()
    inner = p.inner
    assert isinstance(inner, LfuPolicy)
    for conv in ("a", "b", "c", "d"):
        chain(p, ["sys", f"{conv}1"], held)
    chain(p, ["sys", "a1", "a2"], held)  # a's next turn: a1 was read, a2 continues it
    assert inner.frequency("a2") == 2  # a read's standing, like its parent's
    chain(p, ["sys", "e1"], held)  # sys has many children: e1 gets no standing from it
    assert inner.frequency("e1") == 1
