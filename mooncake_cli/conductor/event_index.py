"""What one event stream (an instance's dp rank) holds, per medium, keyed by the indexer API's
sequence hashes (`seqhash`) at the stream's registered block size.

vLLM's block hashes are its own (SHA-256 over its block size, salts and extra keys), so they
are translated through the `token_ids` of each `BlockStored`: a block's tokens continue its
parent's state (the sequence hash of the last whole block of OUR size before it, and the
tokens since), and every block of our size that ends inside the new block gets its sequence
hash. When the sizes differ, a block of ours is held on a medium only when every vLLM block
its tokens lie in is held there: ours of 64 over vLLM's 16 needs all four; ours of 16 under
vLLM's 64 are four blocks that come and go with their one vLLM block; a part of a block of
ours at the end of a sequence is no block (only whole blocks count, as in a query).

Not translated (counted, never indexed): blocks whose parent was never seen (`orphaned`),
blocks with extra keys beyond the LoRA name (multimodal inputs, a request's cache_salt:
their KV is not a function of the token ids alone; `tainted`, with their descendants), and
KV cache groups other than 0 (hybrid models' sliding-window groups; `other_groups`).
Memory: at most `max_nodes` vLLM blocks per stream; blocks held nowhere are forgotten first
(oldest first), beyond that new blocks are refused (`dropped`).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mooncake_cli.conductor.kv_events import BlockHash, Cleared, Event, Removed, Stored
from mooncake_cli.conductor.seqhash import extend, local_hash

TIERS = ("gpu", "cpu", "disk")
Key = tuple[str | None, int]  # (lora_name, sequence hash)
_LOST = b"\x00lost"  # in a span: a block whose extent was forgotten (never held)


@dataclass(eq=False)
class _Node:
    parent: BlockHash | None
    end: int  # tokens from the sequence start to this block's end
    chain: int | None  # sequence hash of the last whole block of ours ending by `end`
    tail: tuple[int, ...]  # the tokens after that block (fewer than our block size)
    lora: str | None
    tainted: bool
    made: tuple[int, ...] = ()  # sequence hashes of our blocks that end in this block
    spans: tuple[tuple[BlockHash, ...], ...] = ()  # per made: the earlier blocks it lies in
    media: set[str] = field(default_factory=set)


_ROOT = _Node(None, 0, None, (), None, False)


@dataclass(frozen=True)
class Match:
    """Leading blocks of a query held: on some medium (`longest`), and per tier."""

    longest: int
    tiers: dict[str, int]


class StreamIndex:
    def __init__(self, block_size: int, lora_name: str | None = None,
                 max_nodes: int = 1 << 19) -> None:
        self.block_size, self.lora, self.max_nodes = block_size, lora_name, max_nodes
        self.counts: Counter[str] = Counter()
        self._nodes: dict[BlockHash, _Node] = {}
        self._unheld: OrderedDict[BlockHash, None] = OrderedDict()
        self._done: dict[Key, dict[BlockHash, int]] = {}  # our block -> (vLLM block, made idx)
        self._lock = threading.Lock()

    # -- events ---------------------------------------------------------------------------
    def apply(self, events: Sequence[Event]) -> None:
        with self._lock:
            for ev in events:
                if isinstance(ev, Stored):
                    self._stored(ev)
                elif isinstance(ev, Removed):
                    self._removed(ev)
                elif isinstance(ev, Cleared):
                    self._clear()
                    self.counts["cleared"] += 1

    def clear(self) -> None:
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        self._nodes.clear()
        self._unheld.clear()
        self._done.clear()

    def _stored(self, ev: Stored) -> None:
        n = len(ev.hashes)
        if ev.group != 0:
            self.counts["other_groups"] += n
            return
        prev = _ROOT if ev.parent is None else self._nodes.get(ev.parent)
        if prev is None:
            self.counts["orphaned"] += n
            return
        prev_hash = ev.parent
        lora = ev.lora_name if ev.lora_name is not None else self.lora
        for i, h in enumerate(ev.hashes):
            node = self._nodes.get(h)
            if node is None:
                if not self._room():
                    self.counts["dropped"] += n - i
                    return
                toks = ev.token_ids[i * ev.block_size:(i + 1) * ev.block_size]
                extra = ev.extra_keys[i] if ev.extra_keys is not None else None
                node = self._new(prev, prev_hash, toks, lora, _salted(extra, lora))
                self._nodes[h] = node
                for j, s in enumerate(node.made):
                    self._done.setdefault((node.lora, s), {})[h] = j
            self.counts["tainted" if node.tainted else "stored"] += 1
            if not node.media:
                self._unheld.pop(h, None)
            node.media.add(ev.medium)
            prev, prev_hash = node, h

    def _room(self) -> bool:
        while len(self._nodes) >= self.max_nodes and self._unheld:
            h, _ = self._unheld.popitem(last=False)
            node = self._nodes.pop(h)
            for s in node.made:
                done = self._done.get((node.lora, s), {})
                done.pop(h, None)
                if not done:
                    self._done.pop((node.lora, s), None)
        return len(self._nodes) < self.max_nodes

    def _new(self, prev: _Node, prev_hash: BlockHash | None, toks: tuple[int, ...],
             lora: str | None, salted: bool) -> _Node:
        end = prev.end + len(toks)
        if prev.tainted or salted:
            return _Node(prev_hash, end, None, (), lora, True)
        bs, buf, chain = self.block_size, prev.tail + toks, prev.chain
        first = prev.end - len(prev.tail)  # where `buf` starts in the sequence
        made, spans = [], []
        k = 0
        while k + bs <= len(buf):
            chain = extend(chain, local_hash(buf[k:k + bs]))
            made.append(chain)
            spans.append(self._span(prev_hash, first + k))
            k += bs
        return _Node(prev_hash, end, chain, buf[k:], lora, False, tuple(made), tuple(spans))

    def _span(self, h: BlockHash | None, start: int) -> tuple[BlockHash, ...]:
        """The blocks from `h` back that hold tokens at or after position `start`."""
        out: list[BlockHash] = []
        while h is not None:
            node = self._nodes.get(h)
            if node is None:
                return (*out, _LOST)
            if node.end <= start:
                break
            out.append(h)
            h = node.parent
        return tuple(out)

    def _removed(self, ev: Removed) -> None:
        if ev.group != 0:
            self.counts["other_groups"] += len(ev.hashes)
            return
        for h in ev.hashes:
            node = self._nodes.get(h)
            if node is None or ev.medium not in node.media:
                self.counts["removed_unknown"] += 1
                continue
            node.media.discard(ev.medium)
            self.counts["removed"] += 1
            if not node.media:
                self._unheld[h] = None

    # -- queries --------------------------------------------------------------------------
    def match(self, lora: str | None, hashes: Sequence[int]) -> Match:
        """Leading `hashes` (sequence hashes at this stream's block size) held."""
        tiers = dict.fromkeys(TIERS, 0)
        alive = set(TIERS)
        longest = 0
        with self._lock:
            for i, h in enumerate(hashes):
                media = self._media((lora, h))
                if not media:
                    break
                longest = i + 1
                for t in list(alive):
                    if t in media:
                        tiers[t] = i + 1
                    else:
                        alive.discard(t)
        return Match(longest, tiers)

    def _media(self, key: Key) -> set[str]:
        out: set[str] = set()
        for h, j in self._done.get(key, {}).items():
            node = self._nodes[h]
            media = set(node.media)
            for other in node.spans[j]:
                held = self._nodes.get(other)
                media &= held.media if held is not None else set()
            out |= media
        return out

    def covered(self, lora: str | None, hashes: Sequence[int],
                held: Callable[[BlockHash], bool]) -> int:
        """Leading `hashes` (as in `match`) whose every vLLM block, the one each ends in and
        the earlier ones its tokens lie in, is `held` somewhere else (in the store, say):
        whether this stream holds it now or not, it knows which vLLM blocks make it up."""
        n = 0
        with self._lock:
            for h in hashes:
                if not any(held(v) and all(o is not _LOST and held(o)
                                           for o in self._nodes[v].spans[j])
                           for v, j in self._done.get((lora, h), {}).items()):
                    break
                n += 1
        return n

    def held(self) -> dict[str, int]:
        """vLLM blocks held per medium."""
        with self._lock:
            return dict(Counter(m for n in self._nodes.values() for m in n.media))


def _salted(extra: object, lora: str | None) -> bool:
    """Whether a block's extra keys hold more than its LoRA name (vLLM puts the LoRA name
    first, then multimodal (id, offset) pairs, the cache_salt and prompt-embedding digests)."""
    if extra is None:
        return False
    rest = list(extra) if isinstance(extra, (list, tuple)) else [extra]
    if rest and lora is not None and rest[0] == lora:
        rest = rest[1:]
    return bool(rest)
