"""Where our compat store once answered otherwise than upstream 0.3.13's `mooncake.store`, held
to the same assertions on both (the `side` / `make` fixtures of test_compat_upstream_api.py):
ReplicateConfig's typed attributes, every method's answer on a store that is closed (or never
set up), batch_replica_clear against leases and segments, and setup with an SSD offload
directory that already holds a file."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.test_compat_upstream_api import Side, make, side

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
