"""The docs are checked: README.md and docs/*.md.

Shell blocks (```sh, bash, shell, console) are of two kinds:

* Run: a block without a marker runs whole under `bash -e -o pipefail` in a fresh temporary
  directory, `mooncake` being the CLI of the interpreter running the tests; it must exit 0.
  All such blocks start at once; keep them quick (`mooncake models`, `mooncake doctor`, ...).
* Not run: an HTML comment on the line before the fence names what the block needs,
  one or more of NEEDS, comma-separated:

      <!-- needs: server -->
      ```sh
      mooncake conductor start --local 1,1 --model smollm2-135m
      ```

  Such a block is not run (and not skipped: its other checks still pass or fail), and the
  blocks not run are counted per reason (`python -m tests.integration.test_docs` prints the count).

Every `mooncake ...` command, in any shell block and in inline code spans, is parsed by the
CLI's own parser without running: its subcommands and options must exist and its values
convert (a span in the prose may leave out required arguments). Python blocks must compile;
json and toml blocks must parse. Every relative link resolves to a file of the repository
and every #anchor to a heading of its target; no link, and no text, points at a path of one
machine (an absolute path, ../shared).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
import typer.main

from mooncake_cli.app import app, hoist_global_flags
from tests.helpers import markdown as md

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL = {"sh", "bash", "shell", "console"}
NEEDS = {
    "server": "starts or talks to long-running roles (a cluster, a store master, a target)",
    "gpu": "needs a GPU",
    "rdma": "needs RDMA NICs",
    "hosts": "runs across several hosts (their addresses, an etcd cluster)",
    "install": "installs software or downloads",
    "long": "runs for minutes (a whole benchmark)",
    "root": "needs root (network namespaces: the testbed)",
}
RUN_TIMEOUT = 50.0  # seconds the runnable blocks, run at once, may take
LOCAL_PATH = re.compile(r"(?<![\w.~-])(/work/|/check/|/root/|/tmp/h\d|\.\./shared/)")
ROOT = typer.main.get_command(app)


def blocks() -> list[md.Block]:
    return [b for path in DOCS for b in md.scan(path)[0]]


def shell_blocks() -> list[md.Block]:
    return [b for b in blocks() if b.lang in SHELL]


def inventory() -> Counter[str]:
    """Shell blocks run, and not run per reason (a block with two reasons counts under both)."""
    count: Counter[str] = Counter()
    for b in shell_blocks():
        count.update(b.needs or ["run"])
    return count


def parse(argv: list[str]) -> list[str]:
    """The command path `argv` names, parsed as `mooncake` would parse it, nothing run; a
    typer/click usage error when a command or option does not exist or a value is wrong."""
    ctx = ROOT.make_context("mooncake", hoist_global_flags(list(argv)))
    cmd, path = ROOT, ["mooncake"]
    while hasattr(cmd, "resolve_command"):
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            break
        name, cmd, rest = cmd.resolve_command(ctx, rest)
        ctx = cmd.make_context(name, rest, parent=ctx)
        path.append(name)
    return path


def mooncake_commands() -> Iterator[tuple[str, list[str], bool]]:
    """(where, argv after `mooncake`, complete?) of every mooncake command in the docs."""
    for b in shell_blocks():
        for words in md.commands(b.body):
            words = md.program(words)
            if words and words[0] == "mooncake":
                yield b.where, words[1:], True
    for path in DOCS:
        for line, span in md.code_spans(md.scan(path)[1]):
            if span.startswith("mooncake ") and "..." not in span and "|" not in span:
                for words in md.split(span):
                    yield f"{path.name}:{line}", words[1:], False


def test_the_docs_exist_and_each_shell_block_is_run_or_says_why_not() -> None:
    assert (REPO / "docs").is_dir() and len(DOCS) > 1
    wrong = [f"{b.where}: needs {r!r}" for b in shell_blocks() for r in b.needs if r not in NEEDS]
    assert not wrong, f"unknown reasons (known: {', '.join(NEEDS)}): {wrong}"
    assert inventory()["run"] > 0


def test_the_set_up_commands_are_the_ones_ci_runs() -> None:
    """README's two set-up commands are what .ci/run runs first, on a clean clone."""
    blocks, prose = md.scan(REPO / "README.md")
    heading = next(p.line for p in prose if p.text.strip() == "## Set up")
    setup = next(b for b in blocks if b.line > heading and b.lang in SHELL)
    ci = [w for w in md.commands((REPO / ".ci" / "run").read_text(encoding="utf-8"))
          if w[0] not in ("set", "cd")]
    ours = list(md.commands(setup.body))
    assert len(ours) == 2 and ci[:2] == ours, f"README: {ours}; .ci/run: {ci[:2]}"


