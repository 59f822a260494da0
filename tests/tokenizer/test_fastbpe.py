"""The compiled engine (tokenizer/_fastbpe.c) held to the reference, bpe.py's Python loop.

Oracles: the reference (regex split + merge.py), and tiktoken's core on text whose
characters both Unicode tables class alike. Skipped when the extension is not built.
"""

from __future__ import annotations

import threading
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.interop.test_tokenizer_export import _merges_from_draws
from tests.tokenizer.strategies import FRAGMENTS, texts

from glassgpt.tokenizer import Tokenizer, engine
from glassgpt.tokenizer.merge import bpe, rank_table

pytest.importorskip("glassgpt.tokenizer._fastbpe", reason="the compiled extension is not built")

# Every code point but the surrogates, in short runs: the classes are regex's, so nothing
# is left out (tiktoken's tables differ on some; the reference is the oracle here).
ALL_UNICODE = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=4)
any_texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), ALL_UNICODE), max_size=24).map("".join)
ADVERSARIAL = [
    "",
    "'",
    "'s",
    "'S",
    "'ſ",
    "'LL",
    "'lL",
    "'Ve",
    "'rE",
    "'x",
    "''s",
    "it'sn't",
    "  \tabc",
    " \n \n",
    "\r\n\r\n  x",
    "a \r\n\t b",
    "x\n\n\n",
    "x  ",
    "   ",
    "\u3000\u3000a",
    "1234567",
    " 123abc",
    "١٢٣٤",
    "..abc",
    " .\n\nabc",
    "\tabc",
    "a\u0558b \U0003ed9b",
    "e\u0301\u0301",
    "👩‍👩‍👧👩‍👩‍👧",
    "\x00\x7f\x1c",
    " " * 3000 + "x",
    "a" * 3000,
    "9" * 1000,
    "!" * 700 + "\n" * 300,
    ("ab " * 400).strip(),
]


def reference(tok: Tokenizer) -> Tokenizer:
    ref = Tokenizer(tok.vocab, tok.merges, pattern=tok.pattern, special_tokens=tok.special_tokens)
    ref.fast = False
    return ref


@pytest.fixture(scope="module", params=["gpt2", "gpt4"])
def pair(request, shakespeare_text: str) -> tuple[Tokenizer, Tokenizer]:
    """A tokenizer trained by glassgpt with each pattern, and its reference twin."""
    tok = Tokenizer.train(shakespeare_text[:200_000], 700, pattern=request.param)
    return tok, reference(tok)


@pytest.fixture(scope="module")
def gpt2_ref(gpt2_tok: Tokenizer) -> Tokenizer:
    return reference(gpt2_tok)


def test_gpt2_and_trained_tokenizers_use_it(gpt2_tok, pair) -> None:
    for tok in (gpt2_tok, pair[0]):
        assert isinstance(tok.engine(), engine.CompiledEngine)
        assert tok.engine().engine.whole_lookup


@pytest.mark.parametrize("text", ADVERSARIAL)
def test_adversarial_texts_equal_reference(gpt2_tok, gpt2_ref, pair, text) -> None:
    assert gpt2_tok.encode_ordinary(text) == gpt2_ref.encode_ordinary(text)
    assert pair[0].encode_ordinary(text) == pair[1].encode_ordinary(text)


@settings(max_examples=300, deadline=None)
@given(text=any_texts)
def test_any_unicode_equals_reference(gpt2_tok, gpt2_ref, pair, text) -> None:
    assert gpt2_tok.encode_ordinary(text) == gpt2_ref.encode_ordinary(text)
    assert pair[0].encode_ordinary(text) == pair[1].encode_ordinary(text)


@settings(max_examples=200, deadline=None)
@given(text=texts)
def test_equals_tiktoken(gpt2_tok, tiktoken_gpt2, pair, text) -> None:
    assert gpt2_tok.encode_ordinary(text) == tiktoken_gpt2.encode_ordinary(text)
    tok = pair[0]
    assert tok.encode_ordinary(text) == engine.to_tiktoken_encoding(tok).encode_ordinary(text)


def test_whole_shakespeare_equals_reference_and_tiktoken(
    gpt2_tok, gpt2_ref, tiktoken_gpt2, pair, shakespeare_text
) -> None:
    ids = gpt2_tok.encode_ordinary(shakespeare_text)
    assert ids == gpt2_ref.encode_ordinary(shakespeare_text)
    assert ids == tiktoken_gpt2.encode_ordinary(shakespeare_text)
    assert pair[0].encode_ordinary(shakespeare_text) == pair[1].encode_ordinary(shakespeare_text)


def test_lone_surrogates_become_replacement_characters(gpt2_tok, gpt2_ref) -> None:
    text = "a\ud800b \udfff\U0001f642"
    assert gpt2_tok.encode_ordinary(text) == gpt2_ref.encode_ordinary(text)


@settings(max_examples=200, deadline=None)
@given(
    draws=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=12),
    samples=st.lists(st.text("abc ", max_size=300), min_size=1, max_size=4),
)
def test_random_vocabularies_equal_reference(draws, samples) -> None:
    """Whole-token lookup is on exactly when every token's bytes merge to it; ids never change."""
    tok = Tokenizer.from_merges(_merges_from_draws(draws))
    ref = reference(tok)
    ranks = rank_table(tok.merges)
    reach = all(bpe(list(t), ranks) == [i] for i, t in enumerate(tok.vocab))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tok.engine().engine.whole_lookup == reach
        for text in samples:
            assert tok.encode_ordinary(text) == ref.encode_ordinary(text)


def test_threads_give_the_same_ids(gpt2_tok, gpt2_ref, stdlib_text) -> None:
    texts = [stdlib_text[k : k + 50_000] for k in range(0, 400_000, 50_000)]
    out: dict[int, list[int]] = {}

    def work(k: int) -> None:
        out[k] = gpt2_tok.encode_ordinary(texts[k])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [out[k] for k in range(len(texts))] == [gpt2_ref.encode_ordinary(t) for t in texts]


def test_bad_tables_are_refused() -> None:
    ext = engine.compiled()
    table = engine.class_table()
    vocab = [bytes([b]) for b in range(256)]
    with pytest.raises(ValueError, match="byte 255"):
        ext.Engine(vocab[:255], [], table, False, list)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ext.Engine(vocab, [(1, 2, 256)], table, False, list)
    with pytest.raises(ValueError, match="0x110000"):
        ext.Engine(vocab, [], table[:5], False, list)
