"""A model's chat template: messages → the one text the model was trained to continue.

    prompt = template(messages, add_generation_prompt=True, bos_token, eos_token, …)
    ids    = encode(prompt, allowed_special="all")      (no specials added: the template
                                                          writes BOS itself where it wants one)

The template is the Jinja source in ``tokenizer_config.json`` (``chat_template``: a string,
or a list of ``{"name", "template"}`` of which "default" is used) or a ``chat_template.jinja``
beside it. It is rendered as ``transformers``' ``apply_chat_template`` renders it: a sandboxed
environment with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a
``{% generation %}`` block that renders its body, ``raise_exception``, ``strftime_now``, a
``tojson`` that keeps non-ASCII text, and the special tokens of ``tokenizer_config.json``
(``bos_token``, ``eos_token``, …) as variables.

:data:`PLAIN` is glassgpt's own template for a model that has none (``--chat-template
plain``): one ``role: content`` line per turn, then ``assistant:``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from glassgpt.errors import GlassError, InputFileError
from glassgpt.tokenizer.family import read_config, token_text

CONFIG = "tokenizer_config.json"
JINJA = "chat_template.jinja"
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                "mask_token")  # fmt: skip


class _Generation(jinja2.ext.Extension):
    """``{% generation %} … {% endgeneration %}``: transformers marks the assistant's tokens
    with it; rendering keeps the body as it is."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)  # fmt: skip


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template and the special tokens it may name (``variables``).

    >>> t = ChatTemplate("{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    ...                  "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
    ...                  variables={"bos_token": "<s>"})
    >>> t.render([{"role": "user", "content": "Hi"}])
    '<s><user>Hi<assistant>'
    """

    source: str
    variables: Mapping[str, str] = field(default_factory=dict)
    origin: str = "chat template"

    @cached_property
    def _compiled(self) -> jinja2.Template:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        try:
            return env.from_string(self.source)
        except jinja2.TemplateSyntaxError as e:
            raise GlassError(
                f"{self.origin}: not a Jinja template (line {e.lineno}: {e})"
            ) from None

    def check(self) -> ChatTemplate:
        """Compile now: a template that is not Jinja fails when it is read, not per request."""
        _ = self._compiled
        return self

    def render(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
    ) -> str:
        """The prompt text of ``messages`` (dicts with ``role`` and ``content``)."""
        try:
            return self._compiled.render(
                messages=[dict(m) for m in messages],
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.variables,
            )
        except jinja2.TemplateError as e:
            raise GlassError(f"{self.origin}: {e}") from None


class PlainTemplate:
    """glassgpt's plain chat format (``role: content`` lines, then ``assistant:``), for a
    model trained without a chat template; its stops are the next turn's ``\\nrole:``.

    >>> PLAIN.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    'system: Be brief.\\nuser: Hi\\nassistant:'
    """

    origin = "plain"
    stops = tuple(f"\n{role}:" for role in ("system", "user", "assistant"))

    def render(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
    ) -> str:
        turns = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return turns + ("assistant:" if add_generation_prompt else "")


PLAIN = PlainTemplate()


def read_chat_template(folder: str | os.PathLike[str]) -> ChatTemplate | None:
    """The chat template of a tokenizer's folder (``tokenizer_config.json``'s
    ``chat_template``, else ``chat_template.jinja``), or None where it has none."""
    folder = Path(folder)
    config = read_config(folder)
    variables = {k: v for k in SPECIAL_KEYS if (v := token_text(config.get(k))) is not None}
    source, origin = config.get("chat_template"), f"{folder / CONFIG}: chat_template"
    if isinstance(source, list):  # named templates: transformers' default is "default"
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
        source = named.get("default")
    if not isinstance(source, str) and (folder / JINJA).is_file():
        source, origin = (folder / JINJA).read_text(encoding="utf-8"), str(folder / JINJA)
    if not isinstance(source, str):
        return None
    return ChatTemplate(source, variables, origin).check()


def template_file(spec: str, tokenizer: Any = None) -> ChatTemplate | PlainTemplate:
    """What ``--chat-template`` names: ``plain`` or a Jinja file (whose ``bos_token`` and
    ``eos_token`` are the tokenizer's, where it names them)."""
    if spec == "plain":
        return PLAIN
    path = Path(spec)
    if not path.is_file():
        raise InputFileError(f"--chat-template {spec}: no such file (a Jinja file, or 'plain')")
    names = {k: getattr(tokenizer, k, None) for k in ("bos_token", "eos_token")}
    variables = {k: v for k, v in names.items() if isinstance(v, str)}
    return ChatTemplate(path.read_text(encoding="utf-8"), variables, str(path)).check()


def chosen_template(spec: str | None, model_template: Any, tokenizer: Any) -> Any:
    """The template a command uses: ``--chat-template`` where given, else the model's (a
    :class:`ChatTemplate`, or None)."""
    return template_file(spec, tokenizer) if spec else model_template
