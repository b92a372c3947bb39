"""Store error codes and the exceptions that carry them.

The numbers mirror upstream Mooncake's `StoreCode` (mooncake-store/include/types.h), so a code
that crosses the wire or reaches the compat API means the same thing as upstream's. The values
are written from memory of upstream's header (the wheel ships no header to check them against);
-200, -704 and -706 are the ones the issue quotes.

    code   name                           raised here when
    0      OK                             -
    -1     INTERNAL_ERROR                 an invariant broke (a bug)
    -101   SEGMENT_NOT_FOUND              unmounting / re-registering on a segment not mounted
    -102   SEGMENT_ALREADY_EXISTS         mounting a range that overlaps another mount
    -103   CLIENT_NOT_FOUND               -
    -200   NO_AVAILABLE_HANDLE            too few segments, or no space even after eviction
    -400   INVALID_KEY                    empty, non-str, not UTF-8, or over MAX_KEY_BYTES
    -600   INVALID_PARAMS                 sizes <= 0 or over the limit, bad config or records
    -700   INVALID_WRITE                  revoking a put that already ended
    -702   INVALID_REPLICA                a re-registered replica overlaps or disagrees
    -703   REPLICA_IS_NOT_READY           get / remove of an object whose put has not ended
    -704   OBJECT_NOT_FOUND               no such key (or its put timed out)
    -705   OBJECT_ALREADY_EXISTS          put_start of a key that exists or is being put
    -706   OBJECT_HAS_LEASE               remove of a leased object without force
    -10    BUFFER_OVERFLOW                (client) get_into a buffer smaller than the object
    -701   INVALID_READ                   (client) every replica read failed its checksum
    -800   TRANSFER_FAIL                  (client) no replica could be written or read
    -900   RPC_FAIL                       (client) the master is silent, or a MAC is bad

Other upstream codes kept for the wire: -100 SHARD_INDEX_OUT_OF_RANGE, -300 INVALID_VERSION,
-500 WRITE_FAIL, -707 LEASE_EXPIRED, -1000..-1003 ETCD_*, -1010/-1011
UNAVAILABLE_IN_CURRENT_STATUS/MODE, -1100..-1106 FILE_*.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from mooncake_cli.interfaces import MooncakeError


class StoreCode(enum.IntEnum):
    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SHARD_INDEX_OUT_OF_RANGE = -100
    SEGMENT_NOT_FOUND = -101
    SEGMENT_ALREADY_EXISTS = -102
    CLIENT_NOT_FOUND = -103
    NO_AVAILABLE_HANDLE = -200
    INVALID_VERSION = -300
    INVALID_KEY = -400
    WRITE_FAIL = -500
    INVALID_PARAMS = -600
    INVALID_WRITE = -700
    INVALID_READ = -701
    INVALID_REPLICA = -702
    REPLICA_IS_NOT_READY = -703
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    LEASE_EXPIRED = -707
    TRANSFER_FAIL = -800
    RPC_FAIL = -900
    ETCD_OPERATION_ERROR = -1000
    ETCD_KEY_NOT_EXIST = -1001
    ETCD_TRANSACTION_FAIL = -1002
    ETCD_CTX_CANCELLED = -1003
    UNAVAILABLE_IN_CURRENT_STATUS = -1010
    UNAVAILABLE_IN_CURRENT_MODE = -1011
    FILE_NOT_FOUND = -1100
    FILE_OPEN_FAIL = -1101
    FILE_READ_FAIL = -1102
    FILE_WRITE_FAIL = -1103
    FILE_INVALID_BUFFER = -1104
    FILE_LOCK_FAIL = -1105
    FILE_INVALID_HANDLE = -1106


class StoreError(MooncakeError):
    """A store operation was refused; `code` is the upstream-compatible negative StoreCode."""

    code: StoreCode = StoreCode.INTERNAL_ERROR

    def __init__(self, message: str = "", code: StoreCode | int | None = None) -> None:
        if code is not None:
            self.code = StoreCode(code)
        super().__init__(message or self.code.name.lower().replace("_", " "))


class SegmentNotFound(StoreError):
    code = StoreCode.SEGMENT_NOT_FOUND


class SegmentAlreadyExists(StoreError):
    code = StoreCode.SEGMENT_ALREADY_EXISTS


class NoAvailableHandle(StoreError):
    code = StoreCode.NO_AVAILABLE_HANDLE


class InvalidKey(StoreError):
    code = StoreCode.INVALID_KEY


class InvalidParams(StoreError):
    code = StoreCode.INVALID_PARAMS


class InvalidWrite(StoreError):
    code = StoreCode.INVALID_WRITE


class InvalidReplica(StoreError):
    code = StoreCode.INVALID_REPLICA


class ReplicaNotReady(StoreError):
    code = StoreCode.REPLICA_IS_NOT_READY


class ObjectNotFound(StoreError):
    code = StoreCode.OBJECT_NOT_FOUND


class ObjectAlreadyExists(StoreError):
    code = StoreCode.OBJECT_ALREADY_EXISTS


class ObjectHasLease(StoreError):
    code = StoreCode.OBJECT_HAS_LEASE


class BufferOverflow(StoreError):
    """get_into was given a buffer smaller than the object."""

    code = StoreCode.BUFFER_OVERFLOW


class ChecksumMismatch(StoreError):
    """Every replica read failed its checksum (a client never returns such bytes)."""

    code = StoreCode.INVALID_READ


class TransferFailed(StoreError):
    code = StoreCode.TRANSFER_FAIL


class RpcFailed(StoreError):
    """The master did not answer in time, or answered something unreadable."""

    code = StoreCode.RPC_FAIL


_BY_CODE: Mapping[StoreCode, type[StoreError]] = MappingProxyType({
    cls.code: cls for cls in (SegmentNotFound, SegmentAlreadyExists, NoAvailableHandle,
                              InvalidKey, InvalidParams, InvalidWrite, InvalidReplica,
                              ReplicaNotReady, ObjectNotFound, ObjectAlreadyExists,
                              ObjectHasLease)
})


def error_from_code(code: int, message: str = "") -> StoreError:
    """The exception for a code received over the wire (its subclass when there is one; the
    client-side ones above, BufferOverflow and after, never cross the wire)."""
    try:
        ec = StoreCode(code)
    except ValueError:
        return StoreError(message or f"unknown store error {code}", StoreCode.INTERNAL_ERROR)
    cls = _BY_CODE.get(ec)
    return cls(message) if cls is not None else StoreError(message, ec)
