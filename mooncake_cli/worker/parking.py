"""Parking: the KV of a preempted decode sequence goes to the store under its block keys (the
prompt's blocks are usually there already), its cache blocks are freed, and on resume the
stored blocks are read back; only what the store no longer holds is recomputed.

Block keys chain the tokens before them (`mooncake_cli.kvkeys`), so a block of generated tokens
is keyed exactly as the same tokens in a prompt would be: a parked block is also a prefix block
any prefill may reuse.
"""

from __future__ import annotations

from dataclasses import dataclass

from mooncake_cli.engine import ModelRunner, Sequence
from mooncake_cli.kvkeys import KVNamespace, block_keys
from mooncake_cli.worker.prefix import PrefixStore


@dataclass
class Resumed:
    reloaded_blocks: int
    recomputed_tokens: int


class Parking:
    """Park and resume sequences of one decode worker; without a store, resume recomputes."""

    def __init__(self, prefix: PrefixStore | None, runner: ModelRunner, ns: KVNamespace) -> None:
        self.prefix = prefix
        self.runner = runner
        self.ns = ns

    def _keys(self, seq: Sequence, blocks: int) -> list[str]:
        return block_keys(seq.token_ids[:blocks * self.ns.block_size], self.ns)

    def park(self, seq: Sequence) -> int:
        """Put the full computed blocks of `seq` the store lacks; how many full blocks the
        store holds for it now. The caller frees the cache blocks afterwards."""
        full = seq.num_computed // self.ns.block_size
        if self.prefix is None or full == 0:
            return 0
        keys = self._keys(seq, full)
        held = self.prefix.leading_hits(keys)
        stored = self.prefix.put(keys[held:], seq.block_table[held:full])
        return held + len(stored)

    def resume(self, seq: Sequence) -> Resumed:
        """Give `seq` (no blocks, nothing computed) back the KV of every token but its last,
        which the next decode step computes as before the preemption."""
        n = len(seq.token_ids)
        bs = self.ns.block_size
        loaded = 0
        if self.prefix is not None:
            loaded = self.prefix.load(self._keys(seq, (n - 1) // bs), n, seq.block_table)
        seq.num_computed = loaded * bs
        recomputed = seq.num_pending - 1
        while seq.num_pending > 1:
            self.runner.step([seq], [min(seq.num_pending - 1, self.runner.chunk_size)])
        return Resumed(loaded, recomputed)
