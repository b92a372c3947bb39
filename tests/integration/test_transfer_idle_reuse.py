"""Pooled tcp connections that the target closed while they sat idle (it closes one after
`idle_timeout` seconds without a request, 120 s by default) are not reused: a batch after
the target has closed every pooled connection completes, its bytes where they belong. Before,
the engine took a closed connection, and its one retry took the next closed one."""

from __future__ import annotations

from mooncake_cli.transfer.batch import Op, State, TransferRequest
from tests.conftest import wait_for

MiB = 1 << 20
SECRET = "idle-reuse-secret"


def test_a_batch_after_the_target_closed_the_idle_pool_completes(make_engine) -> None:
    target = make_engine(secret=SECRET, transport="tcp")
    initiator = make_engine(secret=SECRET, transport="tcp")
    landing = bytearray(16 * MiB)
    region = target.register(landing)
    server = target.listener
    src = initiator.register(bytearray(b"\x11" * (16 * MiB)))

    def batch(fill: int) -> list[State]:
        src.view[:] = bytes([fill]) * (16 * MiB)  # type: ignore[index]
        reqs = [TransferRequest(Op.WRITE, src, o, target.name, region.base + o, 4 * MiB)
                for o in range(0, 16 * MiB, 4 * MiB)]
        return [st.state for st in initiator.submit(reqs).wait(30)]

    assert batch(0x11) == [State.COMPLETED] * 4
    opened = len(server.served)
    assert opened >= 2, "the batch ran on one connection: nothing pooled to go stale"
    server.idle_timeout = 0.2
    wait_for(lambda: len(server.served) == 0, 30, what="the target closing its idle connections")
    assert batch(0x22) == [State.COMPLETED] * 4
    assert landing == b"\x22" * (16 * MiB)
