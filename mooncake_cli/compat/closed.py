"""What upstream 0.3.13's methods answer on a store that is not set up (never, or closed since),
found by running its wheel: `guard(cls)` makes ours answer the same.

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
from typing import Any

from mooncake_cli.compat.codes import BAD


def _each(code: int) -> Callable[[Any], list[int]]:
    return lambda keys: [code] * len(keys)


def _always(value: Any) -> Callable[[Any], Any]:
    return lambda keys: value() if callable(value) else value


_ONE_CODE = ("upsert", "upsert_batch", "upsert_parts", "put_from", "upsert_from",
             "put_from_with_metadata", "put_tensor", "upsert_tensor", "pub_tensor",
             "upsert_pub_tensor", "put_tensor_with_tp", "pub_tensor_with_tp",
             "save_tensor_to_safetensor")
_A_CODE_EACH = ("batch_upsert_from", "batch_put_tensor", "batch_upsert_tensor", "batch_pub_tensor",
                "batch_upsert_pub_tensor", "batch_put_tensor_with_tp",
                "batch_pub_tensor_with_tp", "batch_get_tensor_into")
_NOTHING = ("batch_put_from_multi_buffers", "batch_put_from_multi_buffer_ranges",
            "batch_get_into_multi_buffer_ranges", "batch_put_session_start",
            "batch_put_session_end", "batch_put_session_revoke", "batch_get_session_start",
            "batch_replica_clear")

# method -> its answer from its first argument (the keys of a batch)
ANSWERS: dict[str, Callable[[Any], Any]] = {
    "get_batch": _always(lambda: [b""]),  # one empty value, whatever the keys
    "batch_get_session_end": _always(-1),
    **{name: _always(BAD) for name in _ONE_CODE},
    **{name: _each(BAD) for name in _A_CODE_EACH},
    **{name: _always(list) for name in _NOTHING},
}


def _guarded(fn: Callable[..., Any], answer: Callable[[Any], Any]) -> Callable[..., Any]:
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._client is not None:
            return fn(self, *args, **kwargs)
        try:
            bound = sig.bind(self, *args, **kwargs)
            return answer(list(bound.arguments.values())[1])
        except (TypeError, IndexError):  # arguments upstream would refuse: ours decide
            return fn(self, *args, **kwargs)
    return call


def guard(cls: type) -> None:
    """Make `cls`'s methods answer as upstream's when the store is not set up."""
    for name, answer in ANSWERS.items():
        setattr(cls, name, _guarded(getattr(cls, name), answer))
