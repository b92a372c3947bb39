"""The KV indexer API's guards and bounds on a running conductor: /register and /unregister
need the cluster secret, bad bodies are 400s naming their field (413 when too large), a
registration repeated is one stream, /unregister answers what it removed."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.http import jsonhttp
from mooncake_cli.http.auth import Signer
from tests.helpers.indexer_calls import (
    AUTH,
    publisher_factory,
    query,
    register,
    running_conductor,
    streams,
)
from tests.helpers.kv_publisher import Publisher


@pytest.fixture
def conductor() -> Iterator[ConductorService]:
    yield from running_conductor()


@pytest.fixture
def publishers() -> Iterator[Callable[..., Publisher]]:
    yield from publisher_factory()


def test_register_needs_the_secret_and_bad_bodies_are_4xx(conductor, publishers) -> None:
    url = conductor.url
    reg = {"endpoint": "tcp://127.0.0.1:1", "type": "vLLM", "modelname": "m",
           "instance_id": "z", "block_size": 16, "dp_rank": 0}
    assert jsonhttp.call(url + "/register", reg).status == 401
    assert jsonhttp.call(url + "/unregister", reg).status == 401
    assert jsonhttp.call(url + "/register", reg, auth=Signer("wrong")).status == 401
    assert jsonhttp.call(url + "/indexer/streams").status == 401
    for change, param in (({"endpoint": "tcp://*:5557"}, "endpoint"),
                          ({"endpoint": "inproc://x"}, "endpoint"),
                          ({"replay_endpoint": "http://h:1"}, "replay_endpoint"),
                          ({"type": "TRT"}, "type"),
                          ({"block_size": 0}, "block_size"), ({"dp_rank": -1}, "dp_rank"),
                          ({"instance_id": None}, "instance_id"), ({"extra": 1}, "extra"),
                          ({"modelname": ""}, "modelname")):
        ans = jsonhttp.call(url + "/register", {**reg, **change}, auth=AUTH)
        assert (ans.status, ans.body["error"]["param"]) == (400, param), (change, ans.body)
    no_name = {k: v for k, v in reg.items() if k != "instance_id"}
    assert jsonhttp.call(url + "/register", no_name, auth=AUTH).status == 400
    q = {"model": "m", "block_size": 16}
    for path, body, param in (("/query", {**q, "token_ids": [-1]}, "token_ids"),
                              ("/query", {**q, "token_ids": [1 << 32]}, "token_ids"),
                              ("/query", {**q, "token_ids": "12"}, "token_ids"),
                              ("/query", {"block_size": 16, "token_ids": []}, "model"),
                              ("/query_by_hash", q, "seq_hashes"),
                              ("/query_by_hash", {**q, "seq_hashes": [1 << 64]}, "seq_hashes"),
                              ("/query_by_hash", {**q, "block_hash": [1], "x": 2}, "x")):
        ans = jsonhttp.call(url + path, body)
        assert (ans.status, ans.body["error"]["param"]) == (400, param), (path, body, ans.body)
    assert jsonhttp.call(url + "/query", {**q, "token_ids": [0] * ((1 << 20) + 1)}).status == 400
    assert jsonhttp.call(url + "/query", {**q, "token_ids": [0] * (5 << 20)}).status == 413
    assert jsonhttp.call(url + "/query", None, method="POST").status == 400
    assert query(conductor, "/query_by_hash", seq_hashes=[-1]) == {"default": {}}
    pub = publishers()
    register(conductor, pub, "z")
    register(conductor, pub, "z")  # the same again: still one stream
    assert list(streams(conductor)) == ["z|0"]
    gone = {"type": "vLLM", "modelname": "m", "instance_id": "z", "block_size": 16,
            "dp_rank": 0}
    assert jsonhttp.call(url + "/unregister", {**gone, "block_size": 32},
                         auth=AUTH).body["removed_instances"] == []
    assert jsonhttp.call(url + "/unregister", gone, auth=AUTH).body["removed_instances"] == \
        ["z|default|0"]
    assert jsonhttp.call(url + "/unregister", gone, auth=AUTH).body["removed_instances"] == []
