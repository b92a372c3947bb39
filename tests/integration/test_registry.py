"""The plugin registry over entry points built in memory (nothing is installed): broken and
unavailable plugins are reported, never fatal; MOONCAKE_PLUGINS restricts transports only."""

from __future__ import annotations

import importlib.metadata as md
import sys
import types
from collections.abc import Iterator

import pytest

from mooncake_cli.interfaces import ConfigError, PluginError
from mooncake_cli.registry import GROUPS, Registry

T, TIERS = "mooncake.transports", "mooncake.tiers"
FAKE = "mooncake_test_fake_plugins"


class Unavailable:
    name = "rdma"
    priority = 30

    def available(self) -> tuple[bool, str]:
        return False, "pyverbs is not installed (pip install pyverbs) and no RDMA device found"


class Exploding:
    name = "boom"

    def __init__(self) -> None:
        raise RuntimeError("constructor blew up")


class AvailableRaises:
    name = "flaky"

    def available(self) -> tuple[bool, str]:
        raise OSError("cannot probe the device")


@pytest.fixture(autouse=True)
def fake_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An importable module holding the fake plugin classes (only for these tests)."""
    mod = types.ModuleType(FAKE)
    mod.Unavailable = Unavailable  # type: ignore[attr-defined]
    mod.Exploding = Exploding  # type: ignore[attr-defined]
    mod.AvailableRaises = AvailableRaises  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, FAKE, mod)
    yield


def ep(name: str, value: str, group: str = T) -> md.EntryPoint:
    return md.EntryPoint(name, value, group)


def entry_points() -> list[md.EntryPoint]:
    return [
        ep("tcp", "mooncake_backends.tcp:TcpTransport"),
        ep("shm", "mooncake_backends.shm:ShmTransport"),
        ep("hccl", "mooncake_hccl_missing_pkg.transport:HcclTransport"),  # module does not exist
        ep("rdma", f"{FAKE}:Unavailable"),
        ep("boom", f"{FAKE}:Exploding"),
        ep("flaky", f"{FAKE}:AvailableRaises"),
        ep("ghost", "mooncake_backends.tcp:NoSuchClass"),
        ep("dram", "mooncake_backends.dram:DramTier", TIERS),
        ep("ssd", "mooncake_ssd_missing_pkg:SsdTier", TIERS),
    ]


def by_name(reg: Registry, group: str) -> dict[str, object]:
    return {p.name: p for p in reg.plugins(group)}


def test_installed_entry_points_include_the_built_ins() -> None:
    transports = {e.name: e for e in md.entry_points(group=T)}
    tiers = {e.name: e for e in md.entry_points(group=TIERS)}
    assert {"tcp", "shm"} <= set(transports)
    assert "dram" in tiers
    assert transports["tcp"].value == "mooncake_backends.tcp:TcpTransport"
    reg = Registry()
    infos = {(p.group, p.name): p for p in reg.plugins()}
    for key in ((T, "tcp"), (T, "shm"), (TIERS, "dram")):
        assert infos[key].package == "mooncake-cli"
        assert infos[key].version not in ("", "unknown")
        assert infos[key].available, infos[key].reason
    assert {"tcp", "shm"} <= {t.name for t in reg.available(T)}
    assert reg.get(T, "tcp").name == "tcp"
    assert reg.get(TIERS, "dram").name == "dram"


def test_a_missing_module_is_reported_with_its_package_and_the_others_work() -> None:
    reg = Registry(entry_points())
    info = by_name(reg, T)["hccl"]
    assert not info.available and info.loaded  # type: ignore[attr-defined]
    assert "mooncake_hccl_missing_pkg" in info.package  # type: ignore[attr-defined]
    assert "mooncake_hccl_missing_pkg" in info.reason  # type: ignore[attr-defined]
    assert "ModuleNotFoundError" in info.reason  # type: ignore[attr-defined]
    assert "failed to load" in info.reason  # type: ignore[attr-defined]
    # everything else keeps working
    assert {t.name for t in reg.available(T)} == {"tcp", "shm"}
    assert [t.name for t in reg.available(TIERS)] == ["dram"]
    assert reg.get(T, "tcp").available() == (True, "")
    ssd = by_name(reg, TIERS)["ssd"]
    assert not ssd.available and "ModuleNotFoundError" in ssd.reason  # type: ignore[attr-defined]


@pytest.mark.parametrize("name,error", [
    ("boom", "RuntimeError: constructor blew up"),
    ("flaky", "OSError: cannot probe the device"),
    ("ghost", "AttributeError"),
])
def test_a_plugin_that_fails_to_construct_or_probe_is_reported(name: str, error: str) -> None:
    reg = Registry(entry_points())
    info = by_name(reg, T)[name]
    assert not info.available  # type: ignore[attr-defined]
    assert error in info.reason  # type: ignore[attr-defined]
    with pytest.raises(PluginError, match=f"plugin '{name}' is not available"):
        reg.get(T, name)
    assert reg.get(T, "shm").name == "shm"


def test_an_unavailable_plugin_shows_its_reason() -> None:
    reg = Registry(entry_points())
    info = by_name(reg, T)["rdma"]
    assert (info.available, info.loaded) == (False, True)  # type: ignore[attr-defined]
    assert info.reason.startswith("pyverbs is not installed")  # type: ignore[attr-defined]
    with pytest.raises(PluginError, match="pyverbs is not installed"):
        reg.get(T, "rdma")
    assert "rdma" not in {t.name for t in reg.available(T)}


def test_plugins_listing_is_sorted_and_complete() -> None:
    reg = Registry(entry_points())
    listed = [(p.group, p.name) for p in reg.plugins()]
    assert listed == sorted((e.group, e.name) for e in entry_points())
    assert set(GROUPS) == {g for g, _ in listed}
    assert reg.names(T) == sorted(e.name for e in entry_points() if e.group == T)


@pytest.mark.parametrize("make", [
    lambda eps: Registry(eps, only=["tcp"]),
    lambda eps: Registry(eps, only=[" tcp ", ""]),
    lambda eps: Registry(eps, only="tcp,".split(",")),
])
def test_only_restricts_transports_and_leaves_tiers(make) -> None:
    reg = make(entry_points())
    infos = by_name(reg, T)
    assert [t.name for t in reg.available(T)] == ["tcp"]
    for name in ("shm", "rdma", "hccl", "boom"):
        assert infos[name].loaded is False  # type: ignore[attr-defined]
        assert "disabled by MOONCAKE_PLUGINS" in infos[name].reason  # type: ignore[attr-defined]
        with pytest.raises(PluginError, match="disabled by MOONCAKE_PLUGINS"):
            reg.get(T, name)
    # tiers are a different group: `tcp` names none of them, so they all load
    assert [t.name for t in reg.available(TIERS)] == ["dram"]
    assert by_name(reg, TIERS)["dram"].loaded  # type: ignore[attr-defined]


def test_from_env_reads_mooncake_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = Registry.from_env({"MOONCAKE_PLUGINS": "tcp"})
    assert [t.name for t in reg.available(T)] == ["tcp"]
    assert [t.name for t in reg.available(TIERS)] == ["dram", "ssd"]
    with pytest.raises(PluginError, match="disabled by MOONCAKE_PLUGINS"):
        reg.get(T, "shm")
    for unset in ({"MOONCAKE_PLUGINS": "  "}, {}):
        assert {"tcp", "shm"} <= {t.name for t in Registry.from_env(unset).available(T)}
    monkeypatch.setenv("MOONCAKE_PLUGINS", "shm")
    reg = Registry.from_env()
    assert [t.name for t in reg.available(T)] == ["shm"]
    assert [t.name for t in reg.available(TIERS)] == ["dram", "ssd"]


def test_only_naming_a_tier_restricts_tiers_too() -> None:
    reg = Registry(entry_points(), only=["tcp", "dram"])
    assert [t.name for t in reg.available(T)] == ["tcp"]
    assert [t.name for t in reg.available(TIERS)] == ["dram"]
    assert by_name(reg, TIERS)["ssd"].loaded is False  # type: ignore[attr-defined]


def test_get_unknown_name_lists_the_known_ones() -> None:
    reg = Registry(entry_points())
    with pytest.raises(PluginError, match=r"unknown transport 'udp' \(known: .*shm.*tcp"):
        reg.get(T, "udp")
    with pytest.raises(PluginError, match=r"unknown tier 'nvme' \(known: dram, ssd\)"):
        reg.get(TIERS, "nvme")
    with pytest.raises(PluginError, match=r"known: none"):
        Registry([]).get(T, "tcp")


def test_broken_plugin_is_loaded_once() -> None:
    calls = []

    class Counting:
        name = "count"

        def __init__(self) -> None:
            calls.append(1)

        def available(self) -> tuple[bool, str]:
            return True, ""

    sys.modules[FAKE].Counting = Counting  # type: ignore[attr-defined]
    reg = Registry([ep("count", f"{FAKE}:Counting")])
    assert reg.get(T, "count") is reg.get(T, "count")
    reg.plugins()
    reg.available(T)
    assert len(calls) == 1


def test_engine_uses_the_registry(make_engine) -> None:
    only_tcp = Registry(entry_points(), only=["tcp"])
    eng = make_engine(registry=only_tcp)
    target = make_engine()
    target.allocate(4096)
    assert eng.transport_for(target.name) == "tcp"  # shm is filtered out, so never picked
    with pytest.raises(PluginError, match="disabled by MOONCAKE_PLUGINS"):
        make_engine(registry=only_tcp, transport="shm")
    with pytest.raises(PluginError, match="is not available"):
        make_engine(registry=Registry(entry_points()), transport="hccl")
    with pytest.raises(ConfigError, match="no transport plugin is available"):
        make_engine(registry=Registry([ep("rdma", f"{FAKE}:Unavailable"),
                                       ep("dram", "mooncake_backends.dram:DramTier", TIERS)]))
