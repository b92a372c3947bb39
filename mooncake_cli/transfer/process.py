"""Whose process this is: mooncake's own (a `mooncake` command, which says so at start-up with
`own()`), where transports may set process-wide options such as the NIXL agent's UCX globals;
or a host's that loads mooncake as a library (vLLM and LMCache through the plugins, the compat
engine, a script), whose process-wide state is left as the host set it. Transports read it as
`EngineSide.owns_process`."""

from __future__ import annotations

_owned = False


def own() -> None:
    """Declare this process mooncake's own. For a `mooncake` command's start-up only: a
    library never calls it in its caller's process. Idempotent."""
    global _owned
    _owned = True


def owned() -> bool:
    """Whether `own()` was called in this process."""
    return _owned
