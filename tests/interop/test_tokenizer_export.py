"""Export to / import from tiktoken's .tiktoken and HF tokenizer.json: the other library, loading
our file, must give our ids; importing must give back the same tokenizer."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from glassgpt.errors import GlassError
from glassgpt.interop.hf_tokenizers import (
    load_tokenizer_json,
    save_tokenizer_json,
    to_tokenizer_json,
    unicode_to_bytes,
)
from glassgpt.interop.tiktoken_format import (
    TiktokenMismatchWarning,
    load_tiktoken,
    merges_from_ranks,
    save_tiktoken,
    tiktoken_mismatches,
    to_tiktoken_encoding,
)
from glassgpt.tokenizer import FamilyTokenizer, Tokenizer
from glassgpt.tokenizer.files import token_to_str

tiktoken = pytest.importorskip("tiktoken")
tokenizers = pytest.importorskip("tokenizers")

END = "<|endoftext|>"

# Text that stresses the split and the merges: ASCII words, contractions, digit runs,
# whitespace runs of every kind, accents, CJK, emoji, and the special token's string.
PIECES = [
    "the", " the", "The", " King", "'s", "'ll", "'S", "'LL", " 2024", "1234567", "  ", "\n",
    "\n\n", "\t", "\r\n", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\u00a0", "\u2009",
    "\u2028", "\u3000", " café", "naïve", "ſ", "\u212a", "e\u0301", "日本語", "١٢٣", "１２",
    "½", "🙂", "👍🏽", "!!", " ...", "—", "?\n", "    return x", "\x00", "\x7f", END,
]  # fmt: skip
pieces = st.sampled_from(PIECES)
# Code points unassigned in Python's Unicode (Cn) are left out: the `regex` module knows a
# newer Unicode, where some are letters, than tiktoken and HF do (a split difference).
any_chars = st.text(st.characters(exclude_categories=("Cs", "Cn")), max_size=8)
text_st = st.lists(pieces | any_chars, max_size=24).map("".join)


def same_ids(tok: Tokenizer, text: str, other: object, *, hf: bool = False) -> None:
    """``other`` (a tiktoken Encoding or an HF Tokenizer) encodes ``text`` as ``tok`` does."""
    ours = tok.encode(text, allowed_special="all")
    theirs = other.encode(text).ids if hf else other.encode(text, allowed_special="all")  # type: ignore[attr-defined]
    assert theirs == ours


@pytest.fixture(scope="module")
def trained(shakespeare_text: str) -> Tokenizer:
    return Tokenizer.train(shakespeare_text, 1500, special_tokens=[END])


@pytest.fixture(scope="module")
def small_texts(shakespeare_text: str) -> str:
    return shakespeare_text[:200_000] + " héllo wörld 日本語 🙂 1234567 \r\n\t x"


# --- tiktoken -----------------------------------------------------------------------------------


def load_with_tiktoken(path: Path, tok: Tokenizer) -> object:
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(path))
    return tiktoken.Encoding(
        "t", pat_str=tok.pattern, mergeable_ranks=ranks, special_tokens=tok.special_tokens
    )


def test_tiktoken_loads_our_file_with_the_same_ids(
    trained: Tokenizer, shakespeare_text: str, tmp_path: Path
) -> None:
    path = tmp_path / "shakespeare.tiktoken"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a trained vocabulary passes the check: no warning
        save_tiktoken(trained, path)
    enc = load_with_tiktoken(path, trained)
    assert enc.encode_ordinary(shakespeare_text) == trained.encode(shakespeare_text)  # type: ignore[attr-defined]
    same_ids(trained, f"To be{END} or not", enc)


@given(text=text_st)
def test_tiktoken_same_ids_on_any_text(trained: Tokenizer, text: str) -> None:
    same_ids(trained, text, _encoding(trained))


_ENCODINGS: dict[int, object] = {}


def _encoding(tok: Tokenizer) -> object:
    return _ENCODINGS.setdefault(id(tok), to_tiktoken_encoding(tok))


def test_load_tiktoken_gives_back_the_tokenizer(trained: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "t.tiktoken"
    save_tiktoken(trained, path)
    back = load_tiktoken(path, pattern="gpt2", special_tokens=trained.special_tokens)
    assert back.vocab == trained.vocab
    assert list(back.merges.items()) == list(trained.merges.items())
    assert back.special_tokens == trained.special_tokens and back.pattern == trained.pattern


@pytest.fixture(scope="module")
def gpt2(gpt2_files: tuple[Path, Path]) -> Tokenizer:
    return Tokenizer.from_gpt2(*gpt2_files)


def test_gpt2_vocabulary_round_trips_through_tiktoken(gpt2: Tokenizer, tmp_path: Path) -> None:
    assert tiktoken_mismatches(gpt2) == []
    save_tiktoken(gpt2, tmp_path / "gpt2.tiktoken", check=False)  # just checked
    back = load_tiktoken(
        tmp_path / "gpt2.tiktoken", pattern="gpt2", special_tokens=gpt2.special_tokens
    )
    assert list(back.merges.items()) == list(gpt2.merges.items())


def test_gpt2_vocabulary_in_hf(gpt2: Tokenizer, shakespeare_text: str, tmp_path: Path) -> None:
    save_tokenizer_json(gpt2, tmp_path / "tokenizer.json")
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = shakespeare_text[:100_000] + f" naïve café 日本語 🙂{END}  12345\r\n"
    same_ids(gpt2, text, hf, hf=True)
    back = load_tokenizer_json(tmp_path / "tokenizer.json")
    assert (back.vocab, back.merges, back.special_tokens) == (
        gpt2.vocab,
        gpt2.merges,
        gpt2.special_tokens,
    )


# --- the pair-merge vs rank-of-concatenation check ------------------------------------------


def test_check_finds_a_vocabulary_where_tiktoken_differs(tmp_path: Path) -> None:
    # Merges a·b, b·c, then a·bc. Our encoder on "abc": a·b first → [ab, c], and no merge
    # joins ab·c. tiktoken joins any adjacent pair whose bytes are a token: ab + c = "abc".
    tok = Tokenizer.from_merges([(b"a", b"b"), (b"b", b"c"), (b"a", b"bc")], pattern=None)
    enc = to_tiktoken_encoding(tok)
    assert tok.encode("abc") == [256, ord("c")]
    assert enc.encode("abc") == [258]
    problems = tiktoken_mismatches(tok)
    assert len(problems) == 1 and "b'abc'" in problems[0]
    with pytest.warns(TiktokenMismatchWarning, match="merges differ"):
        save_tiktoken(tok, tmp_path / "odd.tiktoken")


def _merges_from_draws(draws: list[tuple[int, int]]) -> list[tuple[bytes, bytes]]:
    tokens = [b"a", b"b", b"c"]
    merges = []
    for i, j in draws:
        x, y = tokens[i % len(tokens)], tokens[j % len(tokens)]
        if x + y not in tokens:
            tokens.append(x + y)
            merges.append((x, y))
    return merges


@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=14),
    st.lists(st.text(alphabet="abc", max_size=16), min_size=1, max_size=8),
)
def test_check_passing_means_same_ids(draws: list[tuple[int, int]], texts: list[str]) -> None:
    # Arbitrary merge lists (not only trained ones) and no split, so chunks are long: when
    # the check passes, tiktoken must agree with us on every text.
    tok = Tokenizer.from_merges(_merges_from_draws(draws), pattern=None)
    if tiktoken_mismatches(tok):
        return
    enc = to_tiktoken_encoding(tok)
    for text in texts:
        assert enc.encode_ordinary(text) == tok.encode(text)


@given(
    st.dictionaries(
        st.text(alphabet="ab c", min_size=1, max_size=14), st.integers(1, 5), max_size=8
    )
)
def test_trained_vocabularies_pass_the_check(corpus: dict[str, int]) -> None:
    text = "".join(chunk * n for chunk, n in corpus.items())
    if not text:
        return
    tok = Tokenizer.train(text, 256 + 30, pattern=None)
    assert tiktoken_mismatches(tok) == []


def test_merges_from_ranks_rejects_an_unreachable_token() -> None:
    vocab = [bytes([b]) for b in range(256)] + [b"abc"]  # no two lower-ranked parts
    with pytest.raises(GlassError, match="cannot be built"):
        merges_from_ranks(vocab)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("YQ== 0\nnot-base64! 1\n", ":2: expected"),
        ("YQ== 0\nYg== 0\n", "rank 0 appears twice"),
        ("YQ== 1\n", "rank 0 is missing"),
        ("", "empty"),
    ],
)
def test_bad_tiktoken_files_raise(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.tiktoken"
    path.write_text(content)
    with pytest.raises(GlassError, match=message):
        load_tiktoken(path)


def test_missing_tiktoken_file_raises(tmp_path: Path) -> None:
    with pytest.raises(GlassError, match="not found"):
        load_tiktoken(tmp_path / "nope.tiktoken")


# --- HF tokenizer.json --------------------------------------------------------------------------


def test_hf_loads_our_file_with_the_same_ids(
    trained: Tokenizer, shakespeare_text: str, tmp_path: Path
) -> None:
    path = tmp_path / "tokenizer.json"
    save_tokenizer_json(trained, path)
    hf = tokenizers.Tokenizer.from_file(str(path))
    assert hf.encode(shakespeare_text).ids == trained.encode(shakespeare_text)
    same_ids(trained, f"To be{END} or not", hf, hf=True)
    assert hf.decode(trained.encode("héllo 🙂 world")) == "héllo 🙂 world"


@given(text=text_st)
def test_hf_same_ids_on_any_text(
    trained: Tokenizer, text: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    same_ids(trained, text, _hf(trained, tmp_path_factory), hf=True)


_HF: dict[int, object] = {}


def _hf(tok: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> object:
    if id(tok) not in _HF:
        path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
        save_tokenizer_json(tok, path)
        _HF[id(tok)] = tokenizers.Tokenizer.from_file(str(path))
    return _HF[id(tok)]


def test_load_tokenizer_json_gives_back_the_tokenizer(trained: Tokenizer, tmp_path: Path) -> None:
    save_tokenizer_json(trained, tmp_path / "tokenizer.json")
    back = load_tokenizer_json(tmp_path / "tokenizer.json")
    assert back.vocab == trained.vocab
    assert list(back.merges.items()) == list(trained.merges.items())
    assert back.special_tokens == trained.special_tokens and back.pattern_name == "gpt2"


@pytest.mark.parametrize("pattern", ["gpt4", None])
def test_other_patterns_in_both_formats(
    small_texts: str, pattern: str | None, tmp_path: Path
) -> None:
    tok = Tokenizer.train(small_texts, 700, pattern=pattern, special_tokens=[END])
    sample = small_texts[-3000:] + f"{END} it's 12345  \n\n  x"
    save_tokenizer_json(tok, tmp_path / "tokenizer.json")
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    same_ids(tok, sample, hf, hf=True)
    same_ids(tok, sample, to_tiktoken_encoding(tok))
    back = load_tokenizer_json(tmp_path / "tokenizer.json")
    assert (back.pattern, back.vocab, back.merges) == (tok.pattern, tok.vocab, tok.merges)


@pytest.mark.slow
@given(text=text_st)
def test_gpt4_pattern_same_split_in_hf(text: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    # HF runs the pattern with Oniguruma, tiktoken with fancy-regex, we with `regex`.
    tok = _gpt4_bytes_only()
    same_ids(tok, text, _hf(tok, tmp_path_factory), hf=True)


_GPT4: list[Tokenizer] = []


def _gpt4_bytes_only() -> Tokenizer:
    if not _GPT4:
        _GPT4.append(
            Tokenizer.train("it's a test, 123 456\n", 300, pattern="gpt4", special_tokens=[END])
        )
    return _GPT4[0]


def test_import_an_hf_trained_tokenizer(shakespeare_text: str, tmp_path: Path) -> None:
    from tokenizers import models, pre_tokenizers, trainers

    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=800, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    hf.train_from_iterator([shakespeare_text], trainer=trainer)
    hf.add_special_tokens([END])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer_json(tmp_path / "tokenizer.json")
    assert tok.n_vocab == hf.get_vocab_size() == 801
    text = shakespeare_text[:50_000] + f"{END} naïve 🙂"
    assert tok.encode(text, allowed_special="all") == hf.encode(text).ids
    # BpeTrainer numbers the bytes in its own order, so ids differ from ours…
    assert tok.vocab[:256] != [bytes([b]) for b in range(256)]
    # …but the vocabulary and merges are those glassgpt learns from the same text.
    ours = Tokenizer.train(shakespeare_text, 800)
    assert [tok.vocab[c] for c in tok.merges.values()] == ours.vocab[256:]


def _tokenizer_json(tmp_path: Path, **changes: object) -> Path:
    tok = Tokenizer.from_merges([(b"a", b"b")])
    data = to_tokenizer_json(tok)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        target = data
        for key in parents:
            target = target[key]
        target[last] = value
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model__type": "WordPiece"}, "tokenizers library"),
        ({"decoder": {"type": "WordPiece"}}, "tokenizers library"),
        ({"model__continuing_subword_prefix": "##"}, "tokenizers library"),
        ({"model__merges": ["a zz"]}, "merge 0"),
        ({"model__vocab__a": 9999}, "id 97 is missing"),
        ({"added_tokens": [{"id": 3, "content": "<s>", "special": True}]}, "<s>"),
    ],
)
def test_unsupported_tokenizer_json_raises(tmp_path: Path, changes: dict, message: str) -> None:
    with pytest.raises(GlassError, match=message):
        load_tokenizer_json(_tokenizer_json(tmp_path, **changes))


@pytest.mark.parametrize(
    "changes",
    [
        {"normalizer": {"type": "NFC"}},
        {"pre_tokenizer": {"type": "Whitespace"}},
        {"pre_tokenizer__add_prefix_space": True},
        {"model__byte_fallback": True},
        {"post_processor": {"type": "TemplateProcessing", "single": [], "pair": [],
                            "special_tokens": {}}},
    ],
)  # fmt: skip
def test_what_glassgpt_cannot_express_is_the_familys_own(tmp_path: Path, changes: dict) -> None:
    # a valid file that glassgpt's Tokenizer does not express exactly: the library runs it
    path = _tokenizer_json(tmp_path, **changes)
    tok = load_tokenizer_json(path)
    assert isinstance(tok, FamilyTokenizer)
    assert tok.encode("ab ab") == tokenizers.Tokenizer.from_file(str(path)).encode("ab ab").ids


@pytest.mark.parametrize(
    ("content", "message"), [("{", "invalid JSON"), ("[1]", "not a tokenizer.json")]
)
def test_broken_tokenizer_json_raises(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(content)
    with pytest.raises(GlassError, match=message):
        load_tokenizer_json(path)


def test_byte_level_alphabet_round_trip() -> None:
    token = bytes(range(256))
    assert unicode_to_bytes(token_to_str(token)) == token
    with pytest.raises(GlassError, match="outside the ByteLevel alphabet"):
        unicode_to_bytes("a b")
