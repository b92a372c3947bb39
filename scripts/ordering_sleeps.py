#!/usr/bin/env python3
"""Sleeps in the tests that nothing marks as legitimate: the figure "tests that sleep for
ordering" (goal 0).

    python3 scripts/ordering_sleeps.py           # one line per unmarked sleep, then the counts
    python3 scripts/ordering_sleeps.py --json    # the same as one JSON object
    python3 scripts/ordering_sleeps.py --all     # the marked ones too

Every .py file under tests/ and plugins/*/tests/ is parsed with ast (nothing is imported). A
sleep is a call of a name or attribute `sleep` (time.sleep, asyncio.sleep, a bare `sleep`
imported from either). A sleep is marked when a line of its call carries a comment
`# sleep: KIND ...` with KIND one of MARKS; any other sleep is counted. The exit status is 1 if
any is counted. Sleeps in code the tests hand to a child as a string are not calls and are not
seen.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import sys
import tokenize
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKS = {
    "behaviour": "the sleep is what the test exercises (a client that stalls to trip a "
                 "server's timeout, a lease or TTL that must run out in real time)",
    "poll": "the interval of a loop that waits on observable state under a deadline",
    "pace": "spacing of a load or a stand-in's work, not an order the test relies on",
}
MARK = re.compile(r"#\s*sleep:\s*(\w+)")


@dataclass(frozen=True)
class Sleep:
    path: str
    line: int
    call: str
    mark: str | None  # the KIND of its `# sleep:` comment, None when unmarked


def test_files(root: Path) -> list[Path]:
    files = sorted((root / "tests").rglob("*.py"))
    for tests in sorted(root.glob("plugins/*/tests")):
        files += sorted(tests.rglob("*.py"))
    return files


def marks_by_line(source: str) -> dict[int, str]:
    """Line -> the KIND of a `# sleep: KIND` comment on it (KIND in MARKS only)."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and (m := MARK.search(tok.string)) and m[1] in MARKS:
            found[tok.start[0]] = m[1]
    return found


def sleeps_in(path: Path, root: Path) -> list[Sleep]:
    source = path.read_text(encoding="utf-8")
    marks = marks_by_line(source)
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else (
            func.attr if isinstance(func, ast.Attribute) else "")
        if name != "sleep":
            continue
        last = node.end_lineno or node.lineno
        mark = next((marks[n] for n in range(node.lineno, last + 1) if n in marks), None)
        found.append(Sleep(str(path.relative_to(root)), node.lineno, ast.unparse(node), mark))
    return sorted(found, key=lambda s: s.line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object")
    ap.add_argument("--all", action="store_true", help="list the marked sleeps too")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    every = [s for f in test_files(root) for s in sleeps_in(f, root)]
    unmarked = [s for s in every if s.mark is None]
    marked = {k: sum(1 for s in every if s.mark == k) for k in MARKS}
    shown = every if args.all else unmarked
    if args.json:
        print(json.dumps({"ordering_sleeps": len(unmarked), "marked": marked,
                          "sleeps": [asdict(s) for s in shown]}, indent=1))
    else:
        for s in shown:
            print(f"{s.path}:{s.line}: {s.call}" + (f"  [{s.mark}]" if s.mark else ""))
        print(f"unmarked sleeps: {len(unmarked)}; marked: "
              + ", ".join(f"{k} {n}" for k, n in marked.items()))
    return 1 if unmarked else 0


if __name__ == "__main__":
    sys.exit(main())
