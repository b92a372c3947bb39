"""Chat prompts: the model's own chat template (tokenizer_config.json), or a plain rendering.

A Hugging Face checkpoint carries its chat template as Jinja in `tokenizer_config.json`
("chat_template", a string or a list of named templates). It is rendered in Jinja's sandbox with
`add_generation_prompt=True` and the model's special tokens, and the result is tokenized without
adding special tokens again (the template writes them). Without a template (the demo models, or
jinja2 not installed) each message becomes a "role: content" line, then "assistant:".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mooncake_cli.interfaces import ConfigError

log = logging.getLogger(__name__)


def plain(messages: Sequence[dict[str, str]]) -> str:
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def _token(value: Any) -> str:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older tokenizer configs
        value = value.get("content", "")
    return value if isinstance(value, str) else ""


class ChatTemplate:
    """Renders a list of {role, content} messages into the prompt text the model expects."""

    def __init__(self, source: str | None, bos: str = "", eos: str = "") -> None:
        self.source = source
        self._bos, self._eos = bos, eos
        self._template: Any = None
        if source:
            try:
                from jinja2.exceptions import TemplateError
                from jinja2.sandbox import ImmutableSandboxedEnvironment
            except ImportError:
                log.warning("jinja2 is not installed: chat prompts use the plain format "
                            "instead of the model's template (pip install jinja2)")
                return
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

            def raise_exception(message: str) -> None:
                raise TemplateError(message)

            env.globals["raise_exception"] = raise_exception
            try:
                self._template = env.from_string(source)
            except TemplateError as e:
                raise ConfigError(f"the model's chat template does not parse: {e}") from None

    @property
    def native(self) -> bool:
        """Whether the model's own template is used (its output carries the special tokens)."""
        return self._template is not None

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        if self._template is None:
            return plain(messages)
        from jinja2.exceptions import TemplateError

        try:
            return str(self._template.render(messages=list(messages),
                                             add_generation_prompt=True,
                                             bos_token=self._bos, eos_token=self._eos))
        except TemplateError as e:  # e.g. a template that refuses a role order
            from mooncake_cli.jsonhttp import HTTPError

            raise HTTPError(400, f"the model's chat template refused the messages: {e}",
                            param="messages") from None

    @classmethod
    def from_dir(cls, path: Path) -> ChatTemplate:
        """The template of checkpoint directory `path` (none when it has no tokenizer_config)."""
        cfg_file = path / "tokenizer_config.json"
        if not cfg_file.is_file():
            return cls(None)
        try:
            cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"{cfg_file}: cannot read ({e})") from None
        source = cfg.get("chat_template")
        if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default") or next(iter(named.values()), None)
        if not isinstance(source, str):
            return cls(None)
        return cls(source, _token(cfg.get("bos_token")), _token(cfg.get("eos_token")))
