"""`mooncake bench store-policy`: a golden replay of the first 1,000 trace requests through the
real master under every built-in policy, LRU's figures against an independent plain-LRU
replay, Belady's bound and the ceiling on hand-built traces, and the command's JSON, plot
and errors."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mooncake_cli.app import app
from mooncake_cli.sim.trace import load_trace
from mooncake_cli.store.eviction.bounds import belady, ceiling
from mooncake_cli.store.eviction.compare import compare
from mooncake_cli.store.eviction.replay import replay

TRACE = "conversation"  # the FAST'25 trace shipped with the package (mooncake_cli/data)
runner = CliRunner()

# (prefix hits, block hits, evictions) of the first 1,000 requests (27,305 block accesses,
# 21,514 distinct blocks) at 1%, 5% and 20% of the distinct blocks
GOLDEN = {
    215: {"lru": (999, 999, 25986), "lfu": (999, 999, 25986), "adaptive": (999, 999, 25986),
          "arc": (999, 999, 25986), "prefix": (1009, 1009, 25976)},
    1075: {"lru": (1052, 1052, 25178), "lfu": (1077, 1077, 25153),
           "adaptive": (1132, 1132, 25098), "arc": (1206, 1206, 25024),
           "prefix": (1492, 1492, 24738)},
    4302: {"lru": (2238, 2238, 20765), "lfu": (2356, 2356, 20647),
           "adaptive": (2309, 2309, 20694), "arc": (2700, 2700, 20303),
           "prefix": (2446, 2446, 20557)},
}
BELADY = {215: 2261, 1075: 4390, 4302: 5791}


def first(n: int) -> list[tuple[int, ...]]:
    return [r.hash_ids for r in load_trace(str(TRACE), limit=n)]


def plain_lru(requests: list[tuple[int, ...]], capacity: int) -> int:
    """Prefix hits of a plain LRU cache: look every block up, then insert the missing ones."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for ids in requests:
        found = [h in cache for h in ids]
        for h, f in zip(ids, found, strict=True):
            if f:
                cache.move_to_end(h)
        run = 0
        while run < len(found) and found[run]:
            run += 1
        hits += run
        new = [h for h, f in zip(ids, found, strict=True) if not f]
        while cache and len(cache) + len(new) > capacity:
            cache.popitem(last=False)
        cache.update(dict.fromkeys(new))
    return hits


def test_golden_replay_of_the_first_thousand_requests() -> None:
    reqs = first(1000)
    rep = compare(reqs, list(GOLDEN[215]), [0.01, 0.05, 0.20])
    assert (rep["blocks"], rep["distinct_blocks"]) == (27305, 21514)
    assert rep["ceiling"]["prefix_hits"] == 5791
    for row in rep["capacities"]:
        cap = row["capacity"]
        got = {n: (r["prefix_hits"], r["block_hits"], r["evictions"])
               for n, r in row["policies"].items()}
        assert got == GOLDEN[cap], cap
        assert row["belady"]["block_hits"] == BELADY[cap]
        for r in row["policies"].values():
            assert r["block_hits"] <= BELADY[cap] <= rep["ceiling"]["block_hits"]


def test_lru_through_the_master_matches_a_plain_lru_cache() -> None:
    reqs = first(1000)
    for cap in (1075, 4302):
        assert replay(reqs, "lru", cap).prefix_hits == plain_lru(reqs, cap)


def test_belady_and_the_ceiling_on_hand_built_traces() -> None:
    # accesses 1 2 3 1 4 1 2 3 with room for 2: MIN keeps 1 and 2, passes 3 and 4 by
    reqs = [(1, 2, 3), (1, 4), (1, 2), (3,)]
    b = belady(reqs, 2)
    assert (b.block_hits, b.prefix_hits, b.blocks) == (3, 3, 8)
    c = ceiling(reqs)
    assert (c.block_hits, c.prefix_hits) == (4, 4)
    # block 2 is found behind a miss: a block hit, not a prefix hit
    c = ceiling([(1, 2), (3, 2)])
    assert (c.block_hits, c.prefix_hits) == (1, 0)
    r = replay([(1, 2), (3, 2)], "lru", 10)
    assert (r.block_hits, r.prefix_hits) == (1, 0)
    for policy in ("lru", "lfu", "adaptive", "arc", "prefix"):
        assert replay(reqs, policy, 2).block_hits <= b.block_hits


def write_trace(path: Path, rows: list[list[int]]) -> str:
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": 512 * len(h),
                                        "output_length": 1, "hash_ids": h}) + "\n"
                            for i, h in enumerate(rows)))
    return str(path)


def test_command_json_and_plot(tmp_path: Path) -> None:
    rows = [[0, i, i + 1000] for i in range(1, 40)] + [[0, i, i + 1000, i + 2000]
                                                       for i in range(1, 40)]
    trace = write_trace(tmp_path / "t.jsonl", rows)
    png = tmp_path / "plots" / "p.png"
    result = runner.invoke(app, ["--json", "bench", "store-policy", "--trace", trace,
                                 "--policy", "lru,prefix", "--capacity", "5%,50%",
                                 "--plot", str(png)], prog_name="mooncake")
    assert result.exit_code == 0, result.output
    rep = json.loads(result.output)
    assert [r["capacity"] for r in rep["capacities"]] == [5, 59]  # of 118 distinct blocks
    assert list(rep["capacities"][0]["policies"]) == ["lru", "prefix"]
    reqs = [tuple(h) for h in rows]
    for row in rep["capacities"]:
        for name, r in row["policies"].items():
            assert r["prefix_hits"] == replay(reqs, name, row["capacity"]).prefix_hits
        assert row["belady"]["block_hits"] == belady(reqs, row["capacity"]).block_hits
    assert rep["ceiling"]["prefix_hits"] == ceiling(reqs).prefix_hits == 38 + 39 * 3
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and rep["plot"] == str(png)


@pytest.mark.parametrize("args,words", [
    (["--capacity", "0%"], "--capacity"), (["--capacity", "lots"], "--capacity"),
    (["--policy", "nope"], "unknown eviction policy"),
])
def test_command_refuses_bad_input_in_one_line(tmp_path: Path, args: list[str],
                                               words: str) -> None:
    trace = write_trace(tmp_path / "t.jsonl", [[0, 1]])
    result = runner.invoke(app, ["bench", "store-policy", "--trace", trace, *args],
                           prog_name="mooncake")
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.output


def test_command_names_a_missing_trace(tmp_path: Path) -> None:
    result = runner.invoke(app, ["bench", "store-policy", "--trace", str(tmp_path / "no")],
                           prog_name="mooncake")
    assert result.exit_code == 2 and "does not exist" in result.output
