"""Streamed text equals decoding at the end: :class:`glassgpt.tokenizer.streaming.TextStream`
on Llama 2-style (``▁``, byte fallback, the first space stripped) and Llama 3-style tokenizers
against ``AutoTokenizer.decode``; and a live server on a tiny Llama with the Llama 2-style
tokenizer through the official ``openai`` client, streamed vs not, against transformers'
greedy ids decoded (a chat reply: ``decode(reply)``; a completion: ``decode(prompt ‖ new)``
minus ``decode(prompt)``)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.interop.hf_cases import CASES, Case, make
from tests.serve.conftest import start_server
from tests.tokenizer.family_files import CORPUS, write_family

from glassgpt.checkpoint import open_run
from glassgpt.serve.app import create_app
from glassgpt.tokenizer.chat import ChatTemplate
from glassgpt.tokenizer.streaming import TextStream, stream_text

transformers = pytest.importorskip("transformers")

TEXTS = [*CORPUS[:4], " leading space", "日本語 — ünï 🙂🙂 x", "\n\n  a  b"]
LLAMA2 = "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"


@pytest.fixture(scope="module", params=["fallback", "llama3"])
def family(request: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    folder = write_family(request.param, tmp_path_factory.mktemp(request.param))
    return open_run_tokenizer(folder), transformers.AutoTokenizer.from_pretrained(folder)


def open_run_tokenizer(folder: Path) -> Any:
    from glassgpt.tokenizer.family import read_family

    return read_family(folder)


def test_pieces_join_to_decode(family: tuple[Any, Any]) -> None:
    tok, hf = family
    rng = random.Random(0)
    for text in TEXTS:
        ids = hf(text, add_special_tokens=False)["input_ids"]
        assert "".join(stream_text(tok, iter(ids))) == hf.decode(ids)
        for _ in range(5):  # a context: the pieces continue its text
            cut = rng.randrange(len(ids) + 1)
            ctx, new = ids[:cut], ids[cut:]
            whole, head = hf.decode(ctx + new), hf.decode(ctx)
            if whole.startswith(head):
                assert "".join(stream_text(tok, iter(new), ctx)) == whole[len(head) :]


def test_an_incomplete_character_is_held_back(family: tuple[Any, Any]) -> None:
    tok, hf = family
    ids = hf("🙂", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1  # bytes of one character over several tokens (byte tokens)
    stream = TextStream(tok)
    assert [stream.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert stream.push(ids[-1]) + stream.flush() == "🙂"
    stream = TextStream(tok)
    stream.push(ids[0])
    assert stream.flush() == hf.decode(ids[:1])  # at the end it is shown as it decodes


def test_a_run_of_byte_tokens_is_decoded_as_one(family: tuple[Any, Any]) -> None:
    """``é`` then a stray continuation byte: ByteFallback makes the whole run U+FFFDs, so the
    ``é`` shown early would differ from decode."""
    tok, hf = family
    if not tok.fallback_bytes:
        pytest.skip("a byte-level tokenizer (its decode is prefix-stable)")
    ids = [hf.convert_tokens_to_ids(f"<0x{b:02X}>") for b in (0xC3, 0xA9, 0x97)]
    ids += hf("a b", add_special_tokens=False)["input_ids"]
    assert hf.decode(ids).startswith("\ufffd\ufffd\ufffd")
    assert "".join(stream_text(tok, iter(ids))) == hf.decode(ids)


def llama2_folder(tmp_path: Path) -> tuple[Path, Any, Any]:
    """An HF folder of a tiny random Llama with a Llama 2-style (byte-fallback) tokenizer, that
    tokenizer as AutoTokenizer reads it, and the transformers model."""
    folder = write_family("fallback", tmp_path / "llama2")
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    base = CASES["llama-gqa2-llama3-untied"]
    kwargs = {**base.kwargs, "vocab_size": len(hf_tok), "max_position_embeddings": 64}
    hf = make(Case(base.config, base.model, kwargs))
    hf.save_pretrained(folder)
    return folder, hf_tok, hf


def test_served_text_streamed_equals_not(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    folder, hf_tok, hf = llama2_folder(tmp_path)
    run = open_run(folder)
    eos = hf_tok.convert_tokens_to_ids("</s>")

    def greedy(prompt: list[int]) -> list[int]:
        x = torch.tensor([prompt])
        with torch.no_grad():
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8,
                              do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
        new = out[0, len(prompt) :].tolist()
        return new[: new.index(eos)] if eos in new else new

    messages = [{"role": "user", "content": "Hello world"}]
    template = ChatTemplate(LLAMA2, {"bos_token": "<s>"})
    chat_prompt = hf_tok(template.render(messages), add_special_tokens=False)["input_ids"]
    reply = hf_tok.decode(greedy(chat_prompt))
    text = "The quick brown"
    prompt = hf_tok(text)["input_ids"]
    whole, head = hf_tok.decode(prompt + greedy(prompt)), hf_tok.decode(prompt)
    assert whole.startswith(head)

    torch.set_num_threads(1)
    app = create_app(run.model, run.tokenizer, name="l2", slots=2, chat=template)
    srv, thread, url = start_server(app)
    try:
        c: Any = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        kw: dict[str, Any] = {"model": "l2", "max_tokens": 8, "temperature": 0}
        r = c.chat.completions.create(messages=messages, **kw)
        chunks = c.chat.completions.create(messages=messages, stream=True, **kw)
        streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks)
        rc = c.completions.create(prompt=text, **kw)
        streamed_c = "".join(ch.choices[0].text for ch in c.completions.create(
            prompt=text, stream=True, **kw))  # fmt: skip
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
    assert r.usage.prompt_tokens == len(chat_prompt)
    assert r.choices[0].message.content == streamed == reply
    assert not reply.startswith(" ")  # the decoder strips the first ▁'s space, the stream too
    assert rc.choices[0].text == streamed_c == whole[len(head) :]


def test_samples_printer_continues_the_prompt(tmp_path: Path, capsys: Any) -> None:
    """``glassgpt sample`` prints the prompt, then ``decode(prompt ‖ new)`` beyond
    ``decode(prompt)``: the space a ``▁`` token opens a word with stays."""
    from glassgpt.cli import main

    folder, hf_tok, hf = llama2_folder(tmp_path)
    text = "Hello world, the"
    prompt = hf_tok(text)["input_ids"]
    x = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=6,
                          do_sample=False, eos_token_id=None, pad_token_id=0)[0].tolist()  # fmt: skip
    eos = hf_tok.convert_tokens_to_ids("</s>")
    out = out[: out.index(eos, len(prompt))] if eos in out[len(prompt) :] else out
    whole, head = hf_tok.decode(out), hf_tok.decode(prompt)
    assert main(["sample", "-c", str(folder), "-p", text, "-m", "6", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == text + whole[len(head) :] + "\n"
