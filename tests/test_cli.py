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


def test_help_is_printed_from_the_table_alone() -> None:
    """``glassgpt --help`` imports no command module, no stage and no torch or scipy."""
    code = (
        "import sys\n"
        "from glassgpt.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0\n"
        "print('MODULES', ' '.join(sorted(sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "usage: glassgpt" in proc.stdout
    loaded = proc.stdout.rpartition("MODULES")[2].split()
    ours = sorted(m for m in loaded if m.startswith("glassgpt."))
    assert ours == ["glassgpt.cli", "glassgpt.errors", "glassgpt.version"], ours
    assert not {"torch", "numpy", "scipy"} & set(loaded)


def test_every_command_reads_top_to_bottom_in_its_own_module() -> None:
    """Each command of the table has its module in glassgpt/cli/, registered by one name,
    whose parser says what the table says."""
    import importlib
    from pathlib import Path

    import glassgpt.cli as cli

    folder = Path(cli.__file__).parent
    for command in cli.COMMANDS:
        assert (folder / f"{command.module}.py").is_file(), command.name
        module = importlib.import_module(f"glassgpt.cli.{command.module}")
        assert callable(module.register), command.name
    parser = cli.build_parser()
    choices = parser._subparsers._group_actions[0]  # type: ignore[union-attr]
    helps = {a.dest: a.help for a in choices._choices_actions}
    assert helps == {c.name: c.help for c in cli.COMMANDS}


def test_each_command_prints_its_help(capsys) -> None:
    import pytest

    from glassgpt.cli import COMMANDS

    for command in COMMANDS:
        with pytest.raises(SystemExit) as exit_:
            main([command.name, "--help"])
        assert exit_.value.code == 0
        assert f"usage: glassgpt {command.name}" in capsys.readouterr().out
