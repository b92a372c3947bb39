"""Transfer requests, their per-request status, and batches that can be polled or waited on."""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from mooncake_cli.transfer.segment import Region


class Op(str, enum.Enum):
    READ = "read"  # peer -> local region
    WRITE = "write"  # local region -> peer


class State(str, enum.Enum):
    PENDING = "pending"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True)
class TransferRequest:
    """Move `length` bytes between `local` at `local_offset` and `target` at `target_offset`;
    a WRITE into guarded memory carries the `capability` its owner issued."""

    op: Op
    local: Region
    local_offset: int
    target: str
    target_offset: int
    length: int
    capability: bytes | None = None


class Status(NamedTuple):  # a tuple: cheap to make on every poll
    state: State
    reason: str = ""
    transferred: int = 0


class Batch:
    """Tracks the slices of each request; thread-safe. Created by `TransferEngine.submit`."""

    def __init__(self, requests: list[TransferRequest],
                 on_done: Callable[[Batch, Mapping[int, float]], None] | None = None) -> None:
        """`on_done(batch, ended)` runs once every request finished, `ended` giving when
        each completed one did (perf_counter; the engine's link statistics)."""
        self.requests = requests
        self.started = time.perf_counter()
        self._on_done = on_done
        self._ended: dict[int, float] = {}
        self._lock = threading.Lock()
        self._cond: threading.Condition | None = None  # made by the first wait() that blocks
        self._left = [0] * len(requests)
        self._done = [0] * len(requests)
        self._reason: list[str | None] = [None] * len(requests)
        self._open = len(requests)

    def expect(self, index: int, slices: int) -> None:
        """Announce how many slices request `index` was cut into. Called by the submitter
        before any slice of the batch runs, so no other thread looks yet."""
        self._left[index] = slices
        if slices == 0:
            self._finish(index)

    def _finish(self, index: int) -> None:
        self._open -= 1
        if self._on_done is not None:
            if self._reason[index] is None:
                self._ended[index] = time.perf_counter()
            if self._open == 0:
                self._on_done(self, self._ended)
        if self._open == 0 and self._cond is not None:
            self._cond.notify_all()

    def slice_done(self, index: int, nbytes: int, error: str | None = None) -> None:
        with self._lock:
            if self._left[index] <= 0:
                return
            if error is not None and self._reason[index] is None:
                self._reason[index] = error
            self._done[index] += nbytes if error is None else 0
            self._left[index] -= 1
            if self._left[index] == 0:
                self._finish(index)

    def fail(self, index: int, error: str) -> None:
        """Fail request `index` before it was sliced."""
        self.expect(index, 1)
        self.slice_done(index, 0, error)

    def _status(self, i: int) -> Status:
        if self._left[i] > 0:
            return Status(State.PENDING, "", self._done[i])
        if self._reason[i] is not None:
            return Status(State.FAILED, self._reason[i] or "failed", self._done[i])
        return Status(State.COMPLETED, "", self._done[i])

    def poll(self) -> list[Status]:
        with self._lock:
            return [self._status(i) for i in range(len(self.requests))]

    @property
    def done(self) -> bool:
        return self._open == 0

    def wait(self, timeout: float | None = None) -> list[Status]:
        """Block until every request finished or `timeout` seconds passed; then poll."""
        with self._lock:
            if self._open:  # not finished in the submitting thread: sleep until it is
                if self._cond is None:
                    self._cond = threading.Condition(self._lock)
                self._cond.wait_for(lambda: self._open == 0, timeout)
            return [self._status(i) for i in range(len(self.requests))]

    def ok(self, timeout: float | None = None) -> bool:
        return all(s.state is State.COMPLETED for s in self.wait(timeout))
