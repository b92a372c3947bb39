"""Where our compat store once answered otherwise than upstream 0.3.13's `mooncake.store`, held
to the same assertions on both (the `side` / `make` fixtures of test_compat_upstream_api.py):
ReplicateConfig's typed attributes, every method's answer on a store that is closed (or never
set up), batch_replica_clear against leases and segments, and setup with an SSD offload
directory that already holds a file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import free_port, wait_for
from tests.helpers.store_procs import start_master
from tests.integration.test_compat_upstream_api import (
    LEASE_S,
    MiB,
    Side,
    _upstream_skip,
    make,
    side,
)

__all__ = ["make", "side"]  # the fixtures, imported for pytest
pytestmark = pytest.mark.timeout(120)


class IntLike:
    def __int__(self) -> int:
        return 3


class Truthy:
    def __bool__(self) -> bool:
        return True


INTS = ["replica_num", "nof_replica_num", "dfs_replica_num"]
BOOLS = ["with_hard_pin", "prefer_alloc_in_same_node"]
LISTS = ["preferred_segments", "preferred_nof_segments"]
# (value, what an unsigned int field holds after it, or TypeError)
INT_CASES: list[tuple[Any, Any]] = [
    (0, 0), (7, 7), (True, 1), (np.int64(3), 3), (IntLike(), 3), ((1 << 64) - 1, (1 << 64) - 1),
    (-1, TypeError), (1 << 64, TypeError), (1.0, TypeError), (np.float64(2), TypeError),
    ("2", TypeError), (None, TypeError), ([1], TypeError), (Truthy(), TypeError)]
BOOL_CASES: list[tuple[Any, Any]] = [
    (True, True), (0, False), (2, True), (0.5, True), (None, False), (np.bool_(True), True),
    (Truthy(), True), ("yes", TypeError), ("", TypeError), ([1], TypeError), (b"1", TypeError),
    (IntLike(), TypeError)]
LIST_CASES: list[tuple[Any, Any]] = [
    (["a", "b"], ["a", "b"]), (("a",), ["a"]), ([b"a"], ["a"]), ([], []),
    (np.array(["a"]), ["a"]), ("ab", TypeError), (b"ab", TypeError), (None, TypeError),
    ([1], TypeError), (["a", 1], TypeError), ({"a"}, TypeError), (iter(["a"]), TypeError),
    (range(2), TypeError), (1, TypeError)]
STR_CASES: list[tuple[Any, Any]] = [
    ("seg:1", "seg:1"), (b"seg", "seg"), (bytearray(b"s"), "s"), (1, TypeError),
    (None, TypeError), (["a"], TypeError), (True, TypeError)]


def _check(config: Any, field: str, value: Any, want: Any) -> None:
    before = getattr(config, field)
    if isinstance(want, type) and issubclass(want, Exception):
        with pytest.raises(want):
            setattr(config, field, value)
        assert getattr(config, field) == before  # a refused value changes nothing
        return
    setattr(config, field, value)
    got = getattr(config, field)
    assert got == want and type(got) is type(want), (field, value, got)


@pytest.mark.parametrize("field", INTS)
def test_unsigned_fields_take_integers_only(side: Side, field: str) -> None:
    for value, want in INT_CASES:
        _check(side.m.ReplicateConfig(), field, value, want)
    _check(side.m.ReplicateConfig(), field, side.m.SoftPinAction.ENABLE, 1)


def test_the_soft_pin_ttl_is_an_unsigned_integer_or_none(side: Side) -> None:
    for value, want in [*INT_CASES, (None, None)]:
        if value is not None:
            _check(side.m.ReplicateConfig(), "soft_pin_ttl_ms", value, want)
    rc = side.m.ReplicateConfig()
    rc.soft_pin_ttl_ms = 5
    _check(rc, "soft_pin_ttl_ms", None, None)


@pytest.mark.parametrize("field", BOOLS)
def test_bool_fields_take_what_has_a_truth_value_but_not_strings(side: Side, field: str) -> None:
    for value, want in BOOL_CASES:
        _check(side.m.ReplicateConfig(), field, value, want)
    _check(side.m.ReplicateConfig(), field, side.m.SoftPinAction.ENABLE, TypeError)


@pytest.mark.parametrize("field", LISTS)
def test_segment_lists_take_sequences_of_strings(side: Side, field: str) -> None:
    for value, want in LIST_CASES:
        _check(side.m.ReplicateConfig(), field, value, want)


def test_group_ids_are_none_or_a_list_of_strings(side: Side) -> None:
    assert side.m.ReplicateConfig().group_ids is None
    for value, want in LIST_CASES:
        if value is not None:
            _check(side.m.ReplicateConfig(), "group_ids", value, want)
    rc = side.m.ReplicateConfig()
    rc.group_ids = ["g1", "g2"]
    assert str(rc).endswith("data_type: UNKNOWN, group_ids: [g1, g2] }")
    _check(rc, "group_ids", None, None)
    assert str(rc).endswith("data_type: UNKNOWN }")


def test_preferred_segment_is_a_string(side: Side) -> None:
    for value, want in STR_CASES:
        _check(side.m.ReplicateConfig(), "preferred_segment", value, want)
    side.m.ReplicateConfig().preferred_segment = b"\xff"  # not UTF-8: taken all the same
    side.m.ReplicateConfig().preferred_segments = [b"\xff"]


def test_enum_fields_take_their_enum_only(side: Side) -> None:
    m = side.m
    for value in (1, 0, True, None, "ENABLE", m.ObjectDataType.TENSOR):
        _check(m.ReplicateConfig(), "soft_pin_action", value, TypeError)
    _check(m.ReplicateConfig(), "soft_pin_action", m.SoftPinAction.DISABLE,
           m.SoftPinAction.DISABLE)
    assert m.ReplicateConfig().data_type == m.ObjectDataType.UNKNOWN
    for value in (2, None, "TENSOR", m.SoftPinAction.ENABLE):
        _check(m.ReplicateConfig(), "data_type", value, TypeError)
    _check(m.ReplicateConfig(), "data_type", m.ObjectDataType.TENSOR, m.ObjectDataType.TENSOR)
    assert [(k, int(v)) for k, v in m.ObjectDataType.__members__.items()] == [
        ("UNKNOWN", 0), ("KVCACHE", 1), ("TENSOR", 2), ("WEIGHT", 3), ("SAMPLE", 4),
        ("ACTIVATION", 5), ("GRADIENT", 6), ("OPTIMIZER_STATE", 7), ("METADATA", 8),
        ("GENERAL", 9)]


def test_no_other_attribute_can_be_set_and_none_deleted(side: Side) -> None:
    rc = side.m.ReplicateConfig()
    with pytest.raises(AttributeError):
        rc.replica_number = 2  # a typo is an error, not a silent no-op
    with pytest.raises(AttributeError):
        del rc.replica_num
    with pytest.raises(TypeError):
        side.m.ReplicateConfig(replica_num=2)
    assert str(rc) == (
        "ReplicateConfig: { replica_num: 1, nof_replica_num: 0, dfs_replica_num: 0, "
        "soft_pin_action: PRESERVE, soft_pin_ttl_ms: default, with_hard_pin: 0, "
        "preferred_segments: [], preferred_nof_segments: [], prefer_alloc_in_same_node: 0, "
        "data_type: UNKNOWN }")


def _closed_answers(m: Any, s: Any, ptr: int) -> dict[str, tuple[Any, Any]]:
    """Each method upstream answers on a store that is not set up: (the call's answer, the
    answer expected). Upstream's other methods crash the process there, so none is called."""
    torch = pytest.importorskip("torch")
    t, keys, ptrs, sizes, n = torch.ones(4), ["a", "b", "c"], [ptr] * 3, [64] * 3, [-600] * 3
    return {
        "get": (s.get("a"), b""), "get_batch": (s.get_batch(keys), [b""]),
        "get_batch []": (s.get_batch([]), [b""]),
        "upsert": (s.upsert("a", b"v"), -600), "upsert_batch": (s.upsert_batch(keys, [b"v"] * 3),
                                                                -600),
        "upsert_parts": (s.upsert_parts("a", b"v"), -600),
        "put_from": (s.put_from("a", ptr, 8), -600), "upsert_from": (s.upsert_from("a", ptr, 8),
                                                                    -600),
        "batch_upsert_from": (s.batch_upsert_from(keys, ptrs, sizes), n),
        "put_from_with_metadata": (s.put_from_with_metadata("a", ptr, ptr, 8, 8), -600),
        "batch_put_from_multi_buffers": (s.batch_put_from_multi_buffers(
            keys, [[ptr]] * 3, [[8]] * 3), []),
        "batch_put_from_multi_buffer_ranges": (s.batch_put_from_multi_buffer_ranges(
            keys, [[ptr]] * 3, [[8]] * 3, [[0]] * 3), []),
        "batch_get_into_multi_buffer_ranges": (s.batch_get_into_multi_buffer_ranges(
            keys, [[ptr]] * 3, [[8]] * 3, [[0]] * 3), []),
        "batch_put_session_start": (s.batch_put_session_start(keys, [8] * 3), []),
        "batch_put_session_end": (s.batch_put_session_end(keys), []),
        "batch_put_session_revoke": (s.batch_put_session_revoke(keys), []),
        "batch_get_session_start": (s.batch_get_session_start(keys), []),
        "batch_get_session_end": (s.batch_get_session_end(keys), -1),
        "batch_replica_clear": (s.batch_replica_clear(keys, ""), []),
        "put_tensor": (s.put_tensor("a", t), -600),
        "upsert_tensor": (s.upsert_tensor("a", t), -600),
        "pub_tensor": (s.pub_tensor("a", t), -600),
        "upsert_pub_tensor": (s.upsert_pub_tensor("a", t), -600),
        "batch_put_tensor": (s.batch_put_tensor(keys, [t] * 3), n),
        "batch_upsert_tensor": (s.batch_upsert_tensor(keys, [t] * 3), n),
        "batch_pub_tensor": (s.batch_pub_tensor(keys, [t] * 3), n),
        "batch_upsert_pub_tensor": (s.batch_upsert_pub_tensor(keys, [t] * 3), n),
        "put_tensor_with_tp": (s.put_tensor_with_tp("a", t, 0, 2, 0), -600),
        "batch_put_tensor_with_tp": (s.batch_put_tensor_with_tp(keys, [t] * 3, 0, 2, 0), n),
        "pub_tensor_with_tp": (s.pub_tensor_with_tp("a", t, m.ReplicateConfig(), 0, 2, 0), -600),
        "batch_pub_tensor_with_tp": (s.batch_pub_tensor_with_tp(
            keys, [t] * 3, m.ReplicateConfig(), 0, 2, 0), n),
        "put_tensor_from": (s.put_tensor_from("a", ptr, 64), -600),
        "batch_put_tensor_from": (s.batch_put_tensor_from(keys, ptrs, sizes), n),
        "batch_get_tensor_into": (s.batch_get_tensor_into(keys, ptrs, sizes), n),
        "get_tensor_into": (s.get_tensor_into("a", ptr, 64), None),
        "get_tensor": (s.get_tensor("a"), None),
        "batch_get_tensor": (s.batch_get_tensor(keys), [None] * 3),
        "get_tensor_with_tp": (s.get_tensor_with_tp("a", 0, 2, 0), None),
        "batch_get_tensor_with_tp": (s.batch_get_tensor_with_tp(keys, 0, 2), [None] * 3),
        "save_tensor_to_safetensor": (s.save_tensor_to_safetensor("a", "/nonexistent/x"), -600),
        "get_offload_rpc_read_count": (s.get_offload_rpc_read_count(), 0),
        "health_check": (s.health_check(), 1), "close": (s.close(), 0),
    }


