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
