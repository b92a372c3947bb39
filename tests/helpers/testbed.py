"""A real testbed (network namespaces, shaped veth links) for a test module, always torn down:

    bed = testbed.fixture("4", "a-b=1gbit,a-c=10gbit,b-c=25gbit,c-d=1gbit")

in a test module makes a module-scoped fixture `bed` yielding the made `Testbed`. Where
namespaces cannot be made (not root, no `ip netns`) the tests skip, their reason starting
with SKIP (an expected skip: tests/helpers/skips.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from mooncake_cli.testbed import bed as testbed_bed
from mooncake_cli.testbed import netns
from mooncake_cli.testbed.netns import TestbedError, check_can_make
from mooncake_cli.testbed.state import Testbed

SKIP = "needs network namespaces"
PREFIX = "mctt"  # not the CLI's default: a test run leaves a user's testbed alone


def cannot_make() -> str | None:
    """Why namespaces cannot be made here (not root, no `ip netns`, a namespace refused, as in
    a container without CAP_SYS_ADMIN), or None."""
    probe = f"{PREFIX}-probe"
    try:
        check_can_make()
        netns.run(["ip", "netns", "add", probe])
        netns.run(["ip", "netns", "delete", probe])
    except TestbedError as e:
        return f"{SKIP}: {e}"
    return None


@contextmanager
def running(hosts: str, links: str | None = None, prefix: str = PREFIX) -> Iterator[Testbed]:
    """A testbed of `hosts` and `links`, down again on exit whatever happened."""
    why = cannot_make()
    if why:
        pytest.skip(why)
    try:
        yield testbed_bed.up(testbed_bed.plan(prefix, hosts, links))
    finally:
        testbed_bed.down(prefix)


def fixture(hosts: str, links: str | None = None,
            prefix: str = PREFIX) -> Callable[..., Any]:
    """A module-scoped pytest fixture yielding a running testbed."""

    @pytest.fixture(scope="module")
    def bed() -> Iterator[Testbed]:
        with running(hosts, links, prefix) as made:
            yield made

    return bed
