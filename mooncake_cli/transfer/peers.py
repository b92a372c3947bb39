"""Pooled channels to one peer segment, opened on demand up to a per-peer limit."""

from __future__ import annotations

import threading

from mooncake_cli.interfaces import SegmentDescriptor, TransferError
from mooncake_cli.transfer.segment import Segment
from mooncake_cli.transfer.spi import Channel, Endpoint, LocalChannel, Transport


class Peer:
    """Up to `limit` channels to `desc` through `transport`; `acquire` blocks when all are busy."""

    def __init__(self, desc: SegmentDescriptor, transport: Transport | None, secret: str | None,
                 timeout: float, limit: int, local: Segment | None = None,
                 endpoint: Endpoint | None = None) -> None:
        self.desc, self.transport, self._endpoint = desc, transport, endpoint
        self.name = transport.name if transport else "local"
        self.inline_bytes: int = getattr(transport, "inline_bytes", 64 << 10) if transport \
            else 1 << 62
        self.max_slices: int = max(1, getattr(transport, "max_slices", 64)) if transport else 1
        # a transport that takes batches whole: requests are handed to `BatchChannel.post`
        self.batched: bool = bool(getattr(transport, "batched", False))
        self._secret, self._timeout, self._limit = secret, timeout, limit
        self._local = local
        self.stale = False  # set after a failure: the engine looks the peer up again
        self._idle: list[Channel] = []
        self._open = 0
        self._cond = threading.Condition()
        self._closed = False
        self._waiting = 0  # acquirers inside the lock; a lock-free release notifies them
        self._retired = False

    def _new(self) -> Channel:
        if self._local is not None:
            return LocalChannel(self._local)
        if self._endpoint is not None:
            return self._endpoint.connect(self.desc, self._secret, self._timeout)
        assert self.transport is not None
        return self.transport.connect(self.desc, self._secret,  # type: ignore[attr-defined]
                                      self._timeout)

    def acquire(self, block: bool = True) -> Channel | None:
        while not self._closed:
            try:
                ch = self._idle.pop()  # atomic under the GIL: no lock on the hot path
            except IndexError:
                break
            if not self._dropped(ch):
                return ch
        with self._cond:
            while True:
                if self._closed:
                    raise TransferError(f"connections to '{self.desc.name}' are closed")
                self._waiting += 1  # before looking: a release that misses it appended first
                try:
                    while self._idle:
                        ch = self._idle.pop()
                        if not self._dropped(ch, locked=True):
                            return ch
                    if self._open < self._limit:
                        self._open += 1
                        break
                    if not block:
                        return None
                    if not self._cond.wait(self._timeout):
                        raise TransferError(f"no free connection to '{self.desc.name}' within "
                                            f"{self._timeout:g} s")
                finally:
                    self._waiting -= 1
        try:
            return self._new()
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def _dropped(self, ch: Channel, locked: bool = False) -> bool:
        """Whether idle channel `ch` was closed by the peer meanwhile (a transport's channel
        may say so: `dropped()`); such a one is closed and no longer counts as open."""
        dropped = getattr(ch, "dropped", None)
        if dropped is None or not dropped():
            return False
        ch.close()
        if locked:
            self._open -= 1
        else:
            with self._cond:
                self._open -= 1
                self._cond.notify()
        return True

    def release(self, ch: Channel) -> None:
        if not (getattr(ch, "broken", False) or self._closed or self._retired):
            self._idle.append(ch)  # lock-free; see `acquire` for why no wake-up is lost
            if self._waiting or self._closed or self._retired:  # raced with close/retire
                with self._cond:
                    if (self._closed or self._retired) and ch in self._idle:
                        self._idle.remove(ch)
                        self._open -= 1
                        ch.close()
                    self._cond.notify()
            return
        with self._cond:
            if getattr(ch, "broken", False) or self._closed or self._retired:
                self._open -= 1
                ch.close()
            else:
                self._idle.append(ch)
            self._cond.notify()

    def retire(self) -> None:
        """Replaced by a fresh Peer: close idle channels, let busy ones finish, then close."""
        with self._cond:
            self._retired = True
            for ch in self._idle:
                ch.close()
            self._open -= len(self._idle)
            self._idle.clear()
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for ch in self._idle:
                ch.close()
            self._idle.clear()
            self._cond.notify_all()
