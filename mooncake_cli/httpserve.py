"""A small threaded HTTP server on a background thread, for the services that need one."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar

S = TypeVar("S", bound="BackgroundHTTPServer")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # socketserver's 5 resets bursts of concurrent clients


class BackgroundHTTPServer:
    """Binds at construction (port 0 picks a free one); serves once `start`ed until `close`."""

    def __init__(self, host: str, port: int, handler: type[BaseHTTPRequestHandler],
                 name: str) -> None:
        self._httpd = _Server((host, port), handler)
        self.host, self.port = str(host), int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        name=name)

    def start(self: S) -> S:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()
