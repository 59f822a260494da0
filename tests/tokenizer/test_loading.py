"""Loading a tokenizer fast, with the same tables and the same refusals.

Oracles: the ``regex`` module asked one character at a time (for the class table), an
explicit loop over GPT-2-format files with transformers' byte alphabet (for ``read_gpt2``),
and the merge-by-merge checks (for the refusals).
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
import regex

from glassgpt.errors import GlassError
from glassgpt.tokenizer import Tokenizer, classes
from glassgpt.tokenizer.files import bytes_to_unicode, read_gpt2, token_to_str
from glassgpt.tokenizer.merge import check_merge_order, check_tables

LETTERS = "sdmtlver"


def one_by_one(c: str) -> int:
    """The table's entry for ``c``, from the regex module asked about ``c`` alone."""
    group = next(
        (g for g, cls in ((3, r"\s"), (2, r"\p{N}"), (1, r"\p{L}")) if regex.fullmatch(cls, c)),
        0,
    )
    case = next((k + 1 for k, x in enumerate(LETTERS) if regex.fullmatch(f"(?i:{x})", c)), 0)
    return group | case << 2


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GLASSGPT_CACHE_DIR", str(tmp_path / "cache"))
    classes.class_table.cache_clear()
    yield tmp_path / "cache"
    classes.class_table.cache_clear()


def test_table_is_the_regex_modules_classes() -> None:
    table = classes.compute_table()
    points = [*range(0, 0x3400), *range(0x3400, 0x110000, 61), 0x558, 0x17F, 0x212A, 0x1E9E]
    points = [p for p in points if not 0xD800 <= p < 0xE000]
    assert [table[p] for p in points] == [one_by_one(chr(p)) for p in points]


