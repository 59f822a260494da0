"""A character tokenizer exported as HF ``tokenizer.json``: transformers' AutoTokenizer gives
glassgpt's ids (the oracle: transformers itself), and the file reads back as the same tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgpt.interop.export import export_hf
from glassgpt.interop.hf_tokenizers import load_tokenizer_json
from glassgpt.model import GPT, GPTConfig
from glassgpt.tokenizer import CharTokenizer

CHARS = sorted(set("abcdefghij XYZ,.:;!?'\n\t-éü日本🙂"))
SPECIALS = ["<|endoftext|>", "<|pad|>"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[CharTokenizer, object, Path]:
    transformers = pytest.importorskip("transformers")
    tok = CharTokenizer(CHARS, special_tokens=SPECIALS)
    out = tmp_path_factory.mktemp("char") / "hf"
    model = GPT(GPTConfig(n_vocab=tok.n_vocab, n_ctx=16, d_model=8, n_layers=1, n_heads=2))
    export_hf(model, tok, out)
    return tok, transformers.AutoTokenizer.from_pretrained(out), out


@settings(max_examples=50)
@given(st.lists(st.one_of(st.sampled_from(CHARS), st.sampled_from(SPECIALS)), max_size=30))
def test_autotokenizer_gives_glassgpts_ids(exported, pieces: list[str]) -> None:
    tok, hf, _ = exported
    text = "".join(pieces)
    ids = tok.encode(text, allowed_special="all")
    assert hf(text, add_special_tokens=False)["input_ids"] == ids
    assert hf.decode(ids) == text


def test_the_file_reads_back_as_the_same_char_tokenizer(exported) -> None:
    tok, _, out = exported
    back = load_tokenizer_json(out / "tokenizer.json")
    assert isinstance(back, CharTokenizer)
    assert back.chars == tok.chars and back.special_tokens == tok.special_tokens
