"""The data pipeline with the real tokenizers: ids of pieces equal ids of whole files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import regex

from glassgpt.cli import main
from glassgpt.data.corpus import default_corpus_files
from glassgpt.data.prepare import prepare
from glassgpt.data.reading import iter_pieces
from glassgpt.data.shards import DataDir, tokenizer_fingerprint
from glassgpt.tokenizer import CharTokenizer, Tokenizer
from glassgpt.tokenizer.files import str_to_token
from glassgpt.tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN

EOT = "<|endoftext|>"


def _tokens(data: DataDir, split: str) -> np.ndarray:
    dtype = np.dtype(data.meta.dtype)
    parts = [np.fromfile(data.path / f, dtype=dtype) for f, _ in data.split(split).shards]
    return np.concatenate(parts) if parts else np.empty(0, dtype)


@pytest.fixture(scope="module")
def stdlib_text() -> str:
    """About 1 MB of the default corpus as one text (indentation-heavy code)."""
    return "".join(p.read_bytes().decode("utf-8") for p in default_corpus_files(1_000_000))


@pytest.mark.parametrize("pattern", [GPT2_PATTERN, GPT4_PATTERN])
def test_pieces_split_like_the_whole_file(tmp_path: Path, stdlib_text: str, pattern) -> None:
    """Cutting at safe newlines changes no pre-tokenizer chunk (oracle: ``regex.findall``)."""
    path = tmp_path / "big.py"
    path.write_bytes(stdlib_text.encode("utf-8"))
    compiled = regex.compile(pattern)
    pieces = [p.text for p in iter_pieces(path, 8192)]
    assert len(pieces) > 100
    chunks = [c for piece in pieces for c in compiled.findall(piece)]
    assert chunks == compiled.findall(stdlib_text)


@pytest.fixture(scope="module")
def tiktoken_gpt2(gpt2_files):
    tiktoken = pytest.importorskip("tiktoken")
    encoder = json.loads(gpt2_files[0].read_text(encoding="utf-8"))
    ranks = {str_to_token(t): i for t, i in encoder.items() if t != EOT}
    return tiktoken.Encoding(
        "gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={EOT: 50256}
    )


@pytest.mark.slow
def test_gpt2_shards_equal_tiktoken_ids(
    tmp_path: Path, gpt2_files, shakespeare_path, tiktoken_gpt2
) -> None:
    """Train ‖ val of a prepared file = tiktoken's ids of the whole file, then <|endoftext|>."""
    tok = Tokenizer.from_gpt2(*gpt2_files)
    text = shakespeare_path.read_text(encoding="utf-8")
    data = prepare(
        [shakespeare_path], tmp_path / "d", tok, piece_bytes=1 << 16, shard_tokens=50_000
    )
    m = data.meta
    assert m.dtype == "uint16" and m.n_vocab == 50257
    assert (m.separator_kind, m.separator_ids) == ("special", (50256,))
    ids = np.concatenate([_tokens(data, "train"), _tokens(data, "val")])
    expected = [*tiktoken_gpt2.encode_ordinary(text), 50256]
    assert ids.tolist() == expected
    assert m.splits["train"].bytes + m.splits["val"].bytes == len(text.encode())
    assert abs(m.splits["val"].bytes / len(text.encode()) - 0.1) < 1e-3
    assert len(m.splits["train"].shards) > 1


def test_bpe_with_special_separator_round_trip(tmp_path: Path) -> None:
    files = default_corpus_files(200_000)
    tok = Tokenizer.train(files, 400, special_tokens=(EOT,))
    (tmp_path / "spells.txt").write_text(f"a text that spells {EOT} is ordinary\n")
    inputs = [*files[:5], tmp_path / "spells.txt"]
    data = prepare(inputs, tmp_path / "d", tok, val_fraction=0.2, piece_bytes=4096)
    ids = np.concatenate([_tokens(data, "train"), _tokens(data, "val")])
    eot = tok.special_tokens[EOT]
    texts = [p.read_bytes().decode("utf-8") for p in inputs]
    assert tok.decode(ids) == "".join(t + EOT for t in texts)
    assert int((ids == eot).sum()) == len(inputs)  # the spelled one is not a separator
    assert data.meta.tokenizer_kind == "bpe"
    again = data.load_tokenizer()
    assert tokenizer_fingerprint(again) == data.meta.tokenizer_fingerprint
    assert again.encode(texts[0]) == tok.encode(texts[0])


