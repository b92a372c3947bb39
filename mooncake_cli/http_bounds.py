"""uvicorn's h11 protocol with the connection bounds of `mooncake_cli.asgi.Server`: request
headers within a deadline, and at most so many connections waiting for them at once."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def bounded_protocol(header_timeout: float, max_waiting: int,
                     header_budget: int = 32 << 20) -> type[H11Protocol]:
    waiting: OrderedDict[H11Protocol, None] = OrderedDict()  # this server's, oldest first
    held = [0]  # bytes received by connections whose request headers are not complete yet

    class Bounded(H11Protocol):
        """uvicorn's h11 protocol, closing connections whose request headers do not arrive
        within `header_timeout` of connecting or of the last answer (idle ones too), and the
        longest waiting one when more than `max_waiting` wait for request headers at once
        (idle sockets cannot fill the server: requests keep room), and one whose unfinished
        headers would take the bytes held that way over `header_budget` (all connections)."""

        _deadline: asyncio.TimerHandle | None = None
        _held = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(header_timeout, self._expire)
            waiting[self] = None
            waiting.move_to_end(self)
            while len(waiting) > max_waiting:
                oldest, _ = waiting.popitem(last=False)
                if isinstance(oldest, Bounded):
                    oldest._expire()

        def _expire(self) -> None:
            idle = self.cycle is None or self.cycle.response_complete
            if idle and self.conn.their_state is h11.IDLE and \
                    not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self in waiting:
                self._held += len(data)
                held[0] += len(data)
                if held[0] > header_budget:
                    self.transport.close()
                    return
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                waiting.pop(self, None)  # a request is under way
                self._release()

        def _release(self) -> None:
            held[0] -= self._held
            self._held = 0

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            waiting.pop(self, None)
            self._release()
            super().connection_lost(exc)

    return Bounded
