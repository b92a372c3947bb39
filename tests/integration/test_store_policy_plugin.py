"""The policy interface through a third-party policy registered as an entry point (a real
dist-info on the path, found by importlib.metadata): used by a master in-process and by
`mooncake store master --eviction` in its own process, whose /metrics and `store stat` name it;
a broken or unknown one is a one-line error. Per-policy figures: /metrics and the stats reply."""

from __future__ import annotations

import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mooncake_cli.app import app
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.store import Mount, ReplicateConfig, StoreMaster
from mooncake_cli.store.eviction import make_policy, policy_names
from mooncake_cli.store.metrics import render
from mooncake_cli.store.records import StoreStats
from mooncake_cli.store.wire import protocol
from tests.helpers.clock import FakeClock
from tests.helpers.prom import value
from tests.helpers.store_procs import Proc

KiB = 1 << 10

PLUGIN = '''
from collections.abc import Iterator, Sequence


class FifoPolicy:
    """First in, first out: reads change nothing."""

    name = "fifo-test"

    def __init__(self) -> None:
        self.keys: dict[str, None] = {}

    def admit(self, key: str) -> None:
        self.keys[key] = None

    def touch(self, key: str, hit: bool) -> None:
        pass

    def chain(self, keys: Sequence[str]) -> None:
        pass

    def remove(self, key: str, evicted: bool) -> None:
        self.keys.pop(key, None)

    def victims(self) -> Iterator[str]:
        return iter(self.keys)


def broken() -> None:
    raise RuntimeError("this plugin is broken")
'''


@pytest.fixture()
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "fifo_policy_plugin.py").write_text(PLUGIN)
    info = tmp_path / "fifo_policy_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fifo-policy-plugin\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent("""\
        [mooncake.eviction_policies]
        fifo-test = fifo_policy_plugin:FifoPolicy
        broken-test = fifo_policy_plugin:broken
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def test_a_plugin_policy_orders_the_master(plugin_path: Path) -> None:
    assert {"fifo-test", "broken-test"} <= set(policy_names())
    clock = FakeClock()
    m = StoreMaster(now=clock, eviction="fifo-test", lease_ttl=1.0,
                    high_watermark=1.0)
    assert m.policy.name == "fifo-test"
    m.mount_segment(Mount("s", "c", "h", 0, 4 * 4 * KiB))
    for k in "abcd":
        m.put_start(k, 4 * KiB, ReplicateConfig())
        m.put_end(k)
    m.get_replica_list("a")  # under LRU, b would go first; first in is first out here
    clock.t = 2.0  # a's lease is over
    assert m.evict(1) == ["a"]
    assert m.list() == ["b", "c", "d"]


def test_broken_and_unknown_policies_are_clear_errors(plugin_path: Path) -> None:
    with pytest.raises(ConfigError, match="'broken-test'.*RuntimeError: this plugin is broken"):
        make_policy("broken-test")
    for name, words in (("broken-test", "failed to load"), ("nope", "unknown eviction")):
        result = CliRunner().invoke(app, ["store", "master", "--port", "0", "--eviction", name],
                                    prog_name="mooncake")
        assert result.exit_code == 2, result.output
        assert words in result.output and "Traceback" not in result.output


def test_cli_master_runs_a_plugin_policy_and_reports_it(plugin_path: Path) -> None:
    m = Proc([sys.executable, "-m", "mooncake_cli", "--json", "store", "master", "--port", "0",
              "--metrics-port", "0", "--eviction", "fifo-test"])
    try:
        assert m.ready["eviction"] == "fifo-test"
        with urllib.request.urlopen(str(m.ready["metrics"]), timeout=10) as r:
            text = r.read().decode()
        assert value(text, "mooncake_store_eviction_policy", policy="fifo-test") == 1
        assert value(text, "mooncake_store_evictions_by_cause_total", policy="fifo-test",
                     cause="room") == 0
        result = CliRunner().invoke(app, ["--json", "store", "stat", "--master",
                                          str(m.ready["address"])], prog_name="mooncake")
        assert result.exit_code == 0, result.output
        assert '"policy": "fifo-test"' in result.output
    finally:
        assert m.stop() == 0


def test_metrics_and_the_stats_reply_carry_the_policy_figures() -> None:
    m = StoreMaster(now=FakeClock(), eviction="lfu", high_watermark=1.0)
    m.mount_segment(Mount("s", "c", "h", 0, 4 * 4 * KiB))
    for i in range(6):  # two more than fit: two evictions for room
        m.put_start(f"k{i}", 4 * KiB)
        m.put_end(f"k{i}")
    m.get_replica_list("k5")
    stats = m.stats()
    assert stats.policy == "lfu" and stats.evicted_by == {"room": 2}
    assert stats.tiers["dram"].resident_bytes == 4 * 4 * KiB
    text = render(stats)
    for name, labels, want in (
            ("eviction_policy", {"policy": "lfu"}, 1),
            ("policy_hits_total", {"policy": "lfu"}, 1),
            ("evictions_by_cause_total", {"policy": "lfu", "cause": "room"}, 2),
            ("evictions_by_cause_total", {"policy": "lfu", "cause": "ssd"}, 0),
            ("resident_bytes", {"tier": "dram"}, 16384),
            ("copied_bytes_total", {"kind": "replica"}, 0)):
        assert value(text, "mooncake_store_" + name, **labels) == want, name
    reply = protocol.decode_reply(protocol.encode(protocol.run(m, protocol.Stats())))
    wire = protocol.result(reply, StoreStats)
    assert (wire.policy, dict(wire.evicted_by), wire.tiers["dram"].resident_bytes) == \
        ("lfu", {"room": 2}, 4 * 4 * KiB)
