"""Shared fixtures: the data in ``../shared/data`` (skipped with a reason when absent), and
``imports_after``: which of some modules a fresh Python process has imported after code."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("GLASSGPT_SHARED_DATA", REPO.parent / "shared" / "data"))

settings.register_profile(
    "default", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("default")


def _shared(relative: str) -> Path:
    path = SHARED_DATA / relative
    if not path.is_file():
        pytest.skip(f"shared data file {path} is absent (expected ../shared/data beside the repo)")
    return path


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    return _shared("tinyshakespeare.txt")


@pytest.fixture(scope="session")
def shakespeare_text(shakespeare_path: Path) -> str:
    return shakespeare_path.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def gpt2_files() -> tuple[Path, Path]:
    return _shared("gpt2/encoder.json"), _shared("gpt2/vocab.bpe")


@pytest.fixture
def imports_after() -> Callable[[str, list[str]], list[str]]:
    """``imports_after(code, modules)``: the modules among ``modules`` that a fresh Python
    process has imported after running ``code`` (which must succeed)."""

    def run(code: str, modules: list[str]) -> list[str]:
        check = f"\nimport sys\nprint(*[m for m in {modules!r} if m in sys.modules])\n"
        out = subprocess.run([sys.executable, "-c", code + check], capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    return run
