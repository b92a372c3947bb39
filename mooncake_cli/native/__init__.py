"""Compiled helpers, each optional: built at install when a C compiler is there (setup.py),
with a fallback in Python otherwise.

`stream_copy(dest, src)` copies the bytes of `src` into the start of `dest` (ValueError when
they do not fit, TypeError for a read-only `dest`): non-temporal stores on x86-64 (see
streamcopy.c), without the GIL from 64 KiB. `STREAMED` says whether the compiled one is in use;
without it, `memmove_copy` (glibc's memmove through ctypes, without the GIL) stands in."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np


def address(view: Any) -> int:
    """Where the bytes of buffer `view` start (read-only views included)."""
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if len(view) else 0


def memmove_copy(dest: Any, src: Any, /) -> None:
    """`stream_copy` by glibc's memmove (ordinary stores), without the GIL."""
    n = len(src)
    if n > len(dest):
        raise ValueError(f"{n} bytes do not fit a buffer of {len(dest)}")
    if memoryview(dest).readonly:
        raise TypeError("the destination of a copy must be writable")
    if n:
        ctypes.memmove(address(dest), address(src), n)


try:
    from mooncake_cli.native.streamcopy import stream_copy
    STREAMED = True
except ImportError:  # not built: no C compiler at install
    stream_copy = memmove_copy
    STREAMED = False