def test_table_is_computed_once_then_read_from_the_user_cache(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = classes.class_table()
    path = classes.cache_path()
    assert path.parent == cache_dir and path.exists()
    assert zlib.decompress(path.read_bytes()) == table == classes.compute_table()

    def no_compute() -> bytes:
        raise AssertionError("computed again although the cache holds it")

    monkeypatch.setattr(classes, "compute_table", no_compute)
    classes.class_table.cache_clear()
    assert classes.class_table() == table


def test_a_corrupt_cache_is_computed_again(cache_dir: Path) -> None:
    path = classes.cache_path()
    path.parent.mkdir(parents=True)
    good = zlib.compress(classes.compute_table(), 9)
    for bad in (good[: len(good) // 2], zlib.compress(b"\x01" * 100), b"not zlib"):
        path.write_bytes(bad)
        classes.class_table.cache_clear()
        assert classes.class_table() == classes.compute_table()
        assert path.read_bytes() == good  # and written back whole


def test_an_unwritable_cache_folder_still_gives_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("GLASSGPT_CACHE_DIR", str(blocker / "cache"))
    classes.class_table.cache_clear()
    try:
        assert classes.class_table() == classes.compute_table()
    finally:
        classes.class_table.cache_clear()


def test_the_cache_file_is_keyed_by_the_regex_version(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = classes.cache_path()
    monkeypatch.setattr(regex, "__version__", "0.0.0")
    assert classes.cache_path() != before and "0.0.0" in classes.cache_path().name


# ---- GPT-2's files --------------------------------------------------------------------


def write_gpt2(folder: Path, merges: list[tuple[bytes, bytes]], extra: dict | None = None):
    """encoder.json and vocab.bpe for 256 bytes + ``merges``, in GPT-2's printable form."""
    alphabet = bytes_to_unicode()
    vocab = [bytes([b]) for b in sorted(range(256), key=lambda b: alphabet[b])]
    vocab += [a + b for a, b in merges]
    encoder = {token_to_str(t): i for i, t in enumerate(vocab)}
    encoder["<|endoftext|>"] = len(vocab)
    encoder.update(extra or {})
    lines = ["#version: 0.2"] + [f"{token_to_str(a)} {token_to_str(b)}" for a, b in merges]
    (folder / "encoder.json").write_text(json.dumps(encoder), encoding="utf-8")
    (folder / "vocab.bpe").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder / "encoder.json", folder / "vocab.bpe"


def test_read_gpt2_equals_an_explicit_loop(tmp_path: Path, hf_unicode_to_byte) -> None:
    merges = [(b" ", b"t"), (b"h", b"e"), (b" t", b"he"), (b"\n", b"\n"), (b"\xc3", b"\xa9")]
    enc, bpe = write_gpt2(tmp_path, merges)
    vocab, pairs, specials = read_gpt2(enc, bpe)
    encoder = json.loads(enc.read_text(encoding="utf-8"))
    want_vocab = [b""] * (len(encoder) - 1)
    for text, i in encoder.items():
        if text != "<|endoftext|>":
            want_vocab[i] = bytes(hf_unicode_to_byte[c] for c in text)
    ids = {t: i for i, t in enumerate(want_vocab)}
    want_pairs = {(ids[a], ids[b]): ids[a + b] for a, b in merges}
    assert vocab == want_vocab
    assert list(pairs.items()) == list(want_pairs.items())  # in rank order
    assert specials == {"<|endoftext|>": 256 + len(merges)}
    tok = Tokenizer.from_gpt2(enc, bpe)
    assert tok.decode(tok.encode(" the\n\né")) == " the\n\né"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("id", r"token 'x' has id 300; ids must be 0\.\.256, once each"),
        ("alphabet", r"token ' ' is not in GPT-2's byte alphabet"),
        ("merge", r"line 2 is not a merge of two known tokens: 'Ġ q'"),
        ("spaces", r"line 2 is not a merge of two known tokens: 'Ġ t h'"),
    ],
)
def test_read_gpt2_refuses_bad_files(tmp_path: Path, change: str, message: str) -> None:
    enc, bpe = write_gpt2(tmp_path, [(b" ", b"t")])
    encoder = json.loads(enc.read_text(encoding="utf-8"))
    if change == "id":
        encoder["x"], encoder["Ġt"] = 300, encoder.pop("x")
    elif change == "alphabet":
        encoder[" "] = encoder.pop("Ġt")
    enc.write_text(json.dumps(encoder), encoding="utf-8")
    if change in ("merge", "spaces"):
        bpe.write_text("#version: 0.2\n" + ("Ġ q\n" if change == "merge" else "Ġ t h\n"))
    with pytest.raises(GlassError, match=message):
        read_gpt2(enc, bpe)


def test_read_gpt2_of_no_merges(tmp_path: Path) -> None:
    enc, bpe = write_gpt2(tmp_path, [])
    vocab, pairs, _ = read_gpt2(enc, bpe)
    assert len(vocab) == 256 and pairs == {}


@pytest.mark.parametrize(
    ("vocab_end", "merges", "message"),
    [
        ([b"ab", b"ab"], {(97, 98): 256}, r"tokens 256 and 257 are both b'ab'"),
        ([b""], {}, r"token 256 is empty"),
        ([b"ab"], {(97, 99): 256}, r"merge 0: b'a' \+ b'c' is not token 256 b'ab'"),
        ([b"ab", b"abc"], {(256, 99): 257, (97, 98): 256}, r"merge 0 \(256, 99\) -> 257 uses"),
        ([b"ab"], {(97, 98): 256, (97, 99): 256}, r"merges 0 and 1 both make token 256"),
        ([b"ab"], {(97, 98): 999}, r"id 999 is not in the vocab"),
    ],
)
def test_check_tables_refusals(vocab_end: list[bytes], merges: dict, message: str) -> None:
    vocab = [bytes([b]) for b in range(256)] + vocab_end
    with pytest.raises(GlassError, match=message):
        check_tables(vocab, merges, {})


def test_check_merge_order_accepts_what_the_loop_accepts() -> None:
    check_merge_order({(1, 2): 4, (4, 3): 5, (5, 5): 6}, 7)
    with pytest.raises(GlassError, match="uses token 6, which merge 0 makes"):
        check_merge_order({(6, 1): 6}, 7)


def test_importing_the_tokenizer_does_not_import_torch(imports_after) -> None:
    """Text ↔ ids needs no tensors: ``glassgpt tokenizer`` and the tokenizer's users stay
    light (``glassgpt.interop``, above the model, imports torch with the GPT)."""
    assert imports_after("import glassgpt.tokenizer", ["torch"]) == []
