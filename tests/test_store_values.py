"""The client's verified copies (store/client/values.py): large parts are copied by two threads
(SPLIT), and the checksum is still the xxh3_64 of the whole value, in order."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
import xxhash

from mooncake_cli.store.client import values
from mooncake_cli.store.client.values import Gathered, copy_checked, copy_hashed
from mooncake_cli.store.errors import BufferOverflow


def _bytes(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.mark.parametrize("n", [4096, values.SPLIT - 1, values.SPLIT, 5 * values.SPLIT + 12345])
def test_a_copy_lands_every_byte_and_hashes_the_whole_value(n: int) -> None:
    src = _bytes(n, n)
    dest = np.zeros(n + 64, np.uint8)
    assert copy_hashed(memoryview(dest), memoryview(src)) == xxhash.xxh3_64_hexdigest(src)
    assert np.array_equal(dest[:n], src)
    assert not dest[n:].any()  # nothing past the value


def test_a_gathered_value_hashes_as_its_concatenation() -> None:
    head, body = _bytes(304, 1), _bytes(3 * values.SPLIT + 7, 2)
    dest = np.zeros(len(head) + len(body), np.uint8)
    got = copy_hashed(memoryview(dest), Gathered([head, body]))
    whole = np.concatenate([head, body])
    assert got == xxhash.xxh3_64_hexdigest(whole)
    assert np.array_equal(dest, whole)


def test_a_checked_copy_finds_a_flipped_byte_in_the_part_the_helper_copies() -> None:
    n = 4 * values.SPLIT
    src = _bytes(n, 3)
    want = xxhash.xxh3_64_hexdigest(src)
    dest = np.zeros(n, np.uint8)
    assert copy_checked(memoryview(dest), memoryview(src), want)
    src[n - 5] ^= 0xFF  # in the tail
    assert not copy_checked(memoryview(dest), memoryview(src), want)
    assert dest[n - 5] == src[n - 5]


def test_a_value_larger_than_the_buffer_is_refused_before_any_copy() -> None:
    dest = np.zeros(values.SPLIT, np.uint8)
    with pytest.raises(BufferOverflow):
        copy_hashed(memoryview(dest), memoryview(_bytes(values.SPLIT + 1, 4)))
    assert not dest.any()


def test_a_forked_child_copies_large_values_with_a_helper_of_its_own() -> None:
    import os

    src = _bytes(2 * values.SPLIT, 5)
    dest = np.zeros(len(src), np.uint8)
    copy_hashed(memoryview(dest), memoryview(src))  # the parent's helper thread is started
    pid = os.fork()
    if pid == 0:  # the child: its copy must not wait on the parent's thread
        ok = copy_hashed(memoryview(dest), memoryview(src)) == xxhash.xxh3_64_hexdigest(src)
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the child's copy waited on a helper thread it does not have")
    assert os.waitstatus_to_exitcode(done[1]) == 0
