"""The fast engines against the reference, the Python merge loop of bpe.py.

The compiled engine (``_fastbpe``) encodes where it is built; the tests marked with the
``no_compiled`` fixture hide it, as an install without a C compiler would, so that
tiktoken's core (the fallback) is held to the same ids. test_fastbpe.py tests the compiled
engine in depth.
"""

from __future__ import annotations

import sys
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.interop.test_tokenizer_export import _merges_from_draws
from tests.tokenizer.strategies import texts

from glassgpt.interop.tiktoken_format import tiktoken_mismatches
from glassgpt.tokenizer import Tokenizer, engine
from glassgpt.tokenizer.engine import EngineFallbackWarning, tiktoken_agrees

pytest.importorskip("tiktoken")


def reference(tok: Tokenizer) -> Tokenizer:
    """The same tokenizer, encoding with the Python merge loop only."""
    ref = Tokenizer(tok.vocab, tok.merges, pattern=tok.pattern, special_tokens=tok.special_tokens)
    ref.fast = False
    return ref


@pytest.fixture(scope="module")
def gpt2_ref(gpt2_tok: Tokenizer) -> Tokenizer:
    return reference(gpt2_tok)


@pytest.fixture(scope="module", params=["gpt2", "gpt4"])
def trained(request, shakespeare_text: str) -> tuple[Tokenizer, Tokenizer]:
    """A tokenizer trained by glassgpt (fast) and its reference twin."""
    tok = Tokenizer.train(
        shakespeare_text[:300_000], 1024, pattern=request.param, special_tokens=["<|end|>"]
    )
    return tok, reference(tok)


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch) -> None:
    monkeypatch.setattr(engine, "_warned", set())


@pytest.fixture
def no_compiled(monkeypatch) -> None:
    """As if the extension were not built: ``from glassgpt.tokenizer import _fastbpe`` fails."""
    monkeypatch.setitem(sys.modules, "glassgpt.tokenizer._fastbpe", None)


def fresh(tok: Tokenizer) -> Tokenizer:
    """The same tokenizer, with no engine built yet."""
    return Tokenizer(tok.vocab, tok.merges, pattern=tok.pattern, special_tokens=tok.special_tokens)


def test_gpt2_and_trained_tokenizers_use_the_engine(gpt2_tok, trained) -> None:
    for tok in (gpt2_tok, trained[0]):
        assert tiktoken_agrees(tok) is None
        assert tok.engine() is not None
    assert trained[1].engine() is None  # fast = False


@settings(max_examples=150, deadline=None)
@given(text=texts)
def test_engine_ids_equal_reference_on_generated_text(gpt2_tok, gpt2_ref, trained, text) -> None:
    assert gpt2_tok.encode_ordinary(text) == gpt2_ref.encode_ordinary(text)
    tok, ref = trained
    assert tok.encode_ordinary(text) == ref.encode_ordinary(text)


@settings(max_examples=60, deadline=None)
@given(text=texts)
def test_special_tokens_policy_unchanged(gpt2_tok, gpt2_ref, text) -> None:
    for kwargs in ({"allowed_special": "all"}, {"disallowed_special": ()}, {}):
        try:
            expected = gpt2_ref.encode(text, **kwargs)
        except Exception as err:  # the reference refuses: so must the engine, the same way
            with pytest.raises(type(err)):
                gpt2_tok.encode(text, **kwargs)
        else:
            assert gpt2_tok.encode(text, **kwargs) == expected


def test_whole_corpora_equal_reference(gpt2_tok, gpt2_ref, trained, shakespeare_text, stdlib_text):
    tok, ref = trained
    for text in (shakespeare_text, stdlib_text[:1_000_000]):
        assert gpt2_tok.encode_ordinary(text) == gpt2_ref.encode_ordinary(text)
        assert tok.encode_ordinary(text) == ref.encode_ordinary(text)
    texts = [stdlib_text[k : k + 40_000] for k in range(0, 400_000, 40_000)]
    assert gpt2_tok.encode_batch(texts, num_workers=2) == gpt2_ref.encode_batch(
        texts, num_workers=1
    )


