"""Chat with a model's own chat template: a live server on a tiny Llama HF folder with a
Llama 3-style tokenizer and template, through the official ``openai`` client, against
transformers (``apply_chat_template`` + greedy ``generate``); ``sample --chat``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.interop.hf_cases import CASES, Case, make
from tests.serve.conftest import start_server
from tests.test_hub import add_snapshot
from tests.tokenizer.family_files import write_family

from glassgpt.checkpoint import open_run
from glassgpt.cli import main
from glassgpt.serve.app import create_app
from glassgpt.tokenizer import FamilyTokenizer

openai = pytest.importorskip("openai")
transformers = pytest.importorskip("transformers")

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
N = 6  # new tokens; the model's 4th greedy token is made an end-of-turn id


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int], list[int]]:
    """The HF folder, the template's prompt ids and transformers' greedy continuation."""
    out = write_family("llama3", tmp_path_factory.mktemp("chat") / "llama")
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    base = CASES["llama-gqa2-llama3-untied"]
    kwargs = {**base.kwargs, "vocab_size": len(hf_tok), "max_position_embeddings": 64}
    hf = make(Case(base.config, base.model, kwargs))
    hf.save_pretrained(out)
    prompt = hf_tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    prompt = list(
        prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt
    )
    with torch.no_grad():
        greedy = hf.generate(torch.tensor([prompt]), max_new_tokens=N, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()  # fmt: skip
    # an end-of-turn id the random model reaches: its 4th greedy token (and <|eot_id|>)
    eot = hf_tok.convert_tokens_to_ids("<|eot_id|>")
    assert greedy[3] not in greedy[:3]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [greedy[3], eot]}))
    return out, prompt, greedy


@pytest.fixture(scope="module")
def server(folder: tuple[Path, list[int], list[int]]) -> Iterator[str]:
    run = open_run(folder[0])
    torch.set_num_threads(1)
    app = create_app(run.model, run.tokenizer, name="llama", slots=4, chat=run.chat_template)
    srv, thread, url = start_server(app)
    yield url
    srv.should_exit = True
    thread.join(timeout=10)


def _client(url: str) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)


def test_chat_uses_the_models_template(server: str, folder: Any) -> None:
    out, prompt, greedy = folder
    want = transformers.AutoTokenizer.from_pretrained(out).decode(greedy[:3])
    c = _client(server)
    r = c.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=N, temperature=0)
    assert r.usage.prompt_tokens == len(prompt)  # the template's ids, BOS once
    assert r.choices[0].message.content == want  # stopped at the end-of-turn id, not sent
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 3
    chunks = list(c.chat.completions.create(model="llama", messages=MESSAGES, max_tokens=N,
                                            temperature=0, stream=True))  # fmt: skip
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_completion_gets_the_bos(server: str, folder: Any) -> None:
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder[0])
    r = _client(server).completions.create(model="llama", prompt="Hello", max_tokens=1)
    assert r.usage.prompt_tokens == len(hf_tok("Hello")["input_ids"])  # BOS + the text


def test_a_model_without_a_template_is_a_400(folder: Any) -> None:
    run = open_run(folder[0])
    app = create_app(run.model, run.tokenizer, name="llama", slots=1, chat=None)
    srv, thread, url = start_server(app)
    try:
        with pytest.raises(openai.BadRequestError) as err:
            _client(url).chat.completions.create(model="llama", messages=MESSAGES, max_tokens=1)
        assert "no chat template" in str(err.value) and "--chat-template" in str(err.value)
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


def test_sample_chat_on_the_command_line(folder: Any, capsys: Any, tmp_path: Path) -> None:
    out, _, greedy = folder
    want = transformers.AutoTokenizer.from_pretrained(out).decode(greedy[:3])
    argv = ["sample", "-c", str(out), "--chat", "--system", "Be brief.", "-p", "Hi there",
            "-t", "0", "-m", str(N)]  # fmt: skip
    assert main(argv) == 0
    assert capsys.readouterr().out == want + "\n"
    # a model without a template: one line naming it, and how to give one
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in out.iterdir():
        if f.name != "tokenizer_config.json":
            (bare / f.name).write_bytes(f.read_bytes())
    assert main(["sample", "-c", str(bare), "--chat", "-p", "Hi", "-m", "1"]) != 0
    err = capsys.readouterr().err
    assert "has no chat template" in err and "--chat-template" in err and "Traceback" not in err
    (tmp_path / "t.jinja").write_text("{{ messages[-1].content }}")
    argv = ["sample", "-c", str(bare), "--chat", "--chat-template", str(tmp_path / "t.jinja"),
            "-p", "Hi", "-m", "2", "-t", "0"]  # fmt: skip
    assert main(argv) == 0


def test_a_hub_id_brings_its_tokenizer_and_template(
    folder: Any, tmp_path: Path, monkeypatch
) -> None:
    out, prompt, _ = folder
    add_snapshot(tmp_path / "home" / "hub", "org/chat", "c" * 40, out, ["main"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    run = open_run("hf:org/chat", weights=False)
    assert isinstance(run.tokenizer, FamilyTokenizer) and run.chat_template is not None
    text = run.chat_template.render(MESSAGES)
    assert run.tokenizer.encode(text, allowed_special="all") == prompt
