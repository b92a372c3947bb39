"""What the man pages read off the `mooncake` command tree: commands, synopses, options and
the prose examples checked against the options that really exist."""

from __future__ import annotations

import enum
import inspect
import shlex
from collections.abc import Iterator
from typing import Any

import typer
import typer.core
import typer.main

from tools.manpage.prose import METAVARS, PROSE
from tools.manpage.roff import bold, esc, ital

PROG = "mooncake"


def root_command() -> Any:
    from mooncake_cli.app import app

    return typer.main.get_command(app)


def subcommands(cmd: Any, ctx: Any) -> list[tuple[str, Any]]:
    if not hasattr(cmd, "commands"):
        return []
    return [(n, cmd.commands[n]) for n in cmd.list_commands(ctx) if not cmd.commands[n].hidden]


def walk(cmd: Any, path: tuple[str, ...] = (PROG,),
         parent: Any = None) -> Iterator[tuple[tuple[str, ...], Any, Any]]:
    """Yield (path, command, context) for every command, root first, depth first."""
    ctx = typer.Context(cmd, info_name=path[-1], parent=parent)
    yield path, cmd, ctx
    for name, sub in subcommands(cmd, ctx):
        yield from walk(sub, path + (name,), ctx)


def is_argument(p: Any) -> bool:
    return isinstance(p, typer.core.TyperArgument) or not str(p.opts[0]).startswith("-")


def visible_params(cmd: Any) -> list[Any]:
    return [p for p in cmd.params if not getattr(p, "hidden", False)]


def choices(p: Any) -> list[str]:
    kind = getattr(getattr(p, "type_descriptor", None), "annotation", None)
    if inspect.isclass(kind) and issubclass(kind, enum.Enum):
        return [str(e.value) for e in kind]
    return [str(c) for c in getattr(getattr(p, "type", None), "choices", None) or []]


def metavar(p: Any) -> str:
    if p.metavar:
        return str(p.metavar)
    if choices(p):
        return "{" + "|".join(choices(p)) + "}"
    return METAVARS.get(p.name, p.name.upper().replace("_", "-"))


def option_words(p: Any) -> str:
    """Roff for `-o, --output FILE` (flags take no value)."""
    names = ", ".join(bold(o) for o in [*p.opts, *p.secondary_opts])
    return names if p.is_flag else f"{names} {ital(metavar(p))}"


def default_text(p: Any) -> str | None:
    d = p.default
    if p.required or d is None or callable(d) or d == () or getattr(p, "is_flag", False):
        return None
    if isinstance(d, enum.Enum):
        d = d.value
    return str(d)


def synopsis(path: tuple[str, ...], cmd: Any) -> list[str]:
    words = [bold(PROG), f"[{ital('GLOBAL OPTIONS')}]"]
    if len(path) > 1:
        words.append(bold(" ".join(path[1:])))
    if hasattr(cmd, "commands"):
        own = len(path) > 1 and visible_params(cmd)
        words.append(f"[{ital('OPTIONS')}] {ital('COMMAND')} [{ital('COMMAND OPTIONS')}]" if own
                     else f"{ital('COMMAND')} [{ital('OPTIONS')}]")
        return [".PP", *words]
    params = visible_params(cmd)
    if any(not is_argument(p) and not p.required for p in params):
        words.append(f"[{ital('OPTIONS')}]")
    for p in params:
        if not is_argument(p) and p.required:
            words.append(f"{bold(p.opts[0])} {ital(metavar(p))}")
    for p in params:
        if is_argument(p):
            name = ital(metavar(p))
            words.append(name if p.required else f"[{name}]")
    return [".PP", *words]


def options_list(params: list[Any]) -> list[str]:
    lines: list[str] = []
    for p in params:
        lines += [".TP", ital(metavar(p)) if is_argument(p) else option_words(p)]
        text = " ".join((getattr(p, "help", None) or "").split())
        extra = []
        if choices(p):
            extra.append("One of: " + ", ".join(choices(p)) + ".")
        if default_text(p) is not None:
            extra.append(f"Default: {default_text(p)}.")
        if p.envvar:
            envs = [p.envvar] if isinstance(p.envvar, str) else list(p.envvar)
            extra.append("Environment: " + ", ".join(envs) + ".")
        if p.required and not is_argument(p):
            extra.append("Required.")
        lines.append(esc(" ".join([text, *extra]).strip() or "(undocumented)"))
    return lines


def option_names(cmd: Any) -> dict[str, Any]:
    return {o: p for p in cmd.params if not is_argument(p) for o in [*p.opts, *p.secondary_opts]}


def check_examples(root: Any, key: str) -> list[tuple[str | None, str]]:
    """The examples of PROSE[key] whose command is registered; ValueError for an unknown option.

    An example with no description continues the one before it and is dropped with it."""
    kept: list[tuple[str | None, str]] = []
    dropped = False
    global_opts = option_names(root)
    for what, line in PROSE.get(key, {}).get("examples", []):
        words = shlex.split(line)
        while words and "=" in words[0] and not words[0].startswith("-"):
            words.pop(0)  # VAR=value prefixes
        if not words or words[0] != PROG:
            raise ValueError(f"man page example '{line}' does not run {PROG}")
        i = 1
        while i < len(words) and words[i].startswith("-"):
            opt = global_opts.get(words[i])
            if opt is None:
                raise ValueError(f"man page example '{line}' uses unknown option {words[i]}")
            i += 1 if opt.is_flag else 2
        cmd = root
        while hasattr(cmd, "commands") and i < len(words) and words[i] in cmd.commands:
            cmd, i = cmd.commands[words[i]], i + 1
        if hasattr(cmd, "commands") or (what is None and dropped):
            dropped = True  # not registered (yet): leave it out
            continue
        dropped = False
        known = option_names(cmd)
        for w in words[i:]:
            if w.startswith("-") and w != "-" and w.split("=")[0] not in known:
                raise ValueError(f"man page example '{line}' uses unknown option {w}")
        kept.append((what, line))
    return kept
