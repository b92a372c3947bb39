"""Plain HTTP requests that ignore proxy variables (the doctor reports those separately), and
naming what kind of server listens on an address: etcd, a Mooncake metadata server, or other."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    server: str

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class NotHttp(OSError):
    """Something answered on the port, but not HTTP."""


def request(host: str, port: int, method: str, path: str, body: bytes | None = None,
            timeout: float = 3.0) -> Reply:
    """One request; OSError when nothing listens or answers, NotHttp when the answer is not
    HTTP."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return Reply(resp.status, resp.read(1 << 20), resp.getheader("Server") or "")
    except (http.client.BadStatusLine, http.client.IncompleteRead) as e:
        raise NotHttp(f"not an HTTP server ({type(e).__name__})") from e
    except http.client.HTTPException as e:
        raise NotHttp(f"not an HTTP server ({type(e).__name__}: {e})") from e
    finally:
        conn.close()


@dataclass(frozen=True)
class Kind:
    kind: str  # "etcd", "mooncake-http", "http", "not-http", "unreachable"
    detail: str  # etcd's version, the server header, or the error
    version: str = ""


def sniff(host: str, port: int, timeout: float) -> bytes:
    """The first bytes the server sends back to a minimal HTTP request (b"" when it sends
    nothing in time); OSError when nothing accepts the connection."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(b"GET /version HTTP/1.0\r\nHost: " + host.encode() + b"\r\n\r\n")
        try:
            return s.recv(64)
        except TimeoutError:
            return b""


def identify(host: str, port: int, timeout: float = 3.0) -> Kind:
    """What listens on host:port, told apart by how it answers GET /version."""
    try:
        first = sniff(host, port, timeout)
    except OSError as e:  # refused, unreachable, timed out connecting
        return Kind("unreachable", getattr(e, "strerror", None) or str(e) or type(e).__name__)
    if not first.startswith(b"HTTP/"):
        if first.startswith(b"\xff"):
            return Kind("not-http", "it speaks ZeroMQ (ZMTP): a store master's RPC port?")
        return Kind("not-http", f"it answered {first[:16]!r}" if first else
                    f"it accepts connections but sent nothing in {timeout:g} s")
    try:
        r = request(host, port, "GET", "/version", timeout=timeout)
    except OSError as e:
        return Kind("not-http", str(e))
    data = r.json()
    if r.status == 200 and isinstance(data, dict) and "etcdserver" in data:
        return Kind("etcd", f"etcd {data['etcdserver']} (cluster {data.get('etcdcluster', '?')})",
                    str(data["etcdserver"]))
    if r.status == 404 and r.body.startswith(b"unknown path"):  # before the shared HTTP edge
        return Kind("mooncake-http", f"Mooncake HTTP metadata server ({r.server})")
    try:  # a metadata server at its default path asks for ?key= (workers and the conductor 404)
        m = request(host, port, "GET", "/metadata", timeout=timeout)
    except OSError:
        m = None
    if m is not None and m.status == 400 and b"?key=" in m.body:
        return Kind("mooncake-http", f"Mooncake HTTP metadata server ({m.server})")
    return Kind("http", f"HTTP {r.status} on /version (Server: {r.server or 'not given'})")


def describe(kind: Kind, host: str, port: int) -> str:
    """How to name `kind` in a message, with the URL that would reach it."""
    return {
        "etcd": f"etcd's client port ({kind.detail}): use etcd://{host}:{port}",
        "mooncake-http": f"a Mooncake HTTP metadata server: use "
                         f"http://{host}:{port}/metadata",
        "http": f"an HTTP server that is neither etcd nor a metadata server ({kind.detail})",
        "not-http": f"not an HTTP server: {kind.detail}",
        "unreachable": f"nothing answers ({kind.detail})",
    }[kind.kind]
