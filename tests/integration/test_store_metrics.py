"""The master's Prometheus /metrics and /health port: an in-process MasterService with real
StoreClients putting objects, scraped with urllib; and the subprocess entry's ready line."""

from __future__ import annotations

import json
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from mooncake_cli.app import app
from mooncake_cli.store import ReplicateConfig, StoreCode, StoreError
from mooncake_cli.store.client import StoreClient
from mooncake_cli.store.errors import ObjectNotFound
from mooncake_cli.store.master import StoreMaster
from mooncake_cli.store.service import MasterService
from tests.conftest import free_port
from tests.helpers.store_procs import Proc, start_master

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20
# one sample line of the text exposition format: name{label="value",...} value
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
                    r',?)*)\})? (-?[0-9.eE+-]+|NaN|[+-]Inf)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def fetch(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Samples of a Prometheus text exposition, checking every line's syntax and that each
    sample's metric was declared by HELP and TYPE lines before it."""
    assert text.endswith("\n")
    declared: dict[str, str] = {}
    helped: set[str] = set()
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split(" ")[2])
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("gauge", "counter"), line
            declared[name] = kind
        else:
            m = SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            name, labels, value = m.groups()
            assert name in declared and name in helped, f"undeclared metric: {line!r}"
            if declared[name] == "counter":
                assert name.endswith("_total"), name
            key = (name, frozenset(LABEL.findall(labels or "")))
            assert key not in samples, f"duplicate sample: {line!r}"
            samples[key] = float(value)
    return samples


def one(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
        **labels: str) -> float:
    return samples[("mooncake_store_" + name, frozenset(labels.items()))]


@pytest.fixture
def service() -> Iterator[MasterService]:
    with MasterService(StoreMaster(), port=0, metrics_port=0, tick_interval=0.2) as s:
        yield s


@pytest.fixture
def client(service: MasterService,
           make_engine: Callable[..., Any]) -> Iterator[Callable[..., StoreClient]]:
    made: list[StoreClient] = []

    def make(segment_size: int = 16 * MiB) -> StoreClient:
        made.append(StoreClient(service.address, make_engine(timeout=3), segment_size))
        return made[-1]

    yield make
    for c in made:
        c.close()


def test_metrics_count_what_was_put(service: MasterService,
                                    client: Callable[..., StoreClient]) -> None:
    assert service.metrics_url is not None
    assert service.metrics_url.startswith("http://127.0.0.1:")
    status, ctype, text = fetch(service.metrics_url)
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
    empty = parse(text)
    assert one(empty, "objects") == 0 and one(empty, "clients") == 0
    assert one(empty, "puts_total") == 0

    a, b = client(), client()
    values = {"k0": b"x" * 1000, "k1": b"y" * 4096, "k2": b"z" * (3 * MiB + 7)}
    for key, data in values.items():
        a.put(key, data, ReplicateConfig(replica_num=2 if key == "k1" else 1))
    assert b.get("k0") == values["k0"]
    with pytest.raises(ObjectNotFound):
        b.get("missing")
    with pytest.raises(StoreError) as e:
        a.put("k0", b"again")
    assert e.value.code == StoreCode.OBJECT_ALREADY_EXISTS

    s = parse(fetch(service.metrics_url)[2])
    stats = service.master.stats()
    assert one(s, "objects") == len(values) == stats.objects
    assert one(s, "pending_puts") == 0
    assert one(s, "clients") == 2
    assert one(s, "segments", tier="dram") == 2
    assert one(s, "tier_objects", tier="dram") == len(values)
    assert one(s, "capacity_bytes", tier="dram") == 2 * 16 * MiB
    # allocation rounds up to an alignment: at least what was put (k1 twice), and what stats say
    put_bytes = sum(len(v) for v in values.values()) + len(values["k1"])
    used = one(s, "bytes_used", tier="dram")
    assert put_bytes <= used == stats.tiers["dram"].bytes_used < 2 * 16 * MiB
    assert one(s, "puts_total") == len(values)
    assert one(s, "gets_total") >= 2 and one(s, "hits_total") >= 1
    assert one(s, "misses_total") >= 1 and one(s, "evictions_total") == 0
    for tier in stats.tiers:  # every tier stats() knows is exported, labelled
        assert ("mooncake_store_capacity_bytes", frozenset({("tier", tier)})) in s

    a.remove("k2", force=True)
    s = parse(fetch(service.metrics_url)[2])
    assert one(s, "objects") == len(values) - 1
    assert one(s, "bytes_used", tier="dram") < used


def test_health_and_unknown_paths(service: MasterService) -> None:
    assert service.metrics is not None
    base = f"http://127.0.0.1:{service.metrics.port}"
    status, ctype, body = fetch(base + "/health")
    assert (status, json.loads(body)) == (200, {"status": "ok"})
    assert ctype == "application/json"
    for path in ("/", "/metric", "/health/x", "/nope"):
        assert fetch(base + path)[0] == 404, path
    assert fetch(base + "/metrics?x=1")[0] == 200


def test_metrics_off_by_default_and_closed_with_the_service() -> None:
    with MasterService(StoreMaster(), port=0) as s:
        assert s.metrics is None and s.metrics_url is None
    s = MasterService(StoreMaster(), port=0, metrics_port=0)
    assert s.metrics is not None
    url = s.metrics.url.replace("/metrics", "/health")
    assert fetch(url)[0] == 200
    s.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)


def test_metrics_port_in_use_is_a_store_error() -> None:
    with MasterService(StoreMaster(), port=0, metrics_port=0) as s:
        assert s.metrics is not None
        with pytest.raises(StoreError, match="cannot serve metrics"):
            MasterService(StoreMaster(), port=0, metrics_port=s.metrics.port)


def test_subprocess_entry_announces_metrics() -> None:
    port = free_port()
    m = start_master(free_port(), "--metrics-port", str(port))
    try:
        assert m.ready["metrics"] == f"http://127.0.0.1:{port}/metrics"
        s = parse(fetch(m.ready["metrics"])[2])
        assert one(s, "objects") == 0
        assert fetch(f"http://127.0.0.1:{port}/health")[0] == 200
    finally:
        assert m.stop() == 0
    plain = start_master(free_port())
    try:
        assert "metrics" not in plain.ready
    finally:
        assert plain.stop() == 0


def test_cli_master_announces_metrics_and_checks_the_port() -> None:
    m = Proc([sys.executable, "-m", "mooncake_cli", "--json", "store", "master",
              "--port", str(free_port()), "--metrics-port", "0"])
    try:
        url = str(m.ready["metrics"])
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url), url
        assert one(parse(fetch(url)[2]), "clients") == 0
    finally:
        assert m.stop() == 0
    result = CliRunner().invoke(app, ["store", "master", "--port", "0", "--metrics-port",
                                      "70000"], prog_name="mooncake")
    assert result.exit_code == 2 and "metrics-port" in result.output
