"""GPT-2's vocabulary: ids identical to tiktoken's gpt2 encoding (built offline).

Oracles: tiktoken (Rust regex + byte-pair merges) on the same files, with the byte alphabet
taken from transformers; known ids from the literature; the round trip on any str.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.tokenizer.strategies import texts

from glassgpt.errors import GlassError
from glassgpt.tokenizer import SpecialTokenError, Tokenizer


def test_known_ids(gpt2_tok: Tokenizer) -> None:
    # GPT-2's ids for these are widely quoted (e.g. in the transformers docs).
    assert gpt2_tok.encode("Hello world") == [15496, 995]
    assert gpt2_tok.vocab[262] == b" the"
    assert gpt2_tok.special_tokens == {"<|endoftext|>": 50256}
    assert gpt2_tok.n_vocab == 50257
    assert len(gpt2_tok.merges) == 50_000
    assert gpt2_tok.pattern_name == "gpt2"


@pytest.mark.parametrize("corpus", ["shakespeare_text", "stdlib_text"])
def test_corpus_ids_equal_tiktoken(corpus: str, request, gpt2_tok, tiktoken_gpt2) -> None:
    text = request.getfixturevalue(corpus)
    expected = tiktoken_gpt2.encode_ordinary(text)
    assert gpt2_tok.encode_ordinary(text) == expected  # cold caches
    assert gpt2_tok.encode_ordinary(text) == expected  # warm caches
    assert gpt2_tok.encode(text) == expected
    assert gpt2_tok.decode(expected) == text


@pytest.mark.slow
def test_stdlib_ids_equal_tiktoken_without_caches(stdlib_text, gpt2_tok, tiktoken_gpt2) -> None:
    # tiktoken's own spelling of the pattern is not ours, so this runs the plain regex path.
    from tiktoken_ext.openai_public import r50k_pat_str

    plain = Tokenizer(
        gpt2_tok.vocab,
        gpt2_tok.merges,
        pattern=r50k_pat_str,
        special_tokens=gpt2_tok.special_tokens,
    )
    assert plain.pattern_name is None
    text = stdlib_text[:1_000_000]
    assert plain.encode_ordinary(text) == tiktoken_gpt2.encode_ordinary(text)


@settings(max_examples=300)
@given(texts)
def test_ids_equal_tiktoken_on_generated_text(gpt2_tok, tiktoken_gpt2, text: str) -> None:
    assert gpt2_tok.encode_ordinary(text) == tiktoken_gpt2.encode_ordinary(text)
    assert gpt2_tok.encode(text, disallowed_special=()) == tiktoken_gpt2.encode(
        text, disallowed_special=()
    )
    assert gpt2_tok.encode(text, allowed_special="all") == tiktoken_gpt2.encode(
        text, allowed_special="all"
    )


@pytest.fixture(scope="module")
def gpt4_pair(gpt2_tok, gpt2_ranks):
    """cl100k's pattern over GPT-2's merges, ours and tiktoken's: boundaries decide the ids."""
    tiktoken = pytest.importorskip("tiktoken")
    from glassgpt.tokenizer.pretokenize import GPT4_PATTERN

    ours = Tokenizer(gpt2_tok.vocab, gpt2_tok.merges, pattern="gpt4")
    theirs = tiktoken.Encoding(
        "gpt2-cl100k-split", pat_str=GPT4_PATTERN, mergeable_ranks=gpt2_ranks, special_tokens={}
    )
    return ours, theirs


@settings(max_examples=200)
@given(texts)
def test_gpt4_pattern_splits_like_cl100k(gpt4_pair, text: str) -> None:
    ours, theirs = gpt4_pair
    assert ours.encode_ordinary(text) == theirs.encode_ordinary(text)


def test_gpt4_pattern_is_cl100k_pattern() -> None:
    pytest.importorskip("tiktoken")
    from tiktoken_ext.openai_public import cl100k_base

    from glassgpt.tokenizer.pretokenize import GPT4_PATTERN

    # cl100k_base() would download its ranks; its pattern is a literal in its code.
    literals = [c for c in cl100k_base.__code__.co_consts if isinstance(c, str) and "\\p{L}" in c]
    if len(literals) != 1:
        pytest.skip("this tiktoken's cl100k_base() no longer holds its pattern as one literal")
    assert literals[0] == GPT4_PATTERN


def test_gpt4_pattern_on_corpora(gpt4_pair, shakespeare_text, stdlib_text) -> None:
    ours, theirs = gpt4_pair
    for text in (shakespeare_text, stdlib_text[:1_000_000]):
        assert ours.encode_ordinary(text) == theirs.encode_ordinary(text)


@given(st.text())
def test_round_trip_any_str(gpt2_tok, text: str) -> None:
    assert gpt2_tok.decode(gpt2_tok.encode_ordinary(text)) == text


def test_lone_surrogates_become_replacement_chars(gpt2_tok, tiktoken_gpt2) -> None:
    text = "a\ud800b \udfff"
    assert gpt2_tok.encode(text) == tiktoken_gpt2.encode(text)
    assert gpt2_tok.decode(gpt2_tok.encode(text)) == "a\ufffdb \ufffd"


@pytest.mark.parametrize(
    "text", ["<|endoftext|>", "a <|endoftext|>b", "x<|endoftext|><|endoftext|>", "<|endoftext", ""]
)
def test_special_policy_matches_tiktoken(gpt2_tok, tiktoken_gpt2, text: str) -> None:
    cases = [
        {},
        {"allowed_special": "all"},
        {"allowed_special": {"<|endoftext|>"}},
        {"disallowed_special": ()},
        {"allowed_special": "all", "disallowed_special": ()},
    ]
    for kw in cases:
        try:
            expected = tiktoken_gpt2.encode(text, **kw)
        except ValueError:
            with pytest.raises(SpecialTokenError, match=re.escape("<|endoftext|>")):
                gpt2_tok.encode(text, **kw)
        else:
            assert gpt2_tok.encode(text, **kw) == expected, kw


def test_special_errors_are_glass_errors(gpt2_tok) -> None:
    with pytest.raises(GlassError, match="at character 2"):
        gpt2_tok.encode("a <|endoftext|>")
    with pytest.raises(GlassError, match="not a special token"):
        gpt2_tok.encode("a", allowed_special={"<|im_start|>"})


def test_decode_matches_tiktoken_including_partial_utf8(gpt2_tok, tiktoken_gpt2) -> None:
    ids = tiktoken_gpt2.encode("héllo 🙂 <|endoftext|>", allowed_special="all")
    assert gpt2_tok.decode_bytes(ids) == tiktoken_gpt2.decode_bytes(ids)
    for cut in range(len(ids)):
        assert gpt2_tok.decode(ids[:cut]) == tiktoken_gpt2.decode(ids[:cut])
