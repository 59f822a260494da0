"""Merging: the heap version equals the repeated-scan version (GPT-2's ``bpe()``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from glassgpt.errors import GlassError
from glassgpt.tokenizer import Tokenizer
from glassgpt.tokenizer.merge import bpe, bpe_heap, check_merge_order


def gpt2_bpe_on_strings(word: tuple[str, ...], ranks: dict[tuple[str, str], int]) -> list[str]:
    """GPT-2's encoder.py loop, restated on symbol strings: an independent reference."""
    word = list(word)
    while len(word) > 1:
        pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        out, i = [], 0
        while i < len(word):
            if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                out.append(word[i] + word[i + 1])
                i += 2
            else:
                out.append(word[i])
                i += 1
        word = out
    return word


@pytest.fixture(scope="module")
def small_tok(shakespeare_text: str) -> Tokenizer:
    return Tokenizer.train([shakespeare_text[:200_000]], 600, pattern=None)


@given(st.text(st.sampled_from("etaoin shrd\n"), max_size=600))
def test_heap_equals_scan_equals_gpt2_loop(small_tok: Tokenizer, text: str) -> None:
    ids = list(text.encode())
    scan = bpe(list(ids), small_tok._ranks)
    assert bpe_heap(list(ids), small_tok._ranks) == scan
    vocab = [t.decode("latin-1") for t in small_tok.vocab]
    ranks = {(vocab[a], vocab[b]): r for r, (a, b) in enumerate(small_tok.merges)}
    expected = gpt2_bpe_on_strings(tuple(text.encode().decode("latin-1")), ranks)
    assert [vocab[i] for i in scan] == expected


def test_long_chunk_uses_heap_and_round_trips(small_tok: Tokenizer, shakespeare_text: str) -> None:
    text = shakespeare_text[:20_000]  # one chunk: pattern=None
    ids = small_tok.encode(text)
    assert ids == bpe(list(text.encode()), small_tok._ranks)
    assert small_tok.decode(ids) == text


def test_merge_order_is_checked() -> None:
    with pytest.raises(GlassError, match="merges 0 and 1 both make token 4"):
        check_merge_order({(1, 2): 4, (2, 1): 4}, 5)
    with pytest.raises(GlassError, match="not in the vocab"):
        check_merge_order({(1, 9): 4}, 5)
    vocab = [bytes([b]) for b in range(256)] + [b"ab"]
    with pytest.raises(GlassError, match="is not token 256"):
        Tokenizer(vocab, {(97, 99): 256})
    with pytest.raises(GlassError, match="byte 0x00 is not a token"):
        Tokenizer(vocab[1:], {})
