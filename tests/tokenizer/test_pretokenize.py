"""Pre-tokenizer: the fast paths give the chunks of the plain ``regex`` pattern.

Oracle: ``regex.findall`` with the pattern as written (itself checked against tiktoken in
test_gpt2.py); safe-space segments checked by re-splitting.
"""

from __future__ import annotations

import regex
from hypothesis import given
from hypothesis import strategies as st
from tests.tokenizer.strategies import texts

from glassgpt.tokenizer.pretokenize import (
    GPT2_PATTERN,
    GPT4_PATTERN,
    PATTERNS,
    SAFE_SPACE,
    WHITESPACE,
    resolve_pattern,
    space_segments,
    split,
)

ascii_texts = st.text(st.characters(max_codepoint=127), max_size=60)
spacey = st.text(st.sampled_from("ab1. \n\t\r\x0b\x0c\x1c\xa0\u3000'sS"), max_size=40)


def test_whitespace_is_regex_backslash_s() -> None:
    import sys

    every_char = "".join(map(chr, range(sys.maxunicode + 1)))
    assert set(regex.findall(r"\s", every_char)) == WHITESPACE


@given(st.one_of(ascii_texts, spacey.filter(str.isascii)))
def test_ascii_fast_path_equals_regex(text: str) -> None:
    for name, pattern in PATTERNS.items():
        assert split(text, name) == regex.findall(pattern, text)


@given(st.one_of(texts, spacey))
def test_named_patterns_equal_regex_on_any_text(text: str) -> None:
    for name, pattern in PATTERNS.items():
        chunks = split(text, name)
        assert chunks == regex.findall(pattern, text)
        assert "".join(chunks) == text


@given(st.one_of(texts, spacey))
def test_safe_space_segments_split_into_the_same_chunks(text: str) -> None:
    segments = space_segments(text)
    assert "".join(segments) == text
    pieces = SAFE_SPACE.split(text)
    assert segments == [pieces[0]] + [" " + p for p in pieces[1:]]
    for name in PATTERNS:
        assert [c for s in segments for c in split(s, name)] == split(text, name)


def test_resolve_pattern() -> None:
    assert resolve_pattern("gpt2") == (GPT2_PATTERN, "gpt2")
    assert resolve_pattern(GPT4_PATTERN) == (GPT4_PATTERN, "gpt4")
    assert resolve_pattern("none") == (None, None)
    assert split("a b", None) == ["a b"]
    assert split("", None) == []


def test_bad_pattern_is_a_config_error() -> None:
    import pytest

    from glassgpt.errors import ConfigError

    with pytest.raises(ConfigError, match="pattern"):
        resolve_pattern("(unclosed")


def test_unicode_classes_differ_from_tiktoken_only_by_newer_code_points() -> None:
    # What generated text leaves out (strategies.unicode_disagreements): the regex module
    # knows newer Unicode than tiktoken's engine, so it has more letters and numbers, never
    # fewer, and the same whitespace.
    import pytest

    pytest.importorskip("tiktoken")
    from tests.tokenizer.strategies import every_char, tiktoken_class

    chars = every_char()
    for cls in (r"\p{L}", r"\p{N}"):
        assert set(tiktoken_class(cls, chars)) <= set(regex.findall(cls, chars))
    assert set(tiktoken_class(r"\s", chars)) == WHITESPACE
