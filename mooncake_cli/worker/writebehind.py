"""WriteBehind: a decode worker's generated KV blocks go to the store as they fill, under the
same chained block keys a prompt of the same tokens would have (`mooncake_cli.kvkeys`).

When the worker dies, the conductor moves each of its requests to another decode worker with
the prompt plus the tokens already streamed as the new prompt; the prefill there then loads
these blocks instead of recomputing them. The step thread only copies a block that has just
filled (one block per sequence every `block_size` steps) and hands it to a thread of its own,
through a bounded queue: when the store is slower than the steps, blocks are dropped (and
counted), never waited for. Each block is put with two replicas, so that one outlives this
worker's own segment wherever the store has another.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from mooncake_cli.engine import KVCache
from mooncake_cli.kvkeys import KVNamespace, chain_hashes, key_for
from mooncake_cli.store.records import ReplicateConfig
from mooncake_cli.worker.decode_request import DecodeRequest
from mooncake_cli.worker.metrics import WorkerMetrics
from mooncake_cli.worker.prefix import PrefixStore

log = logging.getLogger("mooncake.worker")
DEPTH = 256  # block batches (one per step) waiting for the store at most
BATCH = 64  # blocks per batch put at most: the store's calls cost per batch, not per block


@dataclass
class _Mark:
    blocks: int  # full blocks of the sequence already stored (or known to be)
    chain: int  # the chained hash of the last of them


class WriteBehind:
    """Follows the sequences of one decode worker; `after_step` on the step thread."""

    def __init__(self, prefix: PrefixStore, cache: KVCache, ns: KVNamespace,
                 metrics: WorkerMetrics, depth: int = DEPTH) -> None:
        self.prefix = prefix
        self.cache = cache
        self.ns = ns
        self.metrics = metrics
        self.config = ReplicateConfig(replica_num=2)
        self._marks: dict[int, _Mark] = {}
        self._queue: queue.Queue[tuple[list[str], list[torch.Tensor]] | None] = \
            queue.Queue(depth)
        self._thread = threading.Thread(target=self._run, name="mooncake-write-behind",
                                        daemon=True)
        self._thread.start()

    def follow(self, req: DecodeRequest) -> None:
        """Start following `req`: the full blocks of its prompt are the prefill's to store."""
        seq = req.seq
        full = seq.num_prompt // self.ns.block_size
        hashes = chain_hashes(seq.token_ids[:full * self.ns.block_size], self.ns)
        self._marks[seq.seq_id] = _Mark(full, hashes[-1] if hashes else 0)

    def forget(self, req: DecodeRequest) -> None:
        self._marks.pop(req.seq.seq_id, None)

    def after_step(self, batch: Iterable[DecodeRequest]) -> None:
        """Copy out the blocks that filled in this step and queue them for the store."""
        bs = self.ns.block_size
        keys: list[str] = []
        data: list[torch.Tensor] = []
        for req in batch:
            seq, mark = req.seq, self._marks.get(req.seq.seq_id)
            if mark is None:
                continue
            full = seq.num_computed // bs
            while mark.blocks < full:
                b = mark.blocks
                [h] = chain_hashes(seq.token_ids[b * bs:(b + 1) * bs], self.ns,
                                   start=mark.chain if b else None)
                keys.append(key_for(h, self.ns))
                data.append(self.cache.block(seq.block_table[b]).to("cpu", copy=True))
                mark.blocks, mark.chain = b + 1, h
        if not keys:
            return
        try:
            self._queue.put_nowait((keys, data))
        except queue.Full:
            self.metrics.add("write_behind_dropped_blocks", len(keys))

    def _run(self) -> None:
        stop = False
        while not stop and (item := self._queue.get()) is not None:
            keys, data = list(item[0]), list(item[1])
            while len(keys) < BATCH:  # what queued meanwhile goes in the same batch put
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True  # after this batch
                    break
                keys += more[0]
                data += more[1]
            stored = self.prefix.put_tensors(keys, data, self.config)
            self.metrics.add("write_behind_blocks", len(stored))
            self.metrics.add("kv_bytes_stored", len(stored) * self.ns.block_bytes)

    def close(self, timeout: float = 10.0) -> None:
        """Store what is queued (up to `timeout` seconds), then stop the thread."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            log.warning("write-behind: %d block batches not stored at shutdown",
                        self._queue.qsize())
            return
        self._thread.join(timeout)
