"""The explorer over a model like the README's default: a 512-id byte-level BPE trained on
Python source (here, a few modules of the standard library), in headless Chromium.

- The Patching tab's built-in example has prompts of equal lengths on this tokenizer (the
  classic "When Mary and John…" pair does not: 38 against 37 tokens).
- A token that is part of a UTF-8 character shows as its bytes (``<0xE2>``), never as �, in
  the chips, the next-token list, the logit lens and the Circuits tables.
"""

from __future__ import annotations

import argparse
import collections
import json
import string
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.serve.conftest import Server, open_page, request, start_server

from glassgpt.model import GPT, GPTConfig
from glassgpt.serve.interventions import EXAMPLES
from glassgpt.tokenizer import Tokenizer

pytestmark = pytest.mark.slow
MODULES = (textwrap, argparse, collections, json.decoder, string)
ODD = "s = '→日本'"  # characters the corpus lacks: each is 3 byte tokens


def high_bytes(tok: Any) -> list[int]:
    """The ids of the single bytes 0x80–0xFF (never a whole UTF-8 character)."""
    return [i for i in range(tok.n_vocab) if len(b := tok.decode_bytes([i])) == 1 and b[0] >= 0x80]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from tests.runs import write_run

    from glassgpt.checkpoint import load
    from glassgpt.serve.app import create_app

    text = "".join(Path(m.__file__).read_text() for m in MODULES)
    tok = Tokenizer.train([text], vocab_size=512, special_tokens=["<|endoftext|>"])
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=512, n_ctx=64, d_model=32, n_layers=2, n_heads=4, unembed_bias=True)
    model = GPT(cfg).eval()
    with torch.no_grad():  # the single high bytes on top of every distribution
        model.unembed.b_U[high_bytes(tok)] = 8.0
    run = write_run(tmp_path_factory.mktemp("bpe") / "run", model, tok)
    model, tok = load(run)
    app = create_app(model, tok, name="bpe", slots=2, source=run)
    server, thread, url = start_server(app)
    yield Server(url, app, run)
    server.should_exit = True
    thread.join(timeout=10)


def tokenizer(live: Server) -> Any:
    return Tokenizer.load(live.run / "tok.json")


def test_the_patching_example_fits_the_tokenizer(bpe: Server, browser: Any) -> None:
    tok = tokenizer(bpe)
    mary = [len(tok.encode(p)) for p in EXAMPLES[0]]
    assert mary[0] != mary[1]  # the case of the issue: the classic pair does not fit
    status, x = request(bpe.url, "/api/patch/example", method="GET")
    assert status == 200
    assert len(tok.encode(x["clean"])) == len(tok.encode(x["corrupted"])) == x["tokens"]
    assert x["clean"] != x["corrupted"]

    problems: list[str] = []
    page = open_page(bpe.url, browser, problems)
    page.click("#tab-patch")
    page.wait_for_function("() => $('patch-status').textContent.includes('tokens each')")
    assert page.input_value("#clean") == x["clean"]
    assert page.input_value("#corrupted") == x["corrupted"]
    assert not page.eval_on_selector("#patch-status", "e => e.classList.contains('error')")
    assert page.locator("#patch-heads td.pcell").count() == 2 * 4
    page.close()
    assert problems == []


def test_byte_tokens_show_as_bytes(bpe: Server, browser: Any) -> None:
    tok = tokenizer(bpe)
    ids = tok.encode(ODD)
    assert any(len(tok.decode_bytes([i])) == 1 and tok.decode_bytes([i])[0] >= 0x80 for i in ids)
    problems: list[str] = []
    page = open_page(bpe.url, browser, problems)
    page.fill("#prompt", ODD)
    page.wait_for_function(
        "n => document.querySelectorAll('#chips .chip').length === n "
        "&& $('status').textContent.includes('analysed')",
        arg=len(ids),
    )
    page.wait_for_selector("#qk tr td")
    page.wait_for_selector("#dla .label.total")
    chips = page.eval_on_selector_all("#chips .chip", "cs => cs.map(c => c.textContent)")
    assert "".join(chips).count("<0x") == len("→日本".encode())  # each byte, once
    assert "<0xE2><0x86><0x92>" in "".join(chips)  # → is E2 86 92, in three tokens
    for where in ("#dist .label", "#lens td", "#qk td.t"):
        texts = page.eval_on_selector_all(where, "es => es.map(e => e.textContent)")
        assert any("<0x" in t for t in texts), where
    assert "\ufffd" not in page.inner_text("body")
    page.close()
    assert problems == []
