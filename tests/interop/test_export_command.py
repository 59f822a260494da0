"""``glassgpt export --format hf`` lists every file it wrote, and only those."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.runs import write_run

from glassgpt.cli import main
from glassgpt.model import GPT, GPTConfig
from glassgpt.tokenizer import CharTokenizer


def test_export_lists_every_file_it_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tok = CharTokenizer(list("abc "), special_tokens=["<|endoftext|>"])
    model = GPT(GPTConfig(n_vocab=tok.n_vocab, n_ctx=8, d_model=8, n_layers=1, n_heads=2))
    run = write_run(tmp_path / "run", model, tok)
    out = tmp_path / "hf"
    assert main(["export", "-c", str(run), "--format", "hf", "-o", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"wrote {out}: ")
    listed = line.removeprefix(f"wrote {out}: ").split(", ")
    on_disk = sorted(p.name for p in out.iterdir())
    assert sorted(listed) == on_disk
    assert "tokenizer_config.json" in listed
