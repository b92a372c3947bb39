"""What upstream 0.3.13's methods answer on a store that is not set up (never, or closed since),
found by running its wheel; a method of ours decorated with one of these answers the same.

Upstream checks for a client in these methods only; its other methods crash the process on a
closed store (put, put_batch, put_parts, batch_put_from, get_buffer, get_into, is_exist,
get_size, remove*, register_buffer, get_replica_desc, the task calls ...): ours answer those
with UNAVAILABLE_IN_CURRENT_STATUS (-1010), -1 for is_exist, and an empty result where the
answer is a list, dict or descriptor list.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from mooncake_cli.compat.codes import BAD
from mooncake_cli.compat.connection import Connection

F = TypeVar("F", bound=Callable[..., Any])


class Store(Protocol):
    _conn: Connection


def answers(answer: Callable[[Any], Any]) -> Callable[[F], F]:
    """A method of the store that, not set up, answers `answer(its first argument)` instead
    (arguments upstream would refuse still reach the method, which decides)."""
    def wrap(fn: F) -> F:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def call(self: Store, *args: Any, **kwargs: Any) -> Any:
            if self._conn.client is not None:
                return fn(self, *args, **kwargs)
            try:
                bound = sig.bind(self, *args, **kwargs)
                return answer(list(bound.arguments.values())[1])
            except (TypeError, IndexError):
                return fn(self, *args, **kwargs)
        return cast(F, call)
    return wrap


code = answers(lambda _: BAD)  # one INVALID_PARAMS
code_each = answers(lambda keys: [BAD] * len(keys))  # INVALID_PARAMS per key
nothing = answers(lambda _: [])  # an empty list
one_empty_value = answers(lambda _: [b""])  # get_batch: one b"", whatever the keys
minus_one = answers(lambda _: -1)
