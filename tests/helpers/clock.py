"""The one fake clock of the tests: a callable that reads `t`, moved only by the test."""

from __future__ import annotations


class FakeClock:
    """Pass as `now=`; it reads `t` (the start given) until the test sets or advances it."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt
