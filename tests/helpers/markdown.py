"""What the docs check reads out of a Markdown file: fenced blocks (with the `<!-- needs: ... -->`
marker before each), links, headings as GitHub anchors them, inline code spans, and the commands
of a shell block. Plain line scanning: the docs keep to fences, inline links and ATX headings."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
NEEDS = re.compile(r"^\s*<!--\s*needs:\s*([\w\s,-]+?)\s*-->\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"", re.I)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
REDIRECT = re.compile(r"\s\d?(?:>>?|<)&?\s*[^\s;&|]+")
SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, body, first line (1-based) and marker reasons."""
    path: Path
    line: int
    lang: str
    body: str
    needs: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


@dataclass(frozen=True)
class Prose:
    """A line outside fences, with its number."""
    line: int
    text: str


def scan(path: Path) -> tuple[list[Block], list[Prose]]:
    """The fenced blocks and the other lines of `path`."""
    blocks: list[Block] = []
    prose: list[Prose] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append(Prose(i + 1, lines[i]))
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3).lower(), i
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        before = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        marker = NEEDS.match(before)
        needs = tuple(r.strip() for r in marker.group(1).split(",")) if marker else ()
        blocks.append(Block(path, start + 1, lang, "\n".join(lines[start + 1:j]), needs))
        i = j + 1
    return blocks, prose


def without_code_spans(text: str) -> str:
    return CODE_SPAN.sub("", text)


def links(prose: list[Prose]) -> Iterator[tuple[int, str]]:
    """(line, target) of every Markdown and HTML link and image outside code."""
    for p in prose:
        text = without_code_spans(p.text)
        for m in LINK.finditer(text):
            yield p.line, m.group(1)
        for m in HTML_LINK.finditer(text):
            yield p.line, m.group(1)


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of `path` (duplicates get -1, -2, ...)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for p in scan(path)[1]:
        m = HEADING.match(p.text)
        if not m:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2))
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def code_spans(prose: list[Prose]) -> Iterator[tuple[int, str]]:
    """(line, text) of every inline code span outside fences."""
    for p in prose:
        for m in CODE_SPAN.finditer(p.text):
            yield p.line, m.group(2).strip()


def commands(body: str) -> Iterator[list[str]]:
    """Each simple command of a shell block as its words: continuation lines joined, comments,
    heredoc bodies and redirections dropped, split at `&&`, `||`, `;`, `|` and `&`."""
    lines = iter(body.splitlines())
    for raw in lines:
        line = raw
        while line.endswith("\\"):
            line = line[:-1] + " " + next(lines, "")
        doc = HEREDOC.search(line)
        if doc:
            for rest in lines:
                if rest.strip() == doc.group(1):
                    break
            line = line[:doc.start()]
        yield from split(REDIRECT.sub(" ", " " + line))


def split(line: str) -> Iterator[list[str]]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    for token in lexer:
        if token in SEPARATORS:
            if words:
                yield words
            words = []
        else:
            words.append(token)
    if words:
        yield words


def program(words: list[str]) -> list[str]:
    """`words` without leading VAR=value assignments (and `export`/`env`)."""
    i = 0
    while i < len(words) and (re.match(r"^\w+=", words[i]) or words[i] in ("env", "export")):
        i += 1
    return words[i:]
