"""``glassgpt tokenizer ...`` through ``glassgpt.cli.main``: results, and one-line errors."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from glassgpt.cli import main
from glassgpt.tokenizer import CharTokenizer, Tokenizer


def run(argv: list[str], capsys, monkeypatch, stdin: bytes = b"") -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    assert err.startswith("glassgpt: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for f in fragments:
        assert f in err, (f, err)


@pytest.fixture()
def corpus(tmp_path: Path, shakespeare_text: str) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(shakespeare_text[:100_000], encoding="utf-8")
    return path


def test_train_encode_decode_stats(corpus: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "tok.json"
    argv = [
        "tokenizer",
        "train",
        "--input",
        str(corpus),
        "--vocab-size",
        "400",
        "--output",
        str(out),
    ]
    code, _, err = run(
        [*argv, "--pattern", "gpt4", "--special", "<|endoftext|>"], capsys, monkeypatch
    )
    assert code == 0 and "n_vocab=400" in err
    tok = Tokenizer.load(out)
    assert tok.pattern_name == "gpt4" and tok.special_tokens == {"<|endoftext|>": 399}

    text = "First Citizen:\nSpeak, speak.<|endoftext|>"
    code, ids_text, _ = run(
        ["tokenizer", "encode", "--tokenizer", str(out), "--specials", "allow"],
        capsys,
        monkeypatch,
        text.encode(),
    )
    assert code == 0
    assert [int(w) for w in ids_text.split()] == tok.encode(text, allowed_special="all")
    code, back, _ = run(
        ["tokenizer", "decode", "--tokenizer", str(out)], capsys, monkeypatch, ids_text.encode()
    )
    assert code == 0 and back == text

    code, table, _ = run(
        ["tokenizer", "stats", "--tokenizer", str(out), str(corpus)], capsys, monkeypatch
    )
    assert code == 0
    n_bytes = corpus.stat().st_size
    n_tokens = len(tok.encode(corpus.read_text(encoding="utf-8")))
    assert f"{n_bytes / n_tokens:.3f}" in table and "/ 400" in table


def test_train_char(corpus: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "char.json"
    code, _, _ = run(
        ["tokenizer", "train", "--kind", "char", "--input", str(corpus), "--output", str(out)],
        capsys,
        monkeypatch,
    )
    assert code == 0
    assert CharTokenizer.load(out).chars == sorted(set(corpus.read_text(encoding="utf-8")))


def test_gpt2_by_name_and_folder(gpt2_files, capsys, monkeypatch) -> None:
    monkeypatch.chdir(gpt2_files[0].parent.parent)  # "gpt2": the folder, by a relative path
    for spec in ("gpt2", str(gpt2_files[0].parent)):
        code, out, _ = run(
            ["tokenizer", "encode", "--tokenizer", spec], capsys, monkeypatch, b"Hello world"
        )
        assert code == 0 and out.split() == ["15496", "995"]


def test_gpt2_names_a_folder_not_a_place_glassgpt_searches(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """``--tokenizer gpt2`` where no ``gpt2`` folder is: one line asking for the folder."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run(["tokenizer", "encode", "--tokenizer", "gpt2"], capsys, monkeypatch, b"a")
    assert_one_line_error(code, err, "--tokenizer gpt2", "encoder.json and vocab.bpe")


def test_encode_special_policies(gpt2_files, capsys, monkeypatch) -> None:
    folder = str(gpt2_files[0].parent)
    text = b"a<|endoftext|>"
    code, _, err = run(["tokenizer", "encode", "--tokenizer", folder], capsys, monkeypatch, text)
    assert_one_line_error(code, err, "'<|endoftext|>'", "--specials")
    code, out, _ = run(
        ["tokenizer", "encode", "--tokenizer", folder, "--specials", "text"],
        capsys,
        monkeypatch,
        text,
    )
    assert code == 0 and "50256" not in out.split()


def test_bad_inputs_are_one_line_errors(corpus: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    out = str(tmp_path / "tok.json")
    train = ["tokenizer", "train", "--output", out, "--vocab-size"]

    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    assert_one_line_error(
        *run([*train, "300", "--input", str(empty)], capsys, monkeypatch)[::2], "empty corpus"
    )

    code, _, err = run(
        [*train, "257", "--input", str(corpus), "--special", "<a>", "<b>"], capsys, monkeypatch
    )
    assert_one_line_error(code, err, "vocab_size", "256 + 2")

    code, _, err = run([*train, "300", "--input", str(tmp_path / "nope.txt")], capsys, monkeypatch)
    assert_one_line_error(code, err, "nope.txt")

    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"abc\ndef \xe9t\xe9")
    code, _, err = run([*train, "300", "--input", str(corpus), str(latin1)], capsys, monkeypatch)
    assert_one_line_error(code, err, "latin1.txt", "byte offset 8")

    tok_path = tmp_path / "v2.json"
    tok_path.write_text(
        json.dumps({**Tokenizer.bytes_only().to_dict(), "version": 2}), encoding="utf-8"
    )
    code, _, err = run(
        ["tokenizer", "encode", "--tokenizer", str(tok_path)], capsys, monkeypatch, b"x"
    )
    assert_one_line_error(code, err, "v2.json", "version 2")

    Tokenizer.bytes_only().save(tok_path)
    code, _, err = run(
        ["tokenizer", "decode", "--tokenizer", str(tok_path)], capsys, monkeypatch, b"104 105 256"
    )
    assert_one_line_error(code, err, "token id 256")
    code, _, err = run(
        ["tokenizer", "decode", "--tokenizer", str(tok_path)], capsys, monkeypatch, b"104 -1"
    )
    assert_one_line_error(code, err, "token id -1")
    code, _, err = run(
        ["tokenizer", "decode", "--tokenizer", str(tok_path)], capsys, monkeypatch, b"104 x7"
    )
    assert_one_line_error(code, err, "word 2", "'x7'")
    code, _, err = run(
        ["tokenizer", "encode", "--tokenizer", str(tok_path)], capsys, monkeypatch, b"ok \xff"
    )
    assert_one_line_error(code, err, "stdin", "byte offset 3")
    code, _, err = run(
        ["tokenizer", "stats", "--tokenizer", str(tok_path), str(latin1)], capsys, monkeypatch
    )
    assert_one_line_error(code, err, "latin1.txt", "byte offset 8")
