#!/usr/bin/env python3
"""Import cycles among one package's modules: strongly connected components of its import graph.

    python3 scripts/import_cycles.py                 # mooncake_cli, text
    python3 scripts/import_cycles.py --json          # the same as one JSON object
    python3 scripts/import_cycles.py --root backends/mooncake_backends

Every module under the root is parsed with ast (nothing is imported). Every import counts,
function-local ones included, except those under `if TYPE_CHECKING:` (they never run).
`import a.b` is an edge to a.b; `from a import b` is an edge to the module a.b where that is a
module of the package, else to a; relative imports are resolved against the importer's package.
An edge to a module does not add edges to its parent packages' __init__. Components of more than
one module are printed with the edges inside them; the exit status is 1 if there is any.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file for every module under the package directory `root`."""
    base = root.parent
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement at any depth, skipping the body of `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def edges_of(name: str, path: Path, modules: dict[str, Path]) -> Iterator[Edge]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield Edge(name, alias.name, node.lineno)
            continue
        base = node.module or ""
        if node.level:
            package = _package_of(name, path).split(".")
            anchor = package[: len(package) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            if sub in modules:
                yield Edge(name, sub, node.lineno)
            elif base in modules:
                yield Edge(name, base, node.lineno)


def components(nodes: list[str], edges: list[Edge]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for e in edges:
        succ[e.source].append(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(succ[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(succ[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


@dataclass(frozen=True)
class Cycle:
    modules: list[str]
    edges: list[Edge]

    def as_json(self) -> dict[str, object]:
        return {"modules": self.modules,
                "edges": [{"from": e.source, "to": e.target, "line": e.line} for e in self.edges]}


def cycles(root: Path) -> tuple[int, list[Cycle]]:
    """(modules parsed, one cycle per component of more than one module)."""
    modules = module_names(root)
    edges = {e for n, p in modules.items() for e in edges_of(n, p, modules) if e.source != e.target}
    found = []
    for members in components(sorted(modules), sorted(edges, key=_order)):
        if len(members) > 1:
            inside = set(members)
            found.append(Cycle(members, sorted(
                (e for e in edges if e.source in inside and e.target in inside), key=_order)))
    return len(modules), sorted(found, key=lambda c: c.modules)


def _order(e: Edge) -> tuple[str, int, str]:
    return e.source, e.line, e.target


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).parent.parent / "mooncake_cli",
                        help="the package directory (default: mooncake_cli)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    count, found = cycles(args.root)
    if args.json:
        print(json.dumps({"root": str(args.root), "modules": count, "cycles": len(found),
                          "components": [c.as_json() for c in found]}, indent=1))
    else:
        for c in found:
            print(f"cycle of {len(c.modules)}: " + " ".join(c.modules))
            for e in c.edges:
                print(f"  {e.source}:{e.line} -> {e.target}")
        print(f"{len(found)} import cycles among {count} modules under {args.root}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
