"""Requests the master must refuse: bad keys, sizes and configs get a StoreError with the
upstream code and change nothing; codes received over the wire map back to the same errors."""

from __future__ import annotations

import dataclasses

import pytest

from mooncake_cli.store import (
    MAX_KEY_BYTES,
    MAX_OBJECT_SIZE,
    Mount,
    Replica,
    ReplicaStatus,
    ReplicateConfig,
    StoreCode,
    StoreError,
    StoreMaster,
)
from mooncake_cli.store.errors import InvalidKey, InvalidParams, ObjectNotFound, error_from_code

MiB = 1 << 20


@pytest.fixture
def master() -> StoreMaster:
    m = StoreMaster()
    for name in ("a", "b"):
        m.mount_segment(Mount(name, f"client-{name}", name.upper(), 0, MiB))
    return m


def put(m: StoreMaster, key: str, size: int = 1000) -> None:
    m.put_start(key, size)
    m.put_end(key)


def snapshot(m: StoreMaster) -> object:
    return m.list(), m.segment_usage(), dataclasses.replace(m.stats(), clock=0.0)


BAD_KEYS = ["", "x" * (MAX_KEY_BYTES + 1), "é" * (MAX_KEY_BYTES // 2 + 1), "\ud800", 7, None,
            b"bytes"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_refused_and_change_nothing(master: StoreMaster, key: object) -> None:
    put(master, "good")
    before = snapshot(master)
    for call in (lambda: master.put_start(key, 10), lambda: master.put_end(key),  # type: ignore
                 lambda: master.get_replica_list(key), lambda: master.exists(key),  # type: ignore
                 lambda: master.remove(key, force=True)):  # type: ignore[arg-type]
        with pytest.raises(InvalidKey) as e:
            call()
        assert e.value.code == StoreCode.INVALID_KEY
    assert snapshot(master) == before


@pytest.mark.parametrize("size", [0, -1, -MiB, MAX_OBJECT_SIZE + 1, 1 << 80, True, 1.5, "10"])
def test_bad_sizes_are_refused_and_change_nothing(master: StoreMaster, size: object) -> None:
    before = snapshot(master)
    with pytest.raises(InvalidParams) as e:
        master.put_start("k", size)  # type: ignore[arg-type]
    assert e.value.code == -600
    assert snapshot(master) == before


@pytest.mark.parametrize("cfg", [dict(replica_num=0), dict(replica_num=17),
                                 dict(replica_num="2"), dict(soft_pin="yes")])
def test_bad_configs_are_refused(cfg: dict[str, object]) -> None:
    with pytest.raises(InvalidParams):
        ReplicateConfig(**cfg)  # type: ignore[arg-type]


def test_bad_records_and_arguments(master: StoreMaster) -> None:
    before = snapshot(master)
    with pytest.raises(InvalidParams):
        Replica("a", 0, 10, status="torn")  # type: ignore[arg-type]
    with pytest.raises(InvalidParams):
        master.put_start("k", 10, tier="tape")  # type: ignore[arg-type]
    with pytest.raises(InvalidParams):
        master.put_start("k", 10, {"replica_num": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidParams):
        master.unmount_segment(["a"])  # type: ignore[arg-type]
    with pytest.raises(InvalidParams):
        master.put_end("k", checksum=123)  # type: ignore[arg-type]
    assert snapshot(master) == before
    assert Replica("a", 0, 10, status="complete").status is ReplicaStatus.COMPLETE  # type: ignore


def test_longest_key_is_accepted(master: StoreMaster) -> None:
    key = "é" * (MAX_KEY_BYTES // 2)
    put(master, key)
    assert master.exists(key)


def test_error_codes_round_trip() -> None:
    assert isinstance(error_from_code(-704, "gone"), ObjectNotFound)
    assert error_from_code(-706).code == StoreCode.OBJECT_HAS_LEASE
    e = error_from_code(-800, "wire")
    assert type(e) is StoreError and e.code == StoreCode.TRANSFER_FAIL and str(e) == "wire"
    assert error_from_code(-123456).code == StoreCode.INTERNAL_ERROR
