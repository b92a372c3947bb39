"""Workers registering in a real etcd, a conductor finding them there (`--registry`)."""

from __future__ import annotations

import json

import etcd3gw
import pytest

from mooncake_cli.api.registration import PREFIX, parse
from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.config.worker import WorkerConfig
from mooncake_cli.http import jsonhttp
from mooncake_cli.interfaces import ConfigError
from mooncake_cli.worker.decode import DecodeWorker
from mooncake_cli.worker.prefill import PrefillWorker
from tests.conftest import wait_for


def names(url: str) -> dict[str, bool]:
    listed = jsonhttp.call(url + "/v1/instances").body["instances"]
    return {i["name"]: i["alive"] for i in listed}


def test_workers_found_through_etcd(etcd: str) -> None:
    registry = etcd + "/unit"
    cfg = WorkerConfig(conductor=registry, heartbeat=0.3, kv_blocks=64)
    svc = ConductorService(ConductorConfig(port=0, registry=registry,
                                           poll_interval=0.3)).start()
    p = PrefillWorker(WorkerConfig(**{**cfg.__dict__, "role": "prefill", "name": "p"})).start()
    d = DecodeWorker(WorkerConfig(**{**cfg.__dict__, "role": "decode", "name": "d"})).start()
    try:
        wait_for(lambda: names(svc.url) == {"p": True, "d": True}, timeout=15)
        host, port = parse(etcd)[0][0]
        raw = etcd3gw.client(host=host, port=port).get(PREFIX + "unit/p")
        assert json.loads(raw[0])["url"] == p.url  # the worker's own registration body
        answer = jsonhttp.call(svc.url + "/v1/completions",
                               {"model": "demo", "prompt": "etcd", "max_tokens": 3,
                                "temperature": 0, "ignore_eos": True}, timeout=60)
        assert answer.status == 200 and answer.body["usage"]["completion_tokens"] == 3
        p.close()  # deregisters: the key goes, and the conductor drops the instance
        wait_for(lambda: names(svc.url) == {"d": True}, timeout=15)
    finally:
        p.close()
        d.close()
        svc.close()


def test_bad_registry_urls() -> None:
    for bad in ("etcd://", "etcd://host", "http://x:1", "etcd://h:1/a/b"):
        with pytest.raises(ConfigError):
            parse(bad)
    with pytest.raises(ConfigError, match="etcd://"):
        WorkerConfig(conductor="zk://h:1")
    assert parse("etcd://a:1,b:2") == ([("a", 1), ("b", 2)], "default")
