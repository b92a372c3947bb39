"""Space allocation inside one segment: offsets in [0, capacity), first fit, coalescing frees.

Every block starts and ends on a multiple of `alignment`: sizes are rounded up to it and the
usable capacity is the segment size rounded down to it. Free blocks are kept sorted by offset;
freeing a block merges it with free neighbours, so freeing everything leaves one block again.
Not thread-safe: the master's lock guards it.
"""

from __future__ import annotations

import bisect

from mooncake_cli.store.errors import InvalidParams

DEFAULT_ALIGNMENT = 64


class Allocator:
    """Offsets for allocations of one segment of `capacity` bytes."""

    def __init__(self, capacity: int, alignment: int = DEFAULT_ALIGNMENT) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise InvalidParams(f"alignment {alignment} must be a positive power of two")
        usable = capacity - capacity % alignment
        if usable <= 0:
            raise InvalidParams(f"capacity {capacity} is below the alignment of {alignment}")
        self.alignment = alignment
        self.capacity = usable
        self._starts: list[int] = [0]  # free block offsets, sorted
        self._free: dict[int, int] = {0: usable}  # free block offset -> length
        self._used: dict[int, int] = {}  # allocated offset -> aligned length
        self.used = 0

    def aligned(self, size: int) -> int:
        """`size` rounded up to the alignment: what an allocation of `size` really takes."""
        return -(-size // self.alignment) * self.alignment

    def _check(self, size: int) -> int:
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise InvalidParams(f"allocation size must be a positive integer, got {size!r}")
        need = self.aligned(size)
        if need > self.capacity:
            raise InvalidParams(f"allocation of {size} bytes exceeds the segment's capacity of "
                                f"{self.capacity} bytes")
        return need

    def alloc(self, size: int) -> int | None:
        """The offset of a fresh block of at least `size` bytes, or None when none is free."""
        return self._cut(self._check(size))

    def _cut(self, need: int) -> int | None:
        """Take `need` bytes from the head of the first free block that holds them: the
        offset, or None when none does."""
        for start in self._starts:
            length = self._free[start]
            if length >= need:
                self._take(start, length, start, need)
                return start
        return None

    def alloc_run(self, size: int, count: int) -> list[int] | None:
        """The offsets of `count` fresh blocks of `size` bytes each, one after the other, cut
        from the first free block that holds them all in one go (each freed on its own later),
        or None when no free block does (then nothing is taken)."""
        need = self._check(size)
        start = self._cut(need * count)
        if start is None:
            return None
        used = self._used
        del used[start]  # one block taken: recorded as `count` blocks
        offsets = list(range(start, start + need * count, need))
        for off in offsets:
            used[off] = need
        return offsets

    def reserve(self, offset: int, size: int) -> bool:
        """Claim exactly [offset, offset+aligned(size)) if all of it is free (re-registration)."""
        need = self._check(size)
        if not isinstance(offset, int) or offset < 0 or offset % self.alignment:
            raise InvalidParams(f"offset {offset!r} is not a multiple of {self.alignment}")
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            return False
        start = self._starts[i]
        length = self._free[start]
        if offset + need > start + length:
            return False
        self._take(start, length, offset, need)
        return True

    def _take(self, start: int, length: int, offset: int, need: int) -> None:
        """Cut [offset, offset+need) out of the free block [start, start+length)."""
        i = bisect.bisect_left(self._starts, start)
        del self._free[start]
        end, block_end = offset + need, start + length
        if offset == start and block_end > end:  # the head: the rest keeps its place in order
            self._starts[i] = end
            self._free[end] = block_end - end
        else:
            del self._starts[i]
            if offset > start:
                self._insert(start, offset - start)
            if block_end > end:
                self._insert(end, block_end - end)
        self._used[offset] = need
        self.used += need

    def _insert(self, start: int, length: int) -> None:
        bisect.insort(self._starts, start)
        self._free[start] = length

    def free(self, offset: int) -> int:
        """Release the block at `offset`; returns its aligned length. Unknown offsets refused."""
        length = self._used.pop(offset, None)
        if length is None:
            raise InvalidParams(f"offset {offset!r} is not an allocated block")
        self.used -= length
        start, end = offset, offset + length
        i = bisect.bisect_left(self._starts, offset)
        if i < len(self._starts) and self._starts[i] == end:  # merge with the next free block
            end += self._free.pop(end)
            del self._starts[i]
        if i > 0:
            prev = self._starts[i - 1]
            if prev + self._free[prev] == start:  # merge into the previous free block
                self._free[prev] = end - prev
                return length
        self._insert(start, end - start)
        return length

    def size_of(self, offset: int) -> int | None:
        """The aligned length of the allocated block at `offset`, None if there is none."""
        return self._used.get(offset)

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.used

    @property
    def largest_free(self) -> int:
        return max(self._free.values(), default=0)

    def blocks(self) -> list[tuple[int, int]]:
        """Allocated (offset, aligned length) pairs in offset order."""
        return sorted(self._used.items())

    def free_blocks(self) -> list[tuple[int, int]]:
        """Free (offset, length) pairs in offset order."""
        return [(s, self._free[s]) for s in self._starts]
