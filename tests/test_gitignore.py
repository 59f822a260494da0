"""``.gitignore``: what the docs' commands write in the checkout (runs/, studies/, saes/) is
ignored, and the source folders of the same names are not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ignored(path: str) -> bool:
    """``git check-ignore``'s answer for ``path`` (it need not exist)."""
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT, capture_output=True
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


@pytest.fixture(autouse=True)
def _git_checkout() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")


@pytest.mark.parametrize(
    "path",
    ["runs/tiny/metrics.jsonl", "studies/vocab/results.json", "saes/resid/sae.safetensors"],
)
def test_what_the_docs_commands_write_is_ignored(path: str) -> None:
    assert ignored(path)


@pytest.mark.parametrize(
    "path", ["src/glassgpt/scaling/studies/vocab.toml", "tests/scaling/test_studies.py"]
)
def test_sources_of_the_same_names_are_not(path: str) -> None:
    assert not ignored(path)
