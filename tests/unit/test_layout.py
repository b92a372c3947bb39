"""The layout keeps its shape: no import cycle among mooncake_cli's modules or its subpackages
(function-local imports included), and the root package holds only the shared foundations."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import house_figures  # noqa: E402  (a script of the repository)
import import_cycles  # noqa: E402

ROOT_MODULES = {"__init__", "__main__", "app", "etcd", "extras", "heap", "interfaces", "kvkeys",
                "output", "registry", "signals"}


def test_no_module_import_cycle() -> None:
    _, cycles = import_cycles.cycles(REPO / "mooncake_cli")
    assert [c.modules for c in cycles] == []


def test_no_package_import_cycle() -> None:
    assert house_figures.package_cycles(REPO / "mooncake_cli") == []


def test_the_root_package_holds_only_the_foundations() -> None:
    assert {p.stem for p in (REPO / "mooncake_cli").glob("*.py")} == ROOT_MODULES


def test_no_test_sleeps_to_order_events() -> None:
    """Every sleep in the tests says why: `# sleep: behaviour|poll|pace` (ordering_sleeps.py)."""
    assert house_figures.ordering_sleep_count(REPO) == 0
