"""``glassgpt inspect``: one line and exit 2 for bad input; a report file for good input."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tests.runs import write_run

import glassgpt.inspect as gi
from glassgpt.checkpoint import open_run
from glassgpt.cli import main
from glassgpt.inspect.paths import FINAL
from glassgpt.tokenizer import CharTokenizer

TEXT = "abcdefgh abc"


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch, tiny: SimpleNamespace) -> SimpleNamespace:
    """Point the command's ``open_run`` at a small in-memory model (any folder name works)."""
    tok = CharTokenizer.train([TEXT])
    model = tiny.model(tiny.config(n_vocab=tok.n_vocab, n_ctx=12), dtype=torch.float32)
    tiny.open_as(monkeypatch, model, tok)
    return SimpleNamespace(model=model, tokenizer=tok)


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--layer", "5"], "layer 5 is out of range: the model has 2 layers (0..1)"),
        (["--layer", "1", "--head", "7"], "head 7 is out of range: each layer has 3 heads (0..2)"),
        (["--head", "0"], "--head needs --layer (which layer the head is in)"),
        (["--activations", "blocks.0.attn.nope"], "unknown activation 'blocks.0.attn.nope'"),
        (["--seq-len", "7"], "seq_len=7 repeated is 14 tokens, longer than the context n_ctx=12"),
    ],
)
def test_bad_options_give_one_line_and_exit_2(
    extra: list[str],
    message: str,
    loaded: SimpleNamespace,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out_file = tmp_path / "r.html"
    args = ["inspect", "--checkpoint", str(tmp_path), "--prompt", "abc", "--output", str(out_file)]
    code, _, err = run([*args, *extra], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("glassgpt: error: ")
    assert message in err
    assert not out_file.exists()


def test_a_prompt_longer_than_the_context_is_refused(
    loaded: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        ["inspect", "--checkpoint", str(tmp_path), "--prompt", "abcdefgh abcdefgh"], capsys
    )
    assert code == 2
    assert err == (
        "glassgpt: error: the prompt is 17 tokens, longer than the model's context n_ctx=12\n"
    )


def test_missing_checkpoint_and_prompt_file_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["inspect", "--checkpoint", str(tmp_path / "nope"), "--prompt", "a"], capsys)
    assert code == 2 and "nope: no such checkpoint or model folder" in err and err.count("\n") == 1
    code, _, err = run(
        ["inspect", "--checkpoint", str(tmp_path), "--prompt-file", str(tmp_path / "p.txt")], capsys
    )
    assert code == 2 and "p.txt: no such prompt file" in err
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe")
    code, _, err = run(
        ["inspect", "--checkpoint", str(tmp_path), "--prompt-file", str(tmp_path / "bad.txt")],
        capsys,
    )
    assert code == 2 and "bad.txt: not UTF-8 (byte 0)" in err


def test_a_run_without_a_tokenizer_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tiny: SimpleNamespace,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = tiny.model(tiny.config(n_vocab=11, n_ctx=12), dtype=torch.float32)
    tiny.open_as(monkeypatch, model, None)
    code, _, err = run(["inspect", "-c", str(tmp_path), "--prompt", "abc"], capsys)
    assert (code, err) == (
        2,
        f"glassgpt: error: {tmp_path}: has no tokenizer; pass --tokenizer FILE\n",
    )


@pytest.mark.slow
def test_writes_the_report(
    loaded: SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "prompt.txt").write_text("abc abc", encoding="utf-8")
    out_file = tmp_path / "out" / "report.html"
    code, out, err = run(
        [
            "inspect",
            "--checkpoint",
            str(tmp_path),
            "--prompt-file",
            str(tmp_path / "prompt.txt"),
            "--output",
            str(out_file),
            "--layer",
            "1",
            "--head",
            "2",
            "--activations",
            "resid_post",
            "--seq-len",
            "4",
        ],
        capsys,
    )
    assert (code, err) == (0, "")
    html = out_file.read_text(encoding="utf-8")
    assert out.startswith(f"wrote {out_file} (") and f"{html.count('<img ')} figures" in out
    assert "Circuits of head L1H2" in html
    assert "<td>blocks.1.resid_post</td>" in html
    assert "random sequences of 4 tokens repeated once" in html


@pytest.mark.slow
def test_end_to_end_from_a_training_checkpoint(
    tmp_path: Path, tiny: SimpleNamespace, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run written by the trainer's CheckpointManager, read back by ``open_run``."""
    tok = CharTokenizer.train([TEXT])
    cfg = tiny.config(n_vocab=tok.n_vocab, n_ctx=12)
    model = tiny.model(cfg, dtype=torch.float32)
    folder = write_run(tmp_path / "run", model, tok)
    assert open_run(folder, weights=False).model_config.n_vocab == tok.n_vocab
    out_file = tmp_path / "report.html"
    code, _, err = run(
        ["inspect", "--checkpoint", str(folder), "--prompt", "abc", "--output", str(out_file)],
        capsys,
    )
    assert (code, err) == (0, "")
    assert out_file.read_text(encoding="utf-8").count("<img ") >= 10


def test_the_package_exports_its_names_plainly() -> None:
    """Every name of ``glassgpt.inspect.__all__`` is an attribute bound at import (no lazy
    ``__getattr__``): the functions and classes, and the one constant, path patching's
    final-residual receiver."""
    assert not hasattr(gi, "__getattr__")
    assert all(callable(getattr(gi, n)) for n in gi.__all__ if n != "FINAL")
    assert gi.FINAL is FINAL
