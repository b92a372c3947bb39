"""Roff building blocks for the generated man pages: escaping, fonts, paragraphs, examples."""

from __future__ import annotations


def esc(text: str) -> str:
    """Escape text for roff: backslashes, dashes, and control characters at line starts."""
    text = str(text).replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + ln if ln.startswith((".", "'")) else ln for ln in text.split("\n"))


def quote(text: str) -> str:
    return '"' + esc(text).replace('"', "\\(dq") + '"'


def bold(text: str) -> str:
    return f"\\fB{esc(text)}\\fR"


def ital(text: str) -> str:
    return f"\\fI{esc(text)}\\fR"


def paragraphs(texts: list[str]) -> list[str]:
    lines: list[str] = []
    for t in texts:
        lines += [".PP", esc(" ".join(t.split()))]
    return lines


def example_block(examples: list[tuple[str | None, str]]) -> list[str]:
    lines: list[str] = []
    for what, cmd in examples:
        if what or not lines:
            lines += [".PP", esc(what or ""), ".RS 4", ".nf", ".fi", ".RE"]
        lines[-2:-2] = [esc(cmd)]  # inside the open .nf block
    return [ln for ln in lines if ln]
