"""The global cache index kept current by events, and the cost models (paper formula and a
profile.json fitted by least squares)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.scheduler.costmodel import PROFILE_SCHEMA, load_profile, paper
from mooncake_cli.scheduler.index import CacheEvent, CacheIndex
from mooncake_cli.scheduler.state import Cluster


def test_events_keep_holders_current() -> None:
    idx = CacheIndex()
    idx.add_instance("a")
    idx.add_instance("b")
    idx.apply(CacheEvent("stored", "a", ("k1", "k2", "k3")))
    idx.apply(CacheEvent("stored", "b", ("k1", "k2")))
    assert idx.holders("k1") == {"a", "b"} and idx.holders("k3") == {"a"}
    assert idx.prefix_lengths(["k1", "k2", "k3", "k4"]) == {"a": 3, "b": 2}
    idx.apply(CacheEvent("evicted", "a", ("k2",)))
    assert idx.prefix_lengths(["k1", "k2", "k3"]) == {"a": 1, "b": 2}
    assert idx.holders("k2") == {"b"}
    idx.apply(CacheEvent("dropped", "b"))
    assert idx.holders("k2") == frozenset() and idx.instances() == ["a"]
    assert idx.prefix_len("a", ["k1", "k3"]) == 2 and idx.prefix_len("gone", ["k1"]) == 0
    with pytest.raises(ValueError, match="stored"):
        CacheEvent("forgot", "a")


def test_lru_capacity_evicts_least_recently_used() -> None:
    idx = CacheIndex()
    idx.add_instance("a", capacity_blocks=3)
    assert idx.store("a", [1, 2, 3]) == []
    idx.apply(CacheEvent("touched", "a", (1,)))  # 1 is now the most recently used
    assert idx.store("a", [4, 5]) == [2, 3]
    assert idx.blocks("a") == 3 and idx.holders(2) == frozenset()
    assert idx.prefix_lengths([1]) == {"a": 1} and idx.prefix_lengths([2, 1]) == {}
    idx.add_instance("z", capacity_blocks=0)  # a cache of nothing keeps nothing
    assert idx.store("z", [7]) == [7] and idx.holders(7) == frozenset()


def test_cluster_remove_drops_instance_blocks() -> None:
    c = Cluster(paper())
    c.add("p0", "prefill", cache_blocks=10)
    c.add("d0", "decode")
    c.index.store("p0", ["x"])
    with pytest.raises(ValueError, match="already"):
        c.add("p0", "prefill")
    c.remove("p0")
    assert c.index.holders("x") == frozenset() and not c.prefill and "p0" not in c.by_name


def test_paper_prefill_formula() -> None:
    m = paper()
    n, p = 8192, 2048
    flops = 80 * (4 * (n * n - p * p) * 8192 + 22 * (n - p) * 8192 ** 2)
    assert m.prefill_time(n, p) == pytest.approx(flops / (8 * 312e12 * 0.5))
    assert m.prefill_time(n, p) == pytest.approx(m.prefill_time(n) - m.prefill_time(p))
    assert m.prefill_time(n, n) == 0.0
    assert m.kv_bytes_per_token == 320 * 1024 and m.bandwidth == 100e9
    assert m.decode_step_time(2, 10_000) > m.decode_step_time(1, 1_000) > 0


def write_profile(path: Path, **over: object) -> str:
    def pre(n: int, p: int) -> float:
        return 0.002 + 1e-9 * (n * n - p * p) + 5e-5 * (n - p)

    doc = {"schema": PROFILE_SCHEMA, "model": "tiny", "device": "cpu", "block_tokens": 16,
           "kv_bytes_per_token": 4096, "bandwidth_bytes_per_s": 1e9,
           "prefill": [{"input_tokens": n, "cached_tokens": p, "seconds": pre(n, p)}
                       for n, p in [(128, 0), (512, 0), (1024, 256), (2048, 0), (2048, 1024)]],
           "decode": [{"batch": b, "context_tokens": c, "seconds": 0.01 + 0.001 * b + 1e-7 * c}
                      for b, c in [(1, 100), (4, 4000), (8, 1000), (16, 30000)]]}
    doc.update(over)
    path.write_text(json.dumps(doc))
    return str(path)


def test_profile_fit_reproduces_measurements(tmp_path: Path) -> None:
    m = load_profile(write_profile(tmp_path / "profile.json"))
    assert m.prefill_time(4096, 1024) == pytest.approx(
        0.002 + 1e-9 * (4096 ** 2 - 1024 ** 2) + 5e-5 * 3072, rel=1e-6)
    assert m.decode_step_time(32, 50_000) == pytest.approx(0.01 + 0.032 + 0.005, rel=1e-6)
    assert (m.block_tokens, m.kv_bytes_per_token, m.bandwidth) == (16, 4096, 1e9)
    assert "tiny" in m.name


@pytest.mark.parametrize("over,match", [
    ({"schema": "other/9"}, "schema"),
    ({"prefill": []}, "3 distinct"),
    ({"decode": [{"batch": 1, "seconds": 0.1}]}, "context_tokens"),
    ({"prefill": [{"input_tokens": 5, "cached_tokens": 9, "seconds": 1}] * 3}, "exceeds"),
    ({"bandwidth_bytes_per_s": "fast"}, "number"),
])
def test_bad_profiles_say_what_is_wrong(tmp_path: Path, over: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=match):
        load_profile(write_profile(tmp_path / "p.json", **over))


def test_missing_or_broken_profile(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_profile(str(tmp_path / "none.json"))
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_profile(str(tmp_path / "bad.json"))