@pytest.mark.parametrize("state", ["closed", "never set up"])
def test_a_store_not_set_up_answers_as_upstream(side: Side, state: str) -> None:
    s = side.m.MooncakeDistributedStore()  # not in side.stores: its teardown would call it
    buf = np.zeros(64, dtype=np.uint8)
    if state == "closed":
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "",
                       side.master) == 0
        assert s.put("a", b"kept") == 0 and s.close() == 0
    answers = _closed_answers(side.m, s, buf.ctypes.data)
    assert {k: got for k, (got, _) in answers.items()} == \
        {k: want for k, (_, want) in answers.items()}


def test_batch_replica_clear_waits_for_the_lease_and_keeps_to_its_segment(
        side: Side, make: Callable[..., Any]) -> None:
    a, b = make(), make()
    assert a.put("k", b"v" * 100) == 0 and a.get("k") == b"v" * 100  # the get leases it
    assert a.batch_replica_clear(["k"], "") == []
    assert a.is_exist("k") == 1
    wait_for(lambda: a.batch_replica_clear(["k"], "") == ["k"], 10 * LEASE_S, what="the lease")
    assert a.is_exist("k") == 0 and a.batch_replica_clear(["k", "missing", ""], "") == []
    two = side.m.ReplicateConfig()
    two.replica_num = 2
    assert a.put("two", b"w" * 100, two) == 0
    assert a.batch_replica_clear(["two"], "no-such-segment:1") == []
    assert a.batch_replica_clear(["two"], b.get_hostname()) == ["two"]
    assert a.batch_replica_clear(["two"], b.get_hostname()) == []  # none left there
    assert a.get("two") == b"w" * 100  # from the replica on a: leased again
    assert a.batch_replica_clear(["two"], a.get_hostname()) == []
    wait_for(lambda: a.batch_replica_clear(["two"], a.get_hostname()) == ["two"], 10 * LEASE_S,
             what="the lease")
    assert a.is_exist("two") == 0  # its last replica went: the object is gone


