"""Runs the check groups in order; a group that crashes becomes one failed check, so the
others still report."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from mooncake_cli.doctor import (
    environment,
    install,
    master,
    memory,
    metadata,
    network,
    nixl,
    rdma,
    topology,
)
from mooncake_cli.doctor.check import GROUP_NAMES, Check, DoctorConfig, Status

log = logging.getLogger("mooncake.doctor")

GROUPS: Mapping[str, Callable[[DoctorConfig], list[Check]]] = MappingProxyType({
    "install": install.checks,
    "environment": environment.checks,
    "metadata": metadata.checks,
    "master": master.checks,
    "rdma": rdma.checks,
    "nixl": nixl.checks,
    "memory": memory.checks,
    "network": network.checks,
    "topology": topology.checks,
})
if tuple(GROUPS) != GROUP_NAMES:  # the CLI validates --group against GROUP_NAMES
    raise ImportError("doctor GROUPS and GROUP_NAMES disagree")


def run(cfg: DoctorConfig, groups: Iterable[str] | None = None,
        on_group: Callable[[str], None] | None = None) -> list[Check]:
    """The checks of `groups` (default: all, in order); `on_group(name)` before each group."""
    out: list[Check] = []
    for name in groups or GROUPS:
        if on_group:
            on_group(name)
        try:
            out += GROUPS[name](cfg)
        except Exception as e:  # one broken probe must not hide the other groups' findings
            log.debug("the %s checks crashed", name, exc_info=True)
            out.append(Check(name, "checks", Status.FAIL,
                             f"the {name} checks crashed: {type(e).__name__}: {e}",
                             "run with --log-level debug for the traceback and report it"))
    return out

