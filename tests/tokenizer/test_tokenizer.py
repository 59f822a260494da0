"""Tokenizer: training wrapper, files, batch encoding, decoding errors, the char tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.tokenizer.strategies import texts

from glassgpt.errors import ConfigError, GlassError, InputFileError
from glassgpt.tokenizer import CharTokenizer, Tokenizer, load_tokenizer, parallel
from glassgpt.tokenizer.pretokenize import PATTERNS

# --- training -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(shakespeare_path: Path) -> Tokenizer:
    return Tokenizer.train(
        [shakespeare_path], 1024, pattern="gpt4", special_tokens=["<|endoftext|>"]
    )


def test_train_builds_the_documented_vocab(trained: Tokenizer) -> None:
    assert trained.n_vocab == 1024
    assert trained.vocab[:256] == [bytes([b]) for b in range(256)]
    assert trained.special_tokens == {"<|endoftext|>": 1023}
    assert len(trained.merges) == 1024 - 256 - 1
    for rank, ((a, b), c) in enumerate(trained.merges.items()):
        assert c == 256 + rank
        assert trained.vocab[c] == trained.vocab[a] + trained.vocab[b]
    assert trained.pattern_name == "gpt4"


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_trained_ids_equal_tiktoken_with_the_same_vocab(
    pattern, shakespeare_text, stdlib_text
) -> None:
    tiktoken = pytest.importorskip("tiktoken")
    tok = Tokenizer.train([shakespeare_text], 2048, pattern=pattern)
    ranks = {t: i for i, t in enumerate(tok.vocab)}
    theirs = tiktoken.Encoding(
        "trained", pat_str=PATTERNS[pattern], mergeable_ranks=ranks, special_tokens={}
    )
    for text in (shakespeare_text[:300_000], stdlib_text[:300_000]):
        assert tok.encode_ordinary(text) == theirs.encode_ordinary(text)


def test_train_from_str_and_path_agree(tmp_path: Path) -> None:
    texts = ["the cat sat on the mat. " * 20, "the hat; the bat! 123 456"]
    paths = []
    for i, t in enumerate(texts):
        paths.append(tmp_path / f"{i}.txt")
        paths[-1].write_text(t, encoding="utf-8")
    a = Tokenizer.train(texts, 300)
    b = Tokenizer.train(paths, 300)
    assert a.vocab == b.vocab and a.merges == b.merges
    assert b"the" in a.vocab and b" the" in a.vocab


def test_train_keeps_special_strings_out_of_merges() -> None:
    tok = Tokenizer.train(["ab<|sep|>" * 50], 300, pattern=None, special_tokens=["<|sep|>"])
    assert not any(b"<|" in t for t in tok.vocab[256:])
    assert tok.encode("ab<|sep|>", allowed_special="all")[-1] == tok.special_tokens["<|sep|>"]


def test_train_bad_input(tmp_path: Path) -> None:
    with pytest.raises(GlassError, match="empty corpus"):
        Tokenizer.train(["", ""], 300)
    with pytest.raises(ConfigError, match="vocab_size: must be at least 256 \\+ 2"):
        Tokenizer.train(["abc"], 257, special_tokens=["<a>", "<b>"])
    with pytest.raises(InputFileError, match=r"input file not found: .*missing\.txt"):
        Tokenizer.train([tmp_path / "missing.txt"], 300)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café au lait".encode() + b" na\xefve")
    with pytest.raises(InputFileError, match=r"latin1.txt: not UTF-8 at byte offset 16"):
        Tokenizer.train([bad], 300)


# --- save / load ----------------------------------------------------------------------------


def test_save_load_round_trip(trained: Tokenizer, tmp_path: Path, shakespeare_text: str) -> None:
    path = tmp_path / "tok.json"
    trained.save(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert (data["format"], data["version"], data["kind"]) == ("glassgpt-tokenizer", 1, "bpe")
    for loaded in (Tokenizer.load(path), load_tokenizer(path)):
        assert isinstance(loaded, Tokenizer)
        assert loaded.vocab == trained.vocab and loaded.merges == trained.merges
        assert loaded.special_tokens == trained.special_tokens and loaded.pattern == trained.pattern
        text = shakespeare_text[:5000]
        assert loaded.encode(text) == trained.encode(text)


def test_gpt2_save_load_keeps_ids(gpt2_tok: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "gpt2.json"
    gpt2_tok.save(path)
    loaded = load_tokenizer(path)
    assert loaded.vocab == gpt2_tok.vocab and loaded.merges == gpt2_tok.merges
    assert loaded.encode("Hello world<|endoftext|>", allowed_special="all") == [15496, 995, 50256]


def test_load_bad_files(tmp_path: Path, trained: Tokenizer) -> None:
    path = tmp_path / "tok.json"
    data = trained.to_dict()
    path.write_text(json.dumps({**data, "version": 7}), encoding="utf-8")
    with pytest.raises(InputFileError, match="version 7 is not supported"):
        load_tokenizer(path)
    path.write_text(json.dumps({"hello": 1}), encoding="utf-8")
    with pytest.raises(InputFileError, match="not a glassgpt tokenizer file"):
        Tokenizer.load(path)
    path.write_text("{oops", encoding="utf-8")
    with pytest.raises(InputFileError, match="invalid JSON"):
        load_tokenizer(path)
    path.write_text(json.dumps({**data, "merges": [[1, 2]]}), encoding="utf-8")
    with pytest.raises(GlassError, match="malformed bpe tokenizer"):
        load_tokenizer(path)
    path.write_text(json.dumps({**data, "kind": "char"}), encoding="utf-8")
    with pytest.raises(GlassError, match="malformed char tokenizer"):
        load_tokenizer(path)
    with pytest.raises(InputFileError, match="holds a 'char' tokenizer"):
        Tokenizer.load(path)


# --- batch ----------------------------------------------------------------------------------


@pytest.mark.parametrize("allowed", [frozenset(), "all"])
def test_encode_batch_on_processes_equals_encode(
    gpt2_tok: Tokenizer, shakespeare_text: str, monkeypatch, allowed
) -> None:
    monkeypatch.setattr(parallel, "PARALLEL_MIN_CHARS", 1000)
    text = shakespeare_text[:60_000]
    texts = [text, "", "a <|endoftext|> b" * 3, text[:999], text[5:30_000]]
    kw = {"allowed_special": allowed, "disallowed_special": ()}
    expected = [gpt2_tok.encode(t, **kw) for t in texts]
    assert gpt2_tok.encode_batch(texts, num_workers=3, **kw) == expected
    # one long text alone is cut at safe spaces
    assert gpt2_tok.encode_batch([text], num_workers=2) == [gpt2_tok.encode(text)]


def test_encode_batch_raises_on_disallowed_special(gpt2_tok: Tokenizer, monkeypatch) -> None:
    monkeypatch.setattr(parallel, "PARALLEL_MIN_CHARS", 10)
    with pytest.raises(GlassError, match="special token"):
        gpt2_tok.encode_batch(["x" * 100, "y <|endoftext|>"], num_workers=2)
    with pytest.raises(GlassError, match="list of texts"):
        gpt2_tok.encode_batch("not a list")


@given(st.lists(texts, max_size=6))
def test_encode_ordinary_many_equals_one_by_one(gpt2_tok: Tokenizer, batch: list[str]) -> None:
    batch = [*batch, "", " x  \n", "a\ud800 b"]
    assert gpt2_tok.encode_ordinary_many(batch) == [gpt2_tok.encode_ordinary(t) for t in batch]


@given(st.text(st.sampled_from("ab \n\t."), max_size=200), st.integers(1, 200))
def test_plan_covers_every_character_once(text: str, room: int) -> None:
    texts = [text, text[::-1]]
    shares = parallel.plan([len(t) for t in texts], 3, True, texts)
    assert len(shares) <= 3
    for i, t in enumerate(texts):
        jobs = [(a, b) for share in shares for (j, a, b) in share if j == i]
        assert "".join(t[a:b] for a, b in jobs) == t
        assert all(parallel.safe_cut(t, a) == a for a, _ in jobs[1:])


# --- decoding -------------------------------------------------------------------------------


def test_decode_accepts_arrays_and_rejects_bad_ids(gpt2_tok: Tokenizer) -> None:
    ids = gpt2_tok.encode("Hello world")
    assert gpt2_tok.decode(np.array(ids)) == "Hello world"
    assert gpt2_tok.decode(iter(ids)) == "Hello world"
    assert gpt2_tok.decode([]) == ""
    for bad in ([50257], [-1], [3, -50_000], [10**9], [1, "2"], [1.0, 2]):
        with pytest.raises(GlassError, match="is not in this tokenizer"):
            gpt2_tok.decode(bad)
    assert gpt2_tok.decode_bytes([50256]) == b"<|endoftext|>"


def test_decode_invalid_utf8_is_replaced() -> None:
    tok = Tokenizer.bytes_only()
    assert tok.decode([0xE2, 0x82]) == "\ufffd"
    assert tok.decode_bytes([0xE2, 0x82]) == b"\xe2\x82"


# --- the char tokenizer ---------------------------------------------------------------------


def test_char_tokenizer(shakespeare_path: Path, shakespeare_text: str, tmp_path: Path) -> None:
    tok = CharTokenizer.train(shakespeare_path, special_tokens=["<|endoftext|>"])
    assert tok.chars == sorted(set(shakespeare_text))
    assert tok.n_vocab == len(set(shakespeare_text)) + 1
    ids = tok.encode(shakespeare_text[:1000])
    assert ids == [tok.chars.index(c) for c in shakespeare_text[:1000]]
    assert tok.decode(ids) == shakespeare_text[:1000]
    assert tok.encode("a<|endoftext|>", allowed_special="all") == [
        tok.chars.index("a"),
        len(tok.chars),
    ]
    with pytest.raises(GlassError, match="special token"):
        tok.encode("a<|endoftext|>")
    with pytest.raises(GlassError, match="'é' \\(U\\+00E9\\) at position 1"):
        tok.encode("aé")
    with pytest.raises(GlassError, match="token id 99"):
        tok.decode([99])
    path = tmp_path / "char.json"
    tok.save(path)
    loaded = load_tokenizer(path)
    assert isinstance(loaded, CharTokenizer)
    assert loaded.chars == tok.chars and loaded.special_tokens == tok.special_tokens
    assert CharTokenizer.load(path).encode_batch(["First", "Citizen"]) == [
        tok.encode("First"),
        tok.encode("Citizen"),
    ]


def test_char_tokenizer_bad_input(tmp_path: Path) -> None:
    with pytest.raises(GlassError, match="empty corpus"):
        CharTokenizer.train([""])
    with pytest.raises(GlassError, match="appears twice"):
        CharTokenizer(["a", "a"])
