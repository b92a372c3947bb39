"""Chat prompts: the model's own chat template, or a plain rendering.

The template comes with the model (`mooncake_cli.engine.source.ChatSpec`: a GGUF's
`tokenizer.chat_template`, or a Hugging Face directory's chat_template.jinja, chat_template.json
or tokenizer_config.json). It is rendered as transformers' `apply_chat_template` renders it: an
immutable Jinja sandbox with trim_blocks/lstrip_blocks, loop controls, the `{% generation %}`
tag, a non-escaping `tojson`, `raise_exception` and `strftime_now`, with
`add_generation_prompt=True` and the model's special tokens. The result is tokenized without
adding special tokens again (the template writes them). Without a template (the demo models, or
jinja2 not installed) each message becomes a "role: content" line, then "assistant:".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from mooncake_cli.interfaces import ConfigError

log = logging.getLogger(__name__)


def plain(messages: Sequence[dict[str, str]]) -> str:
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


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
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True,
                extensions=[_generation_tag(), "jinja2.ext.loopcontrols"])

            def raise_exception(message: str) -> None:
                raise TemplateError(message)

            def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None,
                       separators: Any = None, sort_keys: bool = False) -> str:
                return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                                  separators=separators, sort_keys=sort_keys)

            env.filters["tojson"] = tojson
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
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
            from mooncake_cli.api.errors import bad

            raise bad(f"the model's chat template refused the messages: {e}",
                      "messages") from None

    @classmethod
    def from_spec(cls, spec: Any) -> ChatTemplate:
        """From a model's `ChatSpec` (template source and special tokens)."""
        return cls(spec.template, spec.bos_token, spec.eos_token)

    @classmethod
    def from_dir(cls, path: Path) -> ChatTemplate:
        """The template of checkpoint directory `path`, as transformers 4 and 5 save it."""
        from mooncake_cli.engine.errors import ModelError
        from mooncake_cli.engine.source import hf_chat

        try:
            return cls.from_spec(hf_chat(path))
        except ModelError as e:
            raise ConfigError(str(e)) from None


def _generation_tag() -> Any:
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): the body."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    return Generation
