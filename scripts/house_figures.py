#!/usr/bin/env python3
"""The house's figures (issue 41), for any checkout: what a maintainer walks into.

    python3 scripts/house_figures.py                 # this checkout, a table
    python3 scripts/house_figures.py --repo /tmp/old --json

- root modules: the .py files directly in mooncake_cli/ (__init__ and __main__ included);
- module cycles: strongly connected components of more than one module in mooncake_cli's import
  graph, function-local imports included (scripts/import_cycles.py);
- package cycles: the same over mooncake_cli's subpackages (worker -> conductor is an edge when
  any module of worker imports any module of conductor; the root package's modules are nodes);
- largest module: the longest .py file under mooncake_cli/ and backends/, in lines, and how many
  are over 250 lines;
- duplicates: the pairs the workplace's `duplicates` command lists for the whole checkout (left
  out when that command is not on PATH);
- ordering sleeps: sleeps in the tests that nothing marks as behaviour, polling or pacing
  (scripts/ordering_sleeps.py; counted with this checkout's script, over --repo's tests).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import import_cycles  # noqa: E402  (a sibling script)
import ordering_sleeps  # noqa: E402


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def package_cycles(root: Path) -> list[list[str]]:
    modules = import_cycles.module_names(root)
    edges = {import_cycles.Edge(_package(e.source), _package(e.target), 0)
             for n, p in modules.items() for e in import_cycles.edges_of(n, p, modules)
             if _package(e.source) != _package(e.target)}
    nodes = sorted({_package(m) for m in modules})
    ordered = sorted(edges, key=lambda e: (e.source, e.target))
    return [c for c in import_cycles.components(nodes, ordered) if len(c) > 1]


def module_sizes(repo: Path) -> list[tuple[str, int]]:
    return [(str(p.relative_to(repo)), len(p.read_text(encoding="utf-8").splitlines()))
            for d in ("mooncake_cli", "backends") for p in (repo / d).rglob("*.py")]


def duplicate_pairs(repo: Path) -> int | None:
    if shutil.which("duplicates") is None:
        return None
    out = subprocess.run(["duplicates", "--repo", str(repo), "--seconds", "300", "--most", "1"],
                         capture_output=True, text=True, check=False).stdout
    m = re.match(r"(\d+) pairs", out)
    return int(m.group(1)) if m else 0


def ordering_sleep_count(repo: Path) -> int:
    return sum(1 for f in ordering_sleeps.test_files(repo)
               for s in ordering_sleeps.sleeps_in(f, repo) if s.mark is None)


def figures(repo: Path) -> dict[str, object]:
    pkg = repo / "mooncake_cli"
    parsed, module_cycles = import_cycles.cycles(pkg)
    sizes = module_sizes(repo)
    name, lines = max(sizes, key=lambda s: s[1])
    return {
        "repo": str(repo),
        "root_modules": len(list(pkg.glob("*.py"))),
        "modules": parsed,
        "module_cycles": [c.modules for c in module_cycles],
        "package_cycles": package_cycles(pkg),
        "largest_module": {"path": name, "lines": lines},
        "modules_over_250_lines": sum(1 for _, n in sizes if n > 250),
        "duplicate_pairs": duplicate_pairs(repo),
        "ordering_sleeps": ordering_sleep_count(repo),
        "test_files": len(list((repo / "tests").rglob("test_*.py"))),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=HERE.parent, help="the checkout to measure")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    f = figures(args.repo.resolve())
    if args.json:
        print(json.dumps(f, indent=1))
        return 0
    largest_module = f["largest_module"]
    assert isinstance(largest_module, dict)
    rows = [("modules in the root package", f["root_modules"]),
            ("modules in mooncake_cli", f["modules"]),
            ("module import cycles", len(f["module_cycles"])),  # type: ignore[arg-type]
            ("package import cycles", len(f["package_cycles"])),  # type: ignore[arg-type]
            ("largest module", f"{largest_module['path']} ({largest_module['lines']} lines)"),
            ("modules over 250 lines", f["modules_over_250_lines"]),
            ("duplicated pairs (duplicates)", f["duplicate_pairs"]),
            ("tests that sleep for ordering", f["ordering_sleeps"]),
            ("test files", f["test_files"])]
    for label, value in rows:
        print(f"{label:32} {value}")
    for c in f["module_cycles"] + f["package_cycles"]:  # type: ignore[operator]
        print("  cycle:", " <-> ".join(c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