@pytest.fixture(params=["ours", "upstream"])
def offload_master(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str]]:
    """A master that takes SSD offload: ours as it is, upstream's with --enable_offload."""
    if request.param == "ours":
        from mooncake_cli.compat import store as ours

        m = start_master(free_port())
        yield ours, str(m.ready["address"])
        m.stop()
        return
    why = _upstream_skip()
    if why:
        pytest.skip(why)
    import mooncake.store as theirs

    from mooncake_cli.bench.store_upstream import UpstreamMaster

    um = UpstreamMaster("--enable_offload=true")
    yield theirs, um.address
    um.close()


@pytest.mark.parametrize("size", [1000, 512 * MiB])
def test_setup_takes_an_offload_directory_that_holds_a_file_of_another_size(
        offload_master: tuple[Any, str], tmp_path: Path, size: int) -> None:
    """16 MiB of segment (upstream's least with offload): a data file of 1000 bytes, and of
    more than the SSD segment would be; neither is shrunk, and the store works."""
    m, master = offload_master
    with open(tmp_path / "data.bin", "wb") as f:
        f.truncate(size)
    (tmp_path / "other").write_bytes(b"x" * 10)
    s = m.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", master, None,
                   True, str(tmp_path)) == 0
    try:
        assert s.put("k", b"v" * 1000) == 0 and s.get("k") == b"v" * 1000
        assert (tmp_path / "data.bin").stat().st_size >= size
        assert (tmp_path / "other").read_bytes() == b"x" * 10
    finally:
        s.remove_all(True)
        s.close()