def test_without_the_extension_tiktoken_encodes_after_one_warning(
    no_compiled, gpt2_tok, gpt2_ref, trained
) -> None:
    tok = fresh(gpt2_tok)
    with pytest.warns(EngineFallbackWarning, match="_fastbpe is not built.*tiktoken's core"):
        assert type(tok.engine()).__name__ == "Encoding"  # tiktoken's
    assert tok.encode_ordinary("a b'll") == gpt2_ref.encode_ordinary("a b'll")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once only
        other, ref = fresh(trained[0]), trained[1]
        assert type(other.engine()).__name__ == "Encoding"
        assert other.encode_ordinary("a b'll") == ref.encode_ordinary("a b'll")


@pytest.mark.filterwarnings("ignore:the compiled encoder")
def test_characters_the_engines_class_differently_fall_back(no_compiled, gpt2_tok, gpt2_ref):
    tok = fresh(gpt2_tok)
    text = "Ֆ\u0558 x\U0003ed9b1 \u0558"  # U+0558 and U+3ED9B are letters for regex only
    with pytest.warns(EngineFallbackWarning, match="Unicode tables"):
        ids = tok.encode_ordinary(text)
    assert ids == gpt2_ref.encode_ordinary(text)
    assert tok.engine() is not None  # other texts still use it


def test_the_compiled_engine_classes_as_regex_does(gpt2_tok, gpt2_ref) -> None:
    pytest.importorskip("glassgpt.tokenizer._fastbpe", reason="the extension is not built")
    text = "Ֆ\u0558 x\U0003ed9b1 \u0558"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback: the classes are regex's own
        assert gpt2_tok.encode_ordinary(text) == gpt2_ref.encode_ordinary(text)


def test_lone_surrogates_equal_reference(gpt2_tok, gpt2_ref) -> None:
    text = "a\ud800b \udfff\U0001f642"
    assert gpt2_tok.encode_ordinary(text) == gpt2_ref.encode_ordinary(text)


@pytest.mark.parametrize(
    ("pattern", "why"), [(None, "no pattern"), (r"\w+|\W+", "a custom pattern")]
)  # the same with or without the extension
def test_other_patterns_warn_once_and_use_the_python_loop(pattern, why) -> None:
    tok = Tokenizer.from_merges([(b"a", b"b")], pattern=pattern)
    with pytest.warns(EngineFallbackWarning, match=why):
        assert tok.encode_ordinary("abab") == [256, 256]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Tokenizer.from_merges([], pattern=pattern).encode("ab") == [97, 98]
    assert tok.engine() is None


def test_vocab_tiktoken_cannot_reproduce_warns_and_keeps_the_reference_ids(no_compiled) -> None:
    # 'abc' is merge ab + c, but our loop on "abc" merges b + c first: tiktoken would make
    # 'abc' from a + bc, and so encode "abc" as one token where we give two.
    tok = Tokenizer.from_merges([(b"b", b"c"), (b"a", b"b"), (b"ab", b"c")])
    with pytest.warns(EngineFallbackWarning, match="rank order"):
        assert tok.encode("abc") == [97, 256]
    assert tok.engine() is None


@settings(max_examples=200, deadline=None)
@given(
    draws=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=12),
    samples=st.lists(st.text("abc ", max_size=16), min_size=1, max_size=6),
)
def test_agreement_check_on_random_vocabularies(draws, samples) -> None:
    """tiktoken_agrees gives the slower check's verdict; either way the ids are the reference's."""
    tok = Tokenizer.from_merges(_merges_from_draws(draws))
    ref = reference(tok)
    assert (tiktoken_agrees(tok) is None) == (tiktoken_mismatches(tok) == [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EngineFallbackWarning)
        for text in samples:
            assert tok.encode_ordinary(text) == ref.encode_ordinary(text)