def test_cli_prepare_char_and_refuse_another_tokenizer(tmp_path: Path, capsys) -> None:
    src = tmp_path / "in.txt"
    src.write_text("hello world\n" * 50 + "the end")
    out = tmp_path / "d"
    assert (
        main(
            [
                "data",
                "prepare",
                "--input",
                str(src),
                "--char",
                "--output",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "char" in printed and "train" in printed and "val" in printed
    data = DataDir.open(out)
    tok = data.load_tokenizer()
    assert isinstance(tok, CharTokenizer) and "\n" in tok.chars
    assert (
        tok.decode(_tokens(data, "train")) + tok.decode(_tokens(data, "val"))
        == src.read_text() + "\n"
    )
    other = tmp_path / "other.json"
    CharTokenizer(sorted(set("hello world\n"))).save(other)
    code = main(["data", "info", str(out), "--tokenizer", str(other)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "another tokenizer" in err
    assert main(["data", "info", str(out), "--tokenizer", str(out / "tokenizer.json")]) == 0


def test_cli_train_tokenizer(tmp_path: Path, capsys) -> None:
    out = tmp_path / "d"
    argv = [
        "data",
        "prepare",
        "--stdlib",
        "--max-bytes",
        "150000",
        "--train-tokenizer",
        "300",
        "--output",
        str(out),
        "--no-progress",
        "--shard-tokens",
        "10000",
    ]
    assert main(argv) == 0
    m = DataDir.open(out).meta
    assert m.tokenizer_kind == "bpe" and m.n_vocab == 300 and m.separator_kind == "special"
    assert m.splits["train"].tokens > 0 and len(m.splits["train"].shards) > 1
    assert sum(n for _, n in m.sources) <= 150_000
    assert main(argv) == 2  # the folder now holds data
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.slow
def test_gpt2_stdlib_shards_equal_tiktoken_ids(tmp_path: Path, gpt2_files, tiktoken_gpt2) -> None:
    """Code, cut into 16 KiB pieces: the ids are tiktoken's of each whole file, then EOT."""
    tok = Tokenizer.from_gpt2(*gpt2_files)
    files = default_corpus_files(1_500_000)
    data = prepare(files, tmp_path / "d", tok, piece_bytes=1 << 14)
    ids = np.concatenate([_tokens(data, "train"), _tokens(data, "val")])
    texts = [p.read_bytes().decode("utf-8") for p in files]
    assert max(map(len, texts)) > 1 << 15  # some files are cut into pieces
    expected = [i for t in texts for i in [*tiktoken_gpt2.encode_ordinary(t), 50256]]
    assert ids.tolist() == expected


def test_ids_do_not_depend_on_workers(tmp_path: Path, gpt2_files, stdlib_text: str) -> None:
    """All cores give the ids of one core, and of the Python merge loop (the reference)."""
    docs = [stdlib_text[k : k + 100_000] for k in range(0, 600_000, 100_000)]
    paths = []
    for i, doc in enumerate(docs):
        paths.append(tmp_path / f"doc{i}.py")
        paths[-1].write_text(doc, encoding="utf-8")
    fast = Tokenizer.from_gpt2(*gpt2_files)
    ref = Tokenizer.from_gpt2(*gpt2_files)
    ref.fast = False
    runs = [
        prepare(paths, tmp_path / name, tok, workers=n, batch_bytes=300_000)
        for name, tok, n in (("one", ref, 1), ("all", fast, 2), ("fast1", fast, 1))
    ]
    for split in ("train", "val"):
        first = _tokens(runs[0], split)
        assert len(first) > 1000
        for data in runs[1:]:
            assert np.array_equal(_tokens(data, split), first)
