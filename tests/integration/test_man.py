"""Man pages: every command and option of the CLI is documented in the right page, the committed
pages are exactly what the generator makes of the CLI now, and each page renders with man(1).

The command tree is walked here independently of the generator, so a page the generator got
wrong fails too. Regenerate the pages with `python -m tools.manpage`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main

from mooncake_cli.app import app
from tools import manpage

REPO = Path(__file__).resolve().parents[2]
MAN = REPO / "man"
PROG = "mooncake"


# -- the CLI, walked without the generator ----------------------------------------------------
def _children(cmd: Any) -> list[tuple[str, Any]]:
    commands = getattr(cmd, "commands", None) or {}
    return [(n, c) for n, c in sorted(commands.items()) if not getattr(c, "hidden", False)]


def _tree(cmd: Any, path: tuple[str, ...] = (PROG,)) -> list[tuple[tuple[str, ...], Any]]:
    out = [(path, cmd)]
    for name, sub in _children(cmd):
        out += _tree(sub, path + (name,))
    return out


def _options(cmd: Any) -> list[str]:
    names = []
    for p in cmd.params:
        if getattr(p, "hidden", False) or not str(p.opts[0]).startswith("-"):
            continue
        names += [*p.opts, *p.secondary_opts]
    return names


ROOT = typer.main.get_command(app)
TREE = _tree(ROOT)
OPTION_CASES = [(path, opt) for path, cmd in TREE for opt in _options(cmd)]


def _page_name(path: tuple[str, ...]) -> str:
    return f"{PROG}.1" if len(path) == 1 else f"{PROG}-{path[1]}.1"


# -- reading roff -----------------------------------------------------------------------------
def plain(roff: str) -> str:
    """The text of roff source with its escapes undone (fonts, dashes, quotes)."""
    text = re.sub(r"\\f[BIRP]", "", roff)
    return (text.replace("\\-", "-").replace("\\&", "").replace("\\(dq", '"')
            .replace("\\e", "\\"))


def _read(name: str) -> str:
    path = MAN / name
    assert path.is_file(), f"{path} is missing: run python -m tools.manpage"
    return path.read_text(encoding="utf-8")


def _sections(roff: str, macro: str) -> dict[str, str]:
    """{heading: plain body} for every `.SH` or `.SS` heading of a page."""
    out: dict[str, str] = {}
    heading, body = "", []
    for line in roff.splitlines():
        if line.startswith((f".{macro} ", ".SH ")):
            if heading:
                out[heading] = plain("\n".join(body))
            heading = plain(line.split(" ", 1)[1]).strip().strip('"') \
                if line.startswith(f".{macro} ") else ""
            body = []
        else:
            body.append(line)
    if heading:
        out[heading] = plain("\n".join(body))
    return out


def _documentation_of(path: tuple[str, ...]) -> str:
    """The part of the right page that documents `path`: its .SS section for a subcommand,
    the GLOBAL OPTIONS of mooncake(1) for the root, the whole page for a top-level command."""
    roff = _read(_page_name(path))
    if len(path) == 1:
        return _sections(roff, "SH")["GLOBAL OPTIONS"]
    if len(path) == 2:
        return plain(roff)
    subs = _sections(roff, "SS")
    key = " ".join(path)
    assert key in subs, f"{_page_name(path)} has no section for `{key}` (has: {sorted(subs)})"
    return subs[key]


def _mentions(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


# -- coverage ---------------------------------------------------------------------------------
def test_one_page_per_top_level_command() -> None:
    expected = {f"{PROG}.1"} | {f"{PROG}-{n}.1" for n, _ in _children(ROOT)}
    assert {"mooncake.1", "mooncake-transfer.1", "mooncake-bench.1",
            "mooncake-plugins.1"} <= expected
    assert {p.name for p in MAN.glob(f"{PROG}*.1")} == expected


@pytest.mark.parametrize("path", [p for p, _ in TREE], ids=lambda p: " ".join(p))
def test_every_command_is_documented(path: tuple[str, ...]) -> None:
    roff = _read(_page_name(path))
    title = "-".join(path[:2])
    assert re.search(rf"^\.TH {re.escape(title.upper())} 1 ", roff, re.M), title
    assert _mentions(plain(roff), title), title  # mooncake(1) names itself too
    if len(path) == 2:  # listed on mooncake(1)
        assert _mentions(_sections(_read(f"{PROG}.1"), "SH")["COMMANDS"], path[1])
    doc = _documentation_of(path)
    cmd = dict(TREE)[path]
    summary = " ".join((cmd.help or "").split()).split(". ")[0].rstrip(".")
    if len(path) > 2:  # a subcommand's section carries its docstring and its synopsis
        assert summary in " ".join(doc.split()), f"docstring of `{' '.join(path)}` missing"
        assert " ".join(path[1:]) in doc


@pytest.mark.parametrize("path,option", OPTION_CASES,
                         ids=[f"{' '.join(p)} {o}" for p, o in OPTION_CASES])
def test_every_option_is_documented(path: tuple[str, ...], option: str) -> None:
    doc = _documentation_of(path)
    assert _mentions(doc, option), (
        f"{option} of `{' '.join(path)}` is missing from {_page_name(path)}: run "
        "python -m tools.manpage")
    param = next(p for p in dict(TREE)[path].params if option in [*p.opts, *p.secondary_opts])
    if getattr(param, "help", None):  # and with its help text
        assert " ".join(param.help.split()) in " ".join(doc.split())


def test_root_page_covers_environment_exit_codes_and_config_file() -> None:
    from mooncake_cli.app import EXIT_CODES
    from mooncake_cli.config import TABLES, TransferConfig

    sections = _sections(_read(f"{PROG}.1"), "SH")
    env = sections["ENVIRONMENT"]
    for var in ("MOONCAKE_PLUGINS", "MOONCAKE_SECRET", "MOONCAKE_<TABLE>_<FIELD>"):
        assert var in env
    status = sections["EXIT STATUS"]
    for _kind, code in EXIT_CODES:
        assert re.search(rf"^{code}$", status, re.M), f"exit status {code} undocumented"
    files = sections["FILES"]
    assert "[transfer]" in files and "--config" in files
    for field in TransferConfig.__dataclass_fields__:
        assert _mentions(files, field.replace("_", "-")), field
        assert f"MOONCAKE_TRANSFER_{field.upper()}" in files
    for table in TABLES:  # every role's table, with its own environment variables
        assert f"[{table}]" in files, table
        assert f"MOONCAKE_{table.upper()}_" in files, table
    assert "--help" in sections["GLOBAL OPTIONS"]
    assert "SEE ALSO" in sections and "mooncake-transfer(1)" in sections["SEE ALSO"]


def test_examples_only_use_real_commands_and_options() -> None:
    for key in manpage.PROSE:
        manpage.check_examples(ROOT, key)  # raises on an unknown option
    with pytest.raises(ValueError, match="--no-such-flag"):
        manpage.PROSE["plugins"]["examples"].append((None, "mooncake plugins --no-such-flag"))
        try:
            manpage.check_examples(ROOT, "plugins")
        finally:
            manpage.PROSE["plugins"]["examples"].pop()


# -- freshness --------------------------------------------------------------------------------
def test_committed_pages_are_up_to_date() -> None:
    r = subprocess.run([sys.executable, "-m", "tools.manpage", "--check",
                        "--out", str(MAN)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, f"man pages are out of date:\n{r.stderr}"


def test_check_lists_stale_pages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert manpage.main(["--out", str(tmp_path)]) == 0
    assert manpage.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "mooncake-transfer.1").write_text("stale\n")
    (tmp_path / "mooncake-gone.1").write_text(manpage.GENERATED + "\nold\n")
    (tmp_path / "mooncake-hand.1").write_text(".TH HAND 1\n")  # not ours: left alone
    (tmp_path / "mooncake-plugins.1").unlink()
    capsys.readouterr()
    assert manpage.main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    for name in ("mooncake-transfer.1", "mooncake-plugins.1", "mooncake-gone.1"):
        assert name in err
    assert "mooncake.1" not in err.replace("mooncake-", "") and "hand" not in err
    assert manpage.main(["--out", str(tmp_path)]) == 0  # one command brings it all up to date
    assert manpage.main(["--check", "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "mooncake-gone.1").exists() and (tmp_path / "mooncake-hand.1").exists()


def test_generation_is_deterministic() -> None:
    assert manpage.render() == manpage.render()


# -- rendering --------------------------------------------------------------------------------
def _man_available() -> bool:
    return shutil.which("man") is not None and shutil.which("groff") is not None


@pytest.mark.skipif(not _man_available(), reason="man and groff are not installed "
                    "(apt-get install groff-base man-db)")
@pytest.mark.parametrize("name", sorted({_page_name(p) for p, _ in TREE}))
def test_page_renders_with_man(name: str) -> None:
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "MANWIDTH": "100", "MANPAGER": "cat",
           "PAGER": "cat"}
    env.pop("MAN_KEEP_FORMATTING", None)
    r = subprocess.run(["man", "--warnings", "-l", str(MAN / name)], capture_output=True,
                       text=True, env=env, timeout=60)
    if "minimized" in r.stdout + r.stderr:  # Debian's stub man of minimized images
        pytest.skip("man is the minimized-image stub")
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == "", f"roff warnings in {name}:\n{r.stderr}"
    text = r.stdout
    for heading in ("NAME", "SYNOPSIS", "DESCRIPTION"):
        assert re.search(rf"^{heading}$", text, re.M), f"{name} lacks {heading}"
    for path, opt in OPTION_CASES:  # the options survive rendering, dashes and all
        if _page_name(path) == name:
            assert _mentions(text, opt), f"{opt} does not render in {name}"
