"""Running the slices of a batch on a peer's channels: one slice at a time on a pooled channel
(`run_slice`), or every slice for one peer handed whole to a `BatchChannel` (`post_all`)."""

from __future__ import annotations

from mooncake_cli.interfaces import TransferError
from mooncake_cli.transfer.batch import Batch, Op
from mooncake_cli.transfer.peers import Peer
from mooncake_cli.transfer.segment import Region
from mooncake_cli.transfer.spi import Slice

MIN_SLICE = 2 << 20  # one stream reaches ~4 GB/s here: cutting smaller only adds hand-offs


def cut(length: int, parallel: int, max_slice: int) -> list[tuple[int, int]]:
    """(offset, length) slices of a request: spread over `parallel` connections, each between
    MIN_SLICE and `max_slice` bytes (a shorter request is one slice)."""
    if length <= MIN_SLICE:
        return [(0, length)]
    n = max(min(-(-length // MIN_SLICE), parallel), -(-length // max_slice))
    size = -(-length // n)
    return [(o, min(size, length - o)) for o in range(0, length, size)]


def run_slice(batch: Batch, index: int, peer: Peer, op: Op, local: Region, start: int,
              n: int, remote: int, cap: bytes | None = None, spin: bool = True) -> None:
    """Move one slice over a pooled channel; retried once on a fresh channel when the first
    one broke (a refusal by the peer is final). `cap` goes with a WRITE into guarded memory."""
    error = None
    for _attempt in (0, 1):
        try:
            ch = peer.acquire()
        except TransferError as e:
            error = str(e)
            break
        assert ch is not None
        ch.spin = spin
        try:
            if op is Op.READ:
                view = local.sink(start, n)
                ch.read(remote, view)
                local.commit(start, view)
            elif cap is None:
                ch.write(remote, local.load(start, n))
            else:
                ch.write(remote, local.load(start, n), cap)  # type: ignore[call-arg]
            error = None
        except TransferError as e:
            error = str(e)
        except Exception as e:  # a worker must survive, and the slice must end, whatever
            error = f"{type(e).__name__}: {e}"
        finally:
            peer.release(ch)
        if error is None or not getattr(ch, "broken", False):
            break  # done, or refused by the peer: retrying would not help
    if error is not None:
        peer.stale = True
    batch.slice_done(index, n, error)


def post_all(batch: Batch, peer: Peer, work: list[tuple[int, Slice]], timeout: float) -> None:
    """Hand every slice for `peer` to one `BatchChannel.post`; each completes on its own."""
    index = [i for i, _ in work]
    sizes = [s.length for _, s in work]

    def done(k: int, error: str | None) -> None:
        if error is not None:
            peer.stale = True
        batch.slice_done(index[k], sizes[k] if error is None else 0, error)

    try:
        ch = peer.acquire()
    except TransferError as e:
        for k in range(len(work)):
            done(k, str(e))
        return
    try:
        post = getattr(ch, "post", None)  # not isinstance(BatchChannel): that costs ~20 us
        if post is None:
            raise TransferError(f"{peer.name} says it takes batches whole but its channel "
                                "has no post()")
        post([s for _, s in work], done, timeout)
    except Exception as e:  # post itself failed: nothing was started
        for k in range(len(work)):
            done(k, str(e) if isinstance(e, TransferError) else f"{type(e).__name__}: {e}")
    finally:
        peer.release(ch)  # type: ignore[arg-type]
