"""The compat API's return codes: upstream's StoreCode values, and its conventions."""

from __future__ import annotations

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.store.errors import StoreCode, StoreError

NOT_READY, BAD = int(StoreCode.UNAVAILABLE_IN_CURRENT_STATUS), int(StoreCode.INVALID_PARAMS)
EXISTS = int(StoreCode.OBJECT_ALREADY_EXISTS)


def code_of(e: BaseException) -> int:
    if isinstance(e, StoreError):
        return BAD if e.code == StoreCode.BUFFER_OVERFLOW else int(e.code)  # upstream: -600
    if isinstance(e, (ConfigError, ValueError, TypeError, OverflowError)):
        return BAD
    return int(StoreCode.INTERNAL_ERROR)


def put_code(e: StoreError | None) -> int:
    """A put's code: OBJECT_ALREADY_EXISTS is a success (upstream's client says 0)."""
    return 0 if e is None or e.code == EXISTS else code_of(e)
