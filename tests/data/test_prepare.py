from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from glassgpt.data.prepare import prepare
from glassgpt.data.shards import DataDir, fingerprint_json
from glassgpt.errors import GlassError
from glassgpt.tokenizer import CharTokenizer

DOCS = [
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "    indented = True\n\tтабуляция ✓\n",
    "no newline at the end 🙂",
    "",  # an empty file contributes nothing
    "x\n" * 400,
]


def _write(tmp_path: Path, docs: list[str]) -> list[Path]:
    paths = []
    for i, doc in enumerate(docs):
        p = tmp_path / "in" / f"doc{i}.txt"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(doc.encode("utf-8"))
        paths.append(p)
    return paths


def _chars(text: str) -> CharTokenizer:
    return CharTokenizer(sorted(set(text)))


def _all_tokens(data: DataDir, split: str) -> np.ndarray:
    dtype = np.dtype(data.meta.dtype)
    parts = [np.fromfile(data.path / f, dtype=dtype) for f, _ in data.split(split).shards]
    return np.concatenate(parts) if parts else np.empty(0, dtype)


@pytest.mark.parametrize("eot", [False, True])
def test_round_trip_with_separators(tmp_path: Path, eot: bool) -> None:
    specials = ["<|endoftext|>"] if eot else []
    tok = CharTokenizer(sorted(set("".join(DOCS) + "\n")), special_tokens=specials)
    data = prepare(_write(tmp_path, DOCS), tmp_path / "out", tok, shard_tokens=100, piece_bytes=64)
    sep = "<|endoftext|>" if eot else "\n"
    expected = "".join(d + sep for d in DOCS if d)
    train, val = _all_tokens(data, "train"), _all_tokens(data, "val")
    assert tok.decode(np.concatenate([train, val])) == expected
    m = data.meta
    assert (m.separator_kind, m.separator_text) == (("special", sep) if eot else ("text", sep))
    assert m.separator_ids == tuple(tok.encode(sep) if not eot else [tok.special_tokens[sep]])
    # counts agree with the files
    for split, ids in (("train", train), ("val", val)):
        s = m.splits[split]
        assert s.tokens == len(ids) == sum(n for _, n in s.shards)
        assert all(n <= 100 for _, n in s.shards) and len(s.shards) == -(-len(ids) // 100)
        text_bytes = len(tok.decode(ids).replace("<|endoftext|>", "").encode("utf-8"))
        assert s.bytes == text_bytes
    assert m.splits["train"].documents + m.splits["val"].documents == 4
    total = sum(len(d.encode()) for d in DOCS)
    assert [n for _, n in m.sources] == [len(d.encode()) for d in DOCS]
    # val is about the last 10 % of the text: within one line of the target
    val_text = len(tok.decode(val).replace(sep, "").encode())
    assert abs(val_text - 0.1 * total) <= 64
    saved = (data.path / "tokenizer.json").read_bytes()
    assert m.tokenizer_fingerprint == fingerprint_json(saved)
    assert json.loads((data.path / "meta.json").read_text())["format"] == "glassgpt-data"


@pytest.mark.parametrize(
    ("offset", "dtype", "itemsize"), [(65536 - 8, "uint16", 2), (65536 - 7, "uint32", 4)]
)
def test_dtype_rule(tmp_path: Path, char_tok, offset: int, dtype: str, itemsize: int) -> None:
    text = "abcdefg\n"  # 8 distinct characters: the largest id is offset + 7
    tok = char_tok(text, offset=offset)
    data = prepare(_write(tmp_path, [text * 3]), tmp_path / "out", tok)
    assert data.meta.dtype == dtype and data.meta.n_vocab == offset + 8
    for split in ("train", "val"):
        for f, n in data.split(split).shards:
            assert (data.path / f).stat().st_size == n * itemsize
    ids = np.concatenate([_all_tokens(data, "train"), _all_tokens(data, "val")])
    assert ids.max() == offset + 7  # not truncated
    assert tok.decode(ids) == text * 3 + "\n"


def test_val_is_never_empty_for_tiny_inputs(tmp_path: Path) -> None:
    tok = _chars("ab\n")
    data = prepare(_write(tmp_path, ["ab"]), tmp_path / "out", tok, val_fraction=0.01)
    assert data.meta.splits["train"].tokens >= 1 and data.meta.splits["val"].tokens >= 1
    data = prepare(_write(tmp_path, ["ab"]), tmp_path / "out0", tok, val_fraction=0.0)
    assert data.meta.splits["val"].tokens == 0 and data.meta.splits["val"].shards == ()


def test_fingerprint_mismatch_is_refused(tmp_path: Path) -> None:
    tok = _chars("abc\n")
    data = prepare(_write(tmp_path, ["abcabc\n"]), tmp_path / "out", tok)
    DataDir.open(data.path, tokenizer=_chars("abc\n"))  # an equal tokenizer is fine
    with pytest.raises(GlassError, match="another tokenizer"):
        DataDir.open(data.path, tokenizer=_chars("abcd\n"))


def test_bad_folders(tmp_path: Path) -> None:
    tok = _chars("abc\n")
    out = tmp_path / "out"
    prepare(_write(tmp_path, ["abc\n" * 10]), out, tok)
    with pytest.raises(GlassError, match="already holds"):
        prepare(_write(tmp_path, ["abc\n"]), out, tok)
    prepare(_write(tmp_path, ["abc\n"]), out, tok, overwrite=True)
    with pytest.raises(GlassError, match="not found"):
        DataDir.open(tmp_path / "nowhere")
    with pytest.raises(GlassError, match=r"no meta\.json"):
        DataDir.open(tmp_path / "in")
    shard = out / "train_000.bin"
    shard.write_bytes(shard.read_bytes()[:-1])
    with pytest.raises(GlassError, match=r"train_000\.bin"):
        DataDir.open(out)
    meta = json.loads((out / "meta.json").read_text())
    meta["version"] = 99
    (out / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(GlassError, match="version 99"):
        DataDir.open(out)


def test_failure_leaves_no_partial_data(tmp_path: Path) -> None:
    paths = _write(tmp_path, ["abc\n" * 100, "ab"])
    paths[1].write_bytes(b"ab\xffc")
    out = tmp_path / "out"
    with pytest.raises(GlassError, match=r"doc1.txt: not valid UTF-8 at byte 2"):
        prepare(paths, out, _chars("abc\n"), batch_bytes=16, shard_tokens=50)
    assert list(out.iterdir()) == []
    with pytest.raises(GlassError, match="empty"):
        prepare(_write(tmp_path, ["", ""]), out, _chars("a"))
    with pytest.raises(GlassError, match="val_fraction"):
        prepare(paths[:1], out, _chars("abc\n"), val_fraction=1.0)


@settings(max_examples=40)
@given(
    docs=st.lists(st.text(st.characters(codec="utf-8"), max_size=80), min_size=1, max_size=5),
    piece_bytes=st.integers(4, 64),
    shard_tokens=st.integers(1, 50),
    val_fraction=st.sampled_from([0.0, 0.01, 0.3, 0.9]),
)
def test_round_trip_property(
    tmp_path_factory, docs, piece_bytes, shard_tokens, val_fraction
) -> None:
    total = sum(len(d.encode()) for d in docs)
    assume(total > 0)
    tmp = tmp_path_factory.mktemp("rt")
    tok = _chars("".join(docs) + "\n")
    data = prepare(
        _write(tmp, docs),
        tmp / "out",
        tok,
        val_fraction=val_fraction,
        shard_tokens=shard_tokens,
        piece_bytes=piece_bytes,
        batch_bytes=32,
    )
    train, val = _all_tokens(data, "train"), _all_tokens(data, "val")
    assert tok.decode(np.concatenate([train, val])) == "".join(d + "\n" for d in docs if d)
    s = data.meta.splits
    assert s["train"].bytes + s["val"].bytes == total + sum(1 for d in docs if d)
    assert (s["val"].tokens > 0) == (val_fraction > 0) or total < 2
    assert s["train"].tokens > 0 or len("".join(docs)) == 1


def test_shards_appear_under_their_names_only_when_complete(tmp_path: Path) -> None:
    """A killed run leaves ``.tmp`` files, never a half shard; the next run removes them."""
    from glassgpt.data.shards import ShardWriter

    w = ShardWriter(tmp_path, "train", np.dtype(np.uint16), shard_tokens=4)
    w.write(np.arange(6))  # shard 0 full, shard 1 half written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train_000.bin", "train_001.bin.tmp"]
    out = tmp_path / "out"
    out.mkdir()
    (out / "val_003.bin.tmp").write_bytes(b"\x01\x02")  # what a killed run would leave
    data = prepare(_write(tmp_path, ["abc\n" * 50]), out, _chars("abc\n"), shard_tokens=30)
    assert not list(out.glob("*.tmp"))
    assert sorted(p.name for p in out.glob("*.bin")) == sorted(
        f for s in ("train", "val") for f, _ in data.split(s).shards
    )
    w.close()
    assert sorted(p.name for p in tmp_path.glob("train*")) == ["train_000.bin", "train_001.bin"]
    assert np.fromfile(tmp_path / "train_001.bin", dtype=np.uint16).tolist() == [4, 5]


def test_workers_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(GlassError, match="workers"):
        prepare(_write(tmp_path, ["ab"]), tmp_path / "out", _chars("ab"), workers=0)