def test_every_mooncake_command_parses() -> None:
    bad: list[str] = []
    checked = 0
    for where, argv, complete in mooncake_commands():
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                parse(argv)
        except typer.Exit:  # --help or --version: nothing run
            pass
        except typer.TyperException as e:  # a span may name a group or leave arguments out
            if complete or type(e).__name__ not in ("MissingParameter", "NoArgsIsHelpError"):
                bad.append(f"{where}: mooncake {' '.join(argv)}: {e}")
        checked += 1
    assert checked > 20
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("argv", [["storx"], ["store", "master", "--no-such-flag"],
                                  ["store", "master", "--port", "many"], ["transfer", "read"]])
def test_the_parser_refuses_what_the_cli_refuses(argv: list[str]) -> None:
    with pytest.raises(typer.TyperException):
        parse(argv)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """Every runnable block started at once (each in its own directory), by where it is; the
    `mooncake` they call is this interpreter's CLI of this tree."""
    bindir = tmp_path_factory.mktemp("bin")
    shim = bindir / "mooncake"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m mooncake_cli "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    started = {b.where: subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", b.body],
                                         cwd=tmp_path_factory.mktemp("block"), env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True)
               for b in shell_blocks() if not b.needs}
    yield started
    for p in started.values():
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("block", [b for b in shell_blocks() if not b.needs],
                         ids=lambda b: b.where)
def test_runnable_blocks_run(block: md.Block, runs: dict[str, subprocess.Popen[str]]) -> None:
    out, _ = runs[block.where].communicate(timeout=RUN_TIMEOUT)
    code = runs[block.where].returncode
    assert code == 0, f"{block.where} exited {code}:\n{out}"


def test_code_blocks_parse() -> None:
    bad: list[str] = []
    for b in blocks():
        try:
            if b.lang == "python":
                ast.parse(b.body)
            elif b.lang == "json":
                json.loads(b.body)
            elif b.lang == "toml":
                tomllib.loads(b.body)
        except (SyntaxError, ValueError) as e:
            bad.append(f"{b.where} ({b.lang}): {e}")
    assert not bad, "\n".join(bad)


def test_links_resolve() -> None:
    bad: list[str] = []
    for path in DOCS:
        for line, target in md.links(md.scan(path)[1]):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) and not target.startswith("file:"):
                continue  # https:, mailto: ...
            where = f"{path.name}:{line}: {target}"
            if target.startswith(("/", "file:")):
                bad.append(f"{where}: an absolute path on one machine")
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists() or REPO not in (dest, *dest.parents):
                bad.append(f"{where}: no such file in the repository")
            elif anchor and (dest.suffix != ".md" or anchor not in md.anchors(dest)):
                bad.append(f"{where}: no heading #{anchor} in {dest.name}")
    assert not bad, "\n".join(bad)


CODE_PATH = re.compile(r"`((?:mooncake_cli|backends|tests|plugins|scripts|tools)/[\w/.-]+\.py)`")
DOTTED = re.compile(r"\b(mooncake_cli(?:\.\w+)+)")


def _module_exists(dotted: str) -> bool:
    """Some prefix of `dotted` is a module or package of the repository (the rest: names in it)."""
    parts = dotted.split(".")
    return any((REPO.joinpath(*parts[:i]).with_suffix(".py")).exists()
               or REPO.joinpath(*parts[:i], "__init__.py").exists()
               for i in range(len(parts), 1, -1))


def test_named_code_exists() -> None:
    """A file path in backticks or a dotted mooncake_cli module the docs name is in the tree:
    a move that leaves the docs behind fails here."""
    bad: list[str] = []
    for path in DOCS:
        for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            bad += [f"{path.name}:{n}: {m.group(1)}" for m in CODE_PATH.finditer(text)
                    if not (REPO / m.group(1)).exists()]
            bad += [f"{path.name}:{n}: {m.group(1)}" for m in DOTTED.finditer(text)
                    if not _module_exists(m.group(1))]
    assert not bad, "\n".join(bad)


def test_no_paths_of_one_machine() -> None:
    bad = [f"{path.name}:{n}: {m.group(1)}"
           for path in DOCS
           for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
           for m in LOCAL_PATH.finditer(text)]
    assert not bad, "\n".join(bad)


if __name__ == "__main__":
    for reason, n in sorted(inventory().items()):
        print(f"{n:4d}  {reason}: {NEEDS.get(reason, 'run by tests/integration/test_docs.py')}")
