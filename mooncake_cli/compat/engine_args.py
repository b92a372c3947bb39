"""Argument checks of the compat transfer engine, as upstream's pybind11 signatures make them:
a value of the wrong type (None for a string, -1 or 2**64 for an address, a float) raises
TypeError ("incompatible function arguments") before the call runs; everything past the types is
the call's own business (an integer code).

    @checked("str", "u64", "u64", "u64")
    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length): ...
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
U64 = 1 << 64


def _u64(v: Any) -> bool:
    return isinstance(v, int) and 0 <= v < U64  # bool is an int for pybind11 too


def _ok(value: Any, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "u64":
        return _u64(value)
    if kind == "i64":
        return isinstance(value, int) and -(U64 >> 1) <= value < U64 >> 1
    if kind == "bytes":
        return isinstance(value, str | bytes)
    if kind == "[u64]":
        return isinstance(value, list | tuple) and all(_u64(v) for v in value)
    if kind == "str?":
        return value is None or isinstance(value, str)
    if kind == "opcode":  # a TransferOpcode member (pybind11's enums take no bare int)
        return isinstance(value, enum.IntEnum) and type(value).__name__ == "TransferOpcode"
    if kind == "notify":
        return value is None or type(value).__name__ == "TransferNotify"
    if kind == "any":
        return True
    raise AssertionError(f"unknown argument kind {kind}")


def checked(*kinds: str) -> Callable[[F], F]:
    """TypeError, as upstream's binding raises it, for an argument not of its kind."""
    def wrap(fn: F) -> F:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                bound = sig.bind(self, *args, **kwargs)
            except TypeError as e:
                raise TypeError(f"{fn.__name__}(): incompatible function arguments ({e})") \
                    from None
            for (name, value), kind in zip(list(bound.arguments.items())[1:], kinds,
                                           strict=False):
                if not _ok(value, kind):
                    raise TypeError(f"{fn.__name__}(): incompatible function arguments: "
                                    f"{name} must be {kind}, not {value!r:.40}")
            return fn(self, *args, **kwargs)
        return call  # type: ignore[return-value]
    return wrap
