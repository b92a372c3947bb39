"""uvicorn's httptools protocol (llhttp, a C parser) with the connection bounds of
`mooncake_cli.http.server.Server`: request headers within a deadline and a size, and at most
so many connections waiting for them at once.

It subclasses uvicorn's HttpToolsProtocol and overrides its parser callbacks (not public API):
pyproject.toml bounds uvicorn to the versions these bounds were tested on."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_TOO_LARGE_BODY = b"request headers are too large\n"
TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
             b"content-type: text/plain; charset=utf-8\r\n"
             b"content-length: %d\r\nconnection: close\r\n\r\n" % len(_TOO_LARGE_BODY)
             + _TOO_LARGE_BODY)
LINGER_S = 2.0  # how long a refused connection's input is still read (and dropped)


def bounded_protocol(header_timeout: float, max_waiting: int, max_header: int = 64 << 10,
                     header_budget: int = 32 << 20) -> type[HttpToolsProtocol]:
    waiting: OrderedDict[HttpToolsProtocol, None] = OrderedDict()  # this server's, oldest first
    held = [0]  # bytes received by connections whose request headers are not complete yet

    class Bounded(HttpToolsProtocol):
        """uvicorn's httptools protocol, closing connections whose request headers do not
        arrive within `header_timeout` of connecting or of the last answer (idle ones too), and
        the longest waiting one when more than `max_waiting` wait for request headers at once
        (idle sockets cannot fill the server: requests keep room); refusing (431) headers over
        `max_header` bytes, and closing one whose unfinished headers would take the bytes held
        that way over `header_budget` (all connections)."""

        _deadline: asyncio.TimerHandle | None = None
        _held = 0  # bytes received since the last request's headers were complete
        _heads = True  # what arrives now is (or begins) request headers, not a body
        _lingering = False  # refused: the answer is sent, input is dropped until closing

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
            idle = (self.cycle is None or self.cycle.response_complete) and not self.pipeline
            if idle and self._heads and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._lingering:
                return
            if self._heads:
                self._held += len(data)
                held[0] += len(data)
                if held[0] > header_budget:
                    self.transport.close()
                    return
            super().data_received(data)
            if self._heads and self._held > max_header and not self.transport.is_closing():
                self._refuse()

        def _refuse(self) -> None:
            """431, then a lingering close: the answer and a FIN go out, what the client still
            sends is read and dropped for up to LINGER_S (closing at once would answer it with
            a reset, and a reset makes the client's kernel drop the unread 431)."""
            self.transport.write(TOO_LARGE)
            if not self.transport.can_write_eof():
                self.transport.close()
                return
            self.transport.write_eof()
            self._lingering = True
            if self._deadline is not None:
                self._deadline.cancel()
            waiting.pop(self, None)
            self._deadline = self.loop.call_later(LINGER_S, self.transport.close)

        def on_headers_complete(self) -> None:
            self._heads = False
            waiting.pop(self, None)  # a request is under way
            self._release()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._heads = True  # a pipelined request's headers may follow

        def _release(self) -> None:
            held[0] -= self._held
            self._held = 0

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            waiting.pop(self, None)
            self._release()
            super().connection_lost(exc)

    return Bounded
