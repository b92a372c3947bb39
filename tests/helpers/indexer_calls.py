"""Calls of the KV indexer API's tests (tests/test_conductor_indexer*.py): a conductor with a
secret, publishers made and closed, the routes called, answers awaited (polled, never slept)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import xxhash

from mooncake_cli.conductor.service import ConductorService
from mooncake_cli.config.conductor import ConductorConfig
from mooncake_cli.http import jsonhttp
from mooncake_cli.http.auth import Signer
from tests.conftest import free_port, wait_for
from tests.helpers.kv_publisher import Publisher

SECRET = "indexer-test-secret"
AUTH = Signer(SECRET)


def spec_hashes(tokens: list[int], bs: int) -> list[int]:
    """The spec's rolling XXH3-64 sequence hashes (seed 1337), written out here on purpose."""
    out: list[int] = []
    for i in range(len(tokens) // bs):
        local = xxhash.xxh3_64_intdigest(struct.pack(f"<{bs}I", *tokens[i * bs:(i + 1) * bs]),
                                         1337)
        out.append(local if not out else
                   xxhash.xxh3_64_intdigest(struct.pack("<QQ", out[-1], local), 1337))
    return out


def vh(tag: str, i: int) -> str:
    """A vLLM block hash as vLLM 0.32 sends it by default: 32 bytes (SHA-256 sized)."""
    return "b:" + hashlib.sha256(f"{tag}{i}".encode()).hexdigest()


def running_conductor() -> Iterator[ConductorService]:
    svc = ConductorService(ConductorConfig(port=0, model="demo"), secret=SECRET).start()
    yield svc
    svc.close()


def publisher_factory() -> Iterator[Callable[..., Publisher]]:
    made: list[Publisher] = []

    def make(replay: bool = True, ports: tuple[int, int] | None = None) -> Publisher:
        pub_port, replay_port = ports or (free_port(), free_port())
        made.append(Publisher(pub_port, replay_port if replay else None))
        return made[-1]

    yield make
    for p in made:
        p.close()


def register(svc: ConductorService, pub: Publisher, instance: str, block_size: int = 16,
             dp_rank: int = 0, **extra: Any) -> None:
    body = {"endpoint": pub.pub, "replay_endpoint": pub.replay, "type": "vLLM",
            "modelname": "m", "instance_id": instance, "block_size": block_size,
            "dp_rank": dp_rank, **extra}
    ans = jsonhttp.call(svc.url + "/register", body, auth=AUTH)
    assert (ans.status, ans.body) == (200, {"status": "registered successfully",
                                            "instance_id": instance})


def query(svc: ConductorService, path: str = "/query", **body: Any) -> Any:
    ans = jsonhttp.call(svc.url + path, {"model": "m", "block_size": 16, **body})
    assert ans.status == 200, ans.body
    return ans.body


def settles(fetch: Callable[[], Any], expected: Any, timeout: float = 20.0) -> None:
    """Poll `fetch` until it answers `expected` (the last answer shown when it never does)."""
    last: list[Any] = []

    def same() -> bool:
        last[:] = [fetch()]
        return bool(last[0] == expected)

    try:
        wait_for(same, timeout, 0.05, f"the answer {expected}")
    except pytest.fail.Exception:
        assert last[0] == expected
        raise


def m(longest: int, gpu: int, cpu: int, disk: int, dp: dict[str, int]) -> dict[str, Any]:
    return {"longest_matched": longest, "GPU": gpu, "CPU": cpu, "DISK": disk, "DP": dp}


def streams(svc: ConductorService) -> dict[str, dict[str, Any]]:
    ans = jsonhttp.call(svc.url + "/indexer/streams", auth=AUTH)
    assert ans.status == 200
    return {f"{s['instance_id']}|{s['dp_rank']}": s for s in ans.body["streams"]}
