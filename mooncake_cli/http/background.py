"""The event loop behind the sync calls of `jsonhttp`: one daemon thread per process running
a loop (uvloop's where installed), on which a sync caller's request runs through the same
`h1pool` connections as an async caller's.

    result = submit(lambda: coroutine())           # blocks this thread until it is done
    for item in iterate(lambda: async_iterator()): ...

Any thread may call these, many at once, except the loop's own thread (that would wait on
itself: RuntimeError). A child process made by fork gets a loop of its own on first use. A
caller interrupted while waiting (KeyboardInterrupt) cancels its request.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid = 0


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def loop() -> asyncio.AbstractEventLoop:
    """This process's client loop, started on first use."""
    global _loop, _thread, _pid
    with _lock:
        if _loop is None or _pid != os.getpid():
            _loop, _pid = _new_loop(), os.getpid()
            _thread = threading.Thread(target=_loop.run_forever, daemon=True,
                                       name="mooncake-http-client")
            _thread.start()
        return _loop


def _run(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    if threading.current_thread() is _thread:
        raise RuntimeError("a sync HTTP call on the client loop's own thread would wait "
                           "on itself: await jsonhttp.AsyncPeer instead")

    future = asyncio.run_coroutine_threadsafe(make(), loop())
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


def submit(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """The result of the coroutine `make()` makes, run on the client loop."""
    return _run(make)


def iterate(make: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
    """The items of the async iterator `make()` makes on the client loop, as they come;
    closing this iterator early closes that one (on the loop)."""
    source = make()  # nothing of it runs before its first step, on the loop

    async def step() -> tuple[bool, T | None]:
        try:
            return True, await source.__anext__()
        except StopAsyncIteration:
            return False, None

    try:
        while True:
            more, item = _run(step)
            if not more:
                return
            yield item  # type: ignore[misc]
    finally:
        close = getattr(source, "aclose", None)
        if close is not None:
            _run(close)
