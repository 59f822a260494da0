"""``glassgpt sample``: streamed text equals the API's, flags reach the sampler, bad input
gives one line and exit status 2."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from glassgpt.cli import main
from glassgpt.model import GPT
from glassgpt.sample import generate
from glassgpt.tokenizer import CharTokenizer

Run = tuple[Path, GPT, CharTokenizer]


def sample(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["sample", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_streams_the_prompt_and_its_continuation(char_run: Run, capsys) -> None:
    run, model, tok = char_run
    code, out, err = sample(capsys, "-c", str(run), "-p", "hello", "-m", "25", "--seed", "4",
                            "--temperature", "0.8", "--top-k", "10", "--no-stop-eos")  # fmt: skip
    assert code == 0, err
    ids = generate(model, tok.encode("hello"), tokenizer=tok, max_new_tokens=25, seed=4,
                   temperature=0.8, top_k=10)  # fmt: skip
    assert out == "hello" + tok.decode(ids) + "\n"


def test_num_samples_seeds_and_bf16(char_run: Run, capsys) -> None:
    run, _model, _tok = char_run
    code, out, _ = sample(capsys, "-c", str(run), "-p", "a", "-n", "2", "--seed", "1", "-m", "30")
    assert code == 0
    first, second = out.split("\n" + "-" * 40 + "\n")
    assert first != second and first.startswith("a") and second.startswith("a")
    assert sample(capsys, "-c", str(run), "-p", "a", "-n", "2", "--seed", "1", "-m", "30")[1] == out
    code, out, err = sample(capsys, "-c", str(run), "-p", "a", "--dtype", "bf16", "-m", "5",
                            "--stats")  # fmt: skip
    assert code == 0 and "tokens/s" in err


def test_int8_weights(char_run: Run, capsys) -> None:
    """--dtype int8 samples from the model with int8 weights (greedy: the ids of cast's copy)."""
    from glassgpt.model.precision import cast

    run, model, tok = char_run
    code, out, err = sample(capsys, "-c", str(run), "-p", "hello", "-m", "20", "-t", "0",
                            "--no-stop-eos", "--dtype", "int8")  # fmt: skip
    assert code == 0, err
    ids = generate(cast(model, "int8"), tok.encode("hello"), max_new_tokens=20, temperature=0)
    assert out == "hello" + tok.decode(ids) + "\n"


def test_stop_and_empty_prompt(char_run: Run, capsys) -> None:
    run, model, tok = char_run
    eot = tok.special_tokens["<|endoftext|>"]
    ids = generate(model, [eot], tokenizer=tok, max_new_tokens=40, temperature=0)
    free = tok.decode(ids)
    stop = free[7:9]
    code, out, _ = sample(capsys, "-c", str(run), "-m", "40", "-t", "0", "--no-stop-eos",
                          "--stop", stop)  # fmt: skip
    assert code == 0
    assert out == free[: free.find(stop)] + "\n"


def test_interactive_reads_prompts_until_an_empty_line(
    char_run: Run, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, model, tok = char_run
    monkeypatch.setattr("sys.stdin", io.StringIO("ab\ncd\n\nnot read\n"))
    code, out, _ = sample(capsys, "-c", str(run), "-i", "-m", "6", "-t", "0", "--no-stop-eos")
    assert code == 0
    want = [p + tok.decode(generate(model, tok.encode(p), max_new_tokens=6, temperature=0))
            for p in ("ab", "cd")]  # fmt: skip
    assert out == "\n".join(want) + "\n"


def test_prompt_file(char_run: Run, capsys, tmp_path: Path) -> None:
    run, _, _ = char_run
    (tmp_path / "p.txt").write_text("once upon", encoding="utf-8")
    code, out, _ = sample(capsys, "-c", str(run), "--prompt-file", str(tmp_path / "p.txt"),
                          "-m", "3")  # fmt: skip
    assert code == 0 and out.startswith("once upon")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--temperature", "-1"], "--temperature: must be a finite number ≥ 0"),
        (["--top-p", "1.5"], "--top-p: must be in (0, 1]"),
        (["--top-p", "0"], "--top-p: must be in (0, 1]"),
        (["--top-k", "0"], "--top-k: must be an integer ≥ 1"),
        (["--num-samples", "0"], "--num-samples: must be ≥ 1"),
        (["--dtype", "int3"], "dtype: unknown dtype 'int3'"),
        (["-p", "x" * 60], "a prompt of 60 tokens is longer than the model's context n_ctx=48"),
        (["-p", "ÅÅ"], "character 'Å'"),
        (["--prompt-file", "/nonexistent/p.txt"], "/nonexistent/p.txt: no such prompt file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(char_run: Run, capsys, flags, message) -> None:
    run, _, _ = char_run
    code, _out, err = sample(capsys, "-c", str(run), *flags)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("glassgpt: error: ")
    assert message in err


def test_missing_checkpoint_and_missing_tokenizer(capsys, tmp_path: Path) -> None:
    code, _, err = sample(capsys, "-c", str(tmp_path / "none"), "-p", "a")
    assert (
        code == 2
        and err == f"glassgpt: error: {tmp_path / 'none'}: no such checkpoint or model folder\n"
    )
    from glassgpt.interop import to_hf
    from glassgpt.model import GPTConfig

    to_hf(GPT(GPTConfig(n_vocab=8, n_ctx=8, d_model=8, n_layers=1, n_heads=2)), tmp_path / "hf")
    code, _, err = sample(capsys, "-c", str(tmp_path / "hf"), "-p", "a")
    assert code == 2 and "has no tokenizer; pass --tokenizer FILE" in err


def test_generation_past_the_context_slides_and_says_so_with_stats(char_run: Run, capsys) -> None:
    run, _, _ = char_run
    code, _out, err = sample(capsys, "-c", str(run), "-p", "ab", "-m", "60", "--no-stop-eos",
                            "--stats")  # fmt: skip
    assert code == 0
    assert err.count("glassgpt: note:") == 1 and "sliding the window" in err
    assert "glassgpt: 60 tokens in" in err
    code, _out, err = sample(capsys, "-c", str(run), "-p", "ab", "-m", "60", "--no-stop-eos")
    assert code == 0 and err == ""  # sliding is how long text is sampled: no warning
    code, _, err = sample(capsys, "-c", str(run), "-p", "ab", "-m", "60", "--overflow", "error",
                          "--no-stop-eos")  # fmt: skip
    assert code == 2 and "exceed the model's context n_ctx=48" in err


def test_the_sliding_window_is_said_once_before_the_text(char_run: Run) -> None:
    import os
    import subprocess
    import sys

    run, _, _ = char_run
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    argv = ["-c", str(run), "-p", "ab", "-m", "60", "--no-stop-eos", "--seed", "0", "--stats"]
    proc = subprocess.run(
        [sys.executable, "-m", "glassgpt", "sample", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, as a terminal shows them
        text=True,
        env=env,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("glassgpt: note: ") and "sliding the window" in lines[0]
    assert proc.stdout.count("glassgpt: note") == 1 and lines[1].startswith("ab")
