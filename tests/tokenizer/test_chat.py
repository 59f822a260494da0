"""Chat templates rendered as transformers' ``apply_chat_template`` renders them: text and ids,
for a Llama 3-style and a Qwen-style (ChatML) template written in the test."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from tests.tokenizer.family_files import write_family

from glassgpt.checkpoint.runs import tokenizer_file
from glassgpt.errors import GlassError, InputFileError
from glassgpt.tokenizer.chat import PLAIN, ChatTemplate, read_chat_template, template_file

transformers = pytest.importorskip("transformers")

CHATS = [
    [{"role": "user", "content": "Hello there!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  naïve café 🙂 \n"}],
    [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "and <|eot_id|> <|im_end|> as text?"},
    ],
]


def _ids(out: Any) -> list[int]:
    return list(out["input_ids"] if isinstance(out, Mapping) else out)


@pytest.mark.parametrize("kind", ["llama3", "qwen"])
@pytest.mark.parametrize("messages", CHATS)
def test_render_equals_apply_chat_template(tmp_path: Path, kind: str, messages: list) -> None:
    folder = write_family(kind, tmp_path / kind)
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    template = read_chat_template(folder)
    assert template is not None
    text = template.render(messages)
    assert text == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|begin_of_text|>" if kind == "llama3" else "<|im_start|>system")
    tok = tokenizer_file(folder / "tokenizer.json")
    want = _ids(hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True))
    assert tok.encode(text, allowed_special="all") == want  # BOS once: the template's
    no_prompt = template.render(messages, add_generation_prompt=False)
    assert no_prompt == hf.apply_chat_template(messages, tokenize=False)


def test_named_templates_and_the_jinja_file(tmp_path: Path) -> None:
    config = {"bos_token": {"content": "<s>"}, "chat_template": [
        {"name": "tool_use", "template": "T"},
        {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"},
    ]}  # fmt: skip
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert read_chat_template(tmp_path).render([{"role": "user", "content": "x"}]) == "<s>x"
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert read_chat_template(tmp_path) is None
    (tmp_path / "chat_template.jinja").write_text(
        "{% generation %}[{{ messages|length }}]{% endgeneration %}"
    )
    assert read_chat_template(tmp_path).render([{"role": "user", "content": "x"}]) == "[1]"


def test_transformers_helpers_and_errors(tmp_path: Path) -> None:
    t = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
        "{{ messages | tojson }}{{ strftime_now('%Y') | length }}"
    )
    assert t.render([{"role": "user", "content": "é"}]) == '[{"role": "user", "content": "é"}]4'
    with pytest.raises(GlassError, match="first must be user"):
        t.render([{"role": "system", "content": "x"}])
    with pytest.raises(GlassError, match="not a Jinja template"):
        ChatTemplate("{% for %}").check()
    with pytest.raises(GlassError):  # the sandbox: no attribute walks to Python internals
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([{"role": "user", "content": ""}])
    with pytest.raises(InputFileError, match="no such file"):
        template_file(str(tmp_path / "missing.jinja"))
    assert template_file("plain") is PLAIN
    (tmp_path / "t.jinja").write_text("{{ bos_token }}|{{ messages[0].content }}")
    tok = type("Tok", (), {"bos_token": "<s>", "eos_token": None})()
    assert (
        template_file(str(tmp_path / "t.jinja"), tok).render([{"role": "u", "content": "a"}])
        == "<s>|a"
    )
