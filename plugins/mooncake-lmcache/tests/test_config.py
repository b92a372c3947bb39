"""The plugin's configuration: what LMCache's config must say, what is refused and how, and a
store that is not there when the engine starts."""

from __future__ import annotations

import socket
import time

import pytest
import torch
from mooncake_cli.interfaces import ConfigError

from mooncake_lmcache import harness as h
from mooncake_lmcache.connector import MooncakeStoreConnector
from mooncake_lmcache.settings import PluginSettings, StoreUnreachable, load

LAYOUT = h.KVLayout(num_layers=2, num_heads=2, head_size=64)
NS = "remote_storage_plugin.mooncake."


def ours(**settings: object) -> dict[str, object]:
    return {**h.mooncake_config("127.0.0.1:1")["extra_config"],
            **{NS + k: v for k, v in settings.items()}}


def test_settings_are_read_from_the_plugins_namespace() -> None:
    s = load(ours(segment_size="64MiB", replica_num="2", prefer_local="false", timeout=0.5,
                  master="etcd://10.0.0.1:2379/prod"), ["mooncake"])
    assert s == PluginSettings(master="etcd://10.0.0.1:2379/prod", segment_size=64 << 20,
                               replica_num=2, prefer_local=False, timeout=0.5)


@pytest.mark.parametrize(("extra", "plugins", "message"), [
    (ours(replica_nm=2), ["mooncake"], "unknown setting 'remote_storage_plugin.mooncake."
                                       "replica_nm'"),
    (ours(replica_num=0), ["mooncake"], "replica_num must be in 1..16"),
    (ours(replica_num="two"), ["mooncake"], "replica_num: 'two' is not a valid int"),
    (ours(segment_size="lots"), ["mooncake"], "bad size 'lots'"),
    (ours(prefer_local="maybe"), ["mooncake"], "prefer_local: 'maybe' is not a valid bool"),
    (ours(master="nowhere"), ["mooncake"], "master must be HOST:PORT"),
    (ours(), [], "no entry of remote_storage_plugins"),
])
def test_bad_settings_are_refused_by_name(extra: dict[str, object], plugins: list[str],
                                          message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load(extra, plugins)


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def test_an_unreachable_store_is_a_clear_error_and_the_engine_runs_without_it() -> None:
    master = f"127.0.0.1:{dead_port()}"
    engine = h.build("alone", LAYOUT, h.mooncake_config(master, timeout=0.5))
    try:
        manager = engine.storage_manager
        assert manager is not None
        cpu = manager.local_cpu_backend
        with pytest.raises(StoreUnreachable, match=f"master at {master} did not answer within "
                                                   f"0.5 s"):
            MooncakeStoreConnector(manager.loop, cpu, engine.config)
        toks, kv = h.tokens(300, 1), LAYOUT.random(300, 1)
        began = time.monotonic()
        engine.store(toks, kvcaches=kv)  # the local CPU tier still works
        out = LAYOUT.empty(300)
        assert bool(engine.retrieve(toks, kvcaches=out).all())
        assert torch.equal(out.view(torch.int16), kv.view(torch.int16))
        assert time.monotonic() - began < 5
    finally:
        h.destroy(engine)


@pytest.mark.parametrize(("more", "message"), [
    ({"use_layerwise": True}, "use_layerwise: false"),
    ({"remote_serde": "cachegen"}, "remote_serde: naive"),
])
def test_layouts_the_connector_cannot_store_are_refused(more: dict[str, object],
                                                       message: str) -> None:
    engine = h.build("plain", LAYOUT, {})
    try:
        manager = engine.storage_manager
        assert manager is not None
        config = engine.config.from_dict({**h.mooncake_config("127.0.0.1:1"), **more,
                                          "chunk_size": LAYOUT.chunk_size})
        with pytest.raises(ConfigError, match=message):
            MooncakeStoreConnector(manager.loop, manager.local_cpu_backend, config)
    finally:
        h.destroy(engine)
