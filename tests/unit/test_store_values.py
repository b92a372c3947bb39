"""The client's verified copies (store/client/values.py): streamed (mooncake_cli/native), a large
part (HANDOFF) by a helper thread while this one hashes it; the checksum is still the xxh3_64 of
the whole value, in order."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
import xxhash

from mooncake_cli import native
from mooncake_cli.store.client import values
from mooncake_cli.store.client.values import Gathered, copy_checked, copy_hashed
from mooncake_cli.store.errors import BufferOverflow


def _bytes(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


_H = values.HANDOFF


@pytest.mark.parametrize("n", [4096, _H - 1, _H, 5 * _H + 12345])
def test_a_copy_lands_every_byte_and_hashes_the_whole_value(n: int) -> None:
    src = _bytes(n, n)
    dest = np.zeros(n + 64, np.uint8)
    assert copy_hashed(memoryview(dest), memoryview(src)) == xxhash.xxh3_64_hexdigest(src)
    assert np.array_equal(dest[:n], src)
    assert not dest[n:].any()  # nothing past the value


def test_a_gathered_value_hashes_as_its_concatenation() -> None:
    head, body = _bytes(304, 1), _bytes(3 * values.HANDOFF + 7, 2)
    dest = np.zeros(len(head) + len(body), np.uint8)
    got = copy_hashed(memoryview(dest), Gathered([head, body]))
    whole = np.concatenate([head, body])
    assert got == xxhash.xxh3_64_hexdigest(whole)
    assert np.array_equal(dest, whole)


def test_a_checked_copy_finds_a_flipped_byte_in_the_part_the_helper_copies() -> None:
    n = 4 * values.HANDOFF
    src = _bytes(n, 3)
    want = xxhash.xxh3_64_hexdigest(src)
    dest = np.zeros(n, np.uint8)
    assert copy_checked(memoryview(dest), memoryview(src), want)
    src[n - 5] ^= 0xFF  # in the tail
    assert not copy_checked(memoryview(dest), memoryview(src), want)
    assert dest[n - 5] == src[n - 5]


def test_a_value_larger_than_the_buffer_is_refused_before_any_copy() -> None:
    dest = np.zeros(values.HANDOFF, np.uint8)
    with pytest.raises(BufferOverflow):
        copy_hashed(memoryview(dest), memoryview(_bytes(values.HANDOFF + 1, 4)))
    assert not dest.any()


def test_a_forked_child_copies_large_values_with_a_helper_of_its_own() -> None:
    import os

    src = _bytes(2 * values.HANDOFF, 5)
    dest = np.zeros(len(src), np.uint8)
    copy_hashed(memoryview(dest), memoryview(src))  # the parent's helper thread is started
    pid = os.fork()
    if pid == 0:  # the child: its copy must not wait on the parent's thread
        ok = copy_hashed(memoryview(dest), memoryview(src)) == xxhash.xxh3_64_hexdigest(src)
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)  # sleep: poll
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the child's copy waited on a helper thread it does not have")
    assert os.waitstatus_to_exitcode(done[1]) == 0


_COPIES = [native.stream_copy, native.memmove_copy]


def test_the_streamed_copy_is_built_on_x86_64() -> None:
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("non-temporal stores are x86-64 only; elsewhere stream_copy is memcpy")
    from mooncake_cli.native import streamcopy

    assert native.STREAMED and values.stream_copy is streamcopy.stream_copy
    assert streamcopy.STREAMS == 1


@pytest.mark.parametrize("copy", _COPIES, ids=["stream_copy", "memmove_copy"])
@pytest.mark.parametrize("n", [0, 1, 63, 4095, 4096, 4097, 65535, 65536, 1 << 20 | 77])
@pytest.mark.parametrize("skew", [(0, 0), (1, 0), (0, 7), (15, 3)])
def test_a_copy_at_any_alignment_lands_every_byte_and_nothing_else(
        copy: object, n: int, skew: tuple[int, int]) -> None:
    d, s = skew
    src = _bytes(n + s, n + d)
    dest = np.zeros(n + d + 64, np.uint8)
    copy(memoryview(dest)[d:], memoryview(src)[s:])  # type: ignore[operator]
    assert np.array_equal(dest[d:d + n], src[s:])
    assert not dest[:d].any() and not dest[d + n:].any()


@pytest.mark.parametrize("copy", _COPIES, ids=["stream_copy", "memmove_copy"])
def test_a_copy_refuses_a_value_larger_than_its_buffer_and_writes_nothing(copy: object) -> None:
    dest = np.zeros(4096, np.uint8)
    with pytest.raises(ValueError, match="do not fit"):
        copy(memoryview(dest), memoryview(_bytes(4097, 6)))  # type: ignore[operator]
    assert not dest.any()


@pytest.mark.parametrize("copy", _COPIES, ids=["stream_copy", "memmove_copy"])
def test_a_copy_refuses_a_read_only_destination(copy: object) -> None:
    dest = bytes(8192)
    with pytest.raises(TypeError):
        copy(dest, b"x" * 8192)  # type: ignore[operator]
    assert dest == bytes(8192)
