"""``--format gguf`` without the ``gguf`` package: one line naming the extra, nothing written
(in its own file: test_gguf_export.py skips as a whole where gguf is missing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tests.runs import write_run

from glassgpt.cli import main
from glassgpt.model import GPT, GPTConfig
from glassgpt.tokenizer import Tokenizer

END = "<|endoftext|>"


def test_without_the_gguf_package_the_command_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tok = Tokenizer.train("the cat sat on the mat " * 8, 256 + 8, special_tokens=[END])
    model = GPT(GPTConfig(n_vocab=tok.n_vocab, n_ctx=8, d_model=16, n_layers=1, n_heads=2))
    run = write_run(tmp_path / "run", model, tok)
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if not installed: import fails
    code = main(["export", "-c", str(run), "--format", "gguf", "-o", str(tmp_path / "m.gguf")])
    err = capsys.readouterr().err
    assert code != 0 and "pip install 'glassgpt[gguf]'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.gguf").exists()
