"""Encryption in transit for the store RPC: a real master started with --encrypt speaks
CurveZMQ keyed by the secret. A client with the secret is served; one without it, or with
another, never completes the handshake and gets no answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from mooncake_cli.interfaces import ConfigError
from mooncake_cli.store.errors import RpcFailed
from mooncake_cli.store.wire import protocol
from mooncake_cli.store.wire.rpc import MasterConnection
from tests.helpers.store_procs import Proc, start_master

pytestmark = pytest.mark.timeout(60)
SECRET = "curve-secret"


@pytest.fixture(scope="module")
def master() -> Iterator[Proc]:
    m = start_master(0, "--secret", SECRET, "--encrypt")
    yield m
    m.stop()


def ask(address: str, secret: str | None, encrypt: bool) -> object:
    ctx = zmq.Context()
    conn = MasterConnection(ctx, address, secret, 1.5, encrypt=encrypt)
    try:
        return conn.call(protocol.Exists("nothing"), bool)
    finally:
        conn.close()
        ctx.term()


def test_a_client_with_the_secret_is_served(master: Proc) -> None:
    assert ask(str(master.ready["address"]), SECRET, True) is False


@pytest.mark.parametrize("secret,encrypt", [(SECRET, False), ("wrong", True)])
def test_others_get_no_answer(master: Proc, secret: str, encrypt: bool) -> None:
    with pytest.raises(RpcFailed, match="did not answer"):
        ask(str(master.ready["address"]), secret, encrypt)
    assert ask(str(master.ready["address"]), SECRET, True) is False  # still serving


def test_encryption_needs_a_secret() -> None:
    with pytest.raises(ConfigError, match="needs the cluster secret"):
        MasterConnection(zmq.Context.instance(), "127.0.0.1:1", None, 1, encrypt=True)
