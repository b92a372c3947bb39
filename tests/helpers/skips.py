"""The skips a run of the suite may have: those that depend on the host's hardware or platform
(a GPU, an RDMA device, a CPU without non-temporal stores, running as root, network
namespaces, an old glibc), and the opt-in slow tests. Any other skip means the set-up missed
something (etcd, man, an extra, the upstream wheel) and fails the run: conftest's
`pytest_sessionfinish`.

    unexpected(reasons)  # the skip reasons not covered here
"""

from __future__ import annotations

from collections.abc import Iterable

EXPECTED = (  # the start of an expected skip reason
    "needs a CUDA device",
    "needs a GPU",
    "an RDMA device",
    "root writes into a read-only folder",
    "needs network namespaces",  # the testbed: not root, or no `ip netns`
    "non-temporal stores are x86-64 only",
    "glibc >= 2.33",
    "the vllm engine is installed in this environment",  # the core suite inside vLLM's venv
    "an 8k-token prompt takes many minutes on a CPU",  # MOONCAKE_SLOW_TESTS=1 runs it
)


def reason_of(longrepr: object) -> str:
    """The reason of a skipped report's `longrepr` ((file, line, "Skipped: reason"))."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        text = str(longrepr[2])
        return text.removeprefix("Skipped: ")
    return str(longrepr)


def unexpected(reasons: Iterable[tuple[str, str]]) -> list[str]:
    """`test id: reason` for each (test id, reason) whose reason no EXPECTED entry starts."""
    return [f"{nodeid}: {why}" for nodeid, why in reasons
            if not any(why.startswith(e) for e in EXPECTED)]
