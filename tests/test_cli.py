from __future__ import annotations

import subprocess
import sys

from glassgpt.cli import main


def test_version_and_help(capsys) -> None:
    assert main([]) == 0
    assert "usage: glassgpt" in capsys.readouterr().out


def test_unknown_command_exits_nonzero() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "glassgpt", "no-such-command"], capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr


def test_gpu_requests_without_a_gpu_are_one_line_errors(capsys, tmp_path) -> None:
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cases = [
        ["train", "--preset", "gpt2-gpu", "--out", str(tmp_path / "run")],
        ["sample", "--checkpoint", str(tmp_path), "--device", "cuda", "--prompt", "a"],
        ["inspect", "--checkpoint", str(tmp_path), "--device", "cuda", "--prompt", "a"],
        ["inspect", "--checkpoint", str(tmp_path), "--device", "tpu9", "--prompt", "a"],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("glassgpt: error:") and len(err.strip().splitlines()) == 1, err
        assert "cuda" in err or "device" in err, err
    assert not (tmp_path / "run" / "ckpt").exists()


def test_debug_shows_the_traceback_of_an_error(monkeypatch, capsys) -> None:
    import pytest

    from glassgpt.errors import ConfigError

    argv = ["train", "--preset", "cpu-tiny", "--set", "model=3"]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("glassgpt: error: model: expected a table")
    with pytest.raises(ConfigError, match="model: expected a table"):
        main(["--debug", *argv])
    monkeypatch.setenv("GLASSGPT_DEBUG", "1")
    with pytest.raises(ConfigError):
        main(argv)
