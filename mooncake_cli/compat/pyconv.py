"""The argument conversions of upstream's pybind11 bindings, for attributes set from Python
(ReplicateConfig's fields): what pybind11 accepts, converted as it converts it, and TypeError
for the rest, as upstream's setters raise.

- unsigned 64-bit integers: int, bool, and objects with `__index__` or `__int__` (numpy
  integers, enums); never a float; 0 <= value < 2**64.
- bool: True / False, None (False), and objects with `__bool__` (int, float, numpy values);
  never a str, a list or an enum.
- str: str, and bytes / bytearray as UTF-8 (bytes that are not UTF-8 are taken, as upstream
  takes them; they read back as surrogate escapes where upstream's getter raises).
- list of str: any sequence that is not a str or bytes (list, tuple, a numpy array) whose items
  are each a str as above; the result is a new list.
"""

from __future__ import annotations

import enum
from typing import Any

U64 = 1 << 64


def _refuse(what: str, value: Any) -> TypeError:
    return TypeError(f"incompatible value {value!r} ({type(value).__name__}): expected {what}")


def as_u64(value: Any) -> int:
    if isinstance(value, float) or not (hasattr(value, "__index__") or hasattr(value, "__int__")):
        raise _refuse("int", value)
    try:
        n = value.__index__() if hasattr(value, "__index__") else int(value)
    except (TypeError, ValueError, OverflowError):
        raise _refuse("int", value) from None
    if not 0 <= n < U64:
        raise _refuse("an int in 0..2**64-1", value)
    return int(n)


def as_optional_u64(value: Any) -> int | None:
    return None if value is None else as_u64(value)


def as_bool(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, enum.Enum) or not hasattr(type(value), "__bool__"):
        raise _refuse("bool", value)
    try:
        return bool(value)
    except (TypeError, ValueError):
        raise _refuse("bool", value) from None


def as_str(value: Any) -> str:
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    raise _refuse("str", value)


def as_str_list(value: Any) -> list[str]:
    if isinstance(value, (str, bytes, bytearray, dict)) or not hasattr(type(value), "__getitem__"):
        raise _refuse("list[str]", value)
    try:
        items = list(value)
    except Exception:  # noqa: BLE001 - any failure to iterate is pybind's TypeError
        raise _refuse("list[str]", value) from None
    try:
        return [as_str(x) for x in items]
    except TypeError:
        raise _refuse("list[str]", value) from None


def as_optional_str_list(value: Any) -> list[str] | None:
    return None if value is None else as_str_list(value)


def as_enum(kind: type[enum.Enum]) -> Any:
    """A converter that takes members of `kind` only (not their integer values)."""
    def convert(value: Any) -> Any:
        if not isinstance(value, kind):
            raise _refuse(kind.__name__, value)
        return value
    return convert
