"""Fixtures for tokenizer tests: GPT-2 ours and tiktoken's (built offline), stdlib text."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from glassgpt.tokenizer import Tokenizer
from glassgpt.tokenizer.files import read_json

STDLIB_BYTES = 3_000_000


def stdlib_sources(limit: int = STDLIB_BYTES) -> str:
    """The first ``limit`` characters of the Python standard library's top-level .py files."""
    parts, size = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(text)
        size += len(text)
        if size >= limit:
            break
    if size < limit // 2:
        pytest.skip("the Python standard library sources are not available")
    return "".join(parts)[:limit]


@pytest.fixture(scope="session")
def stdlib_text() -> str:
    return stdlib_sources()


@pytest.fixture(scope="session")
def gpt2_tok(gpt2_files: tuple[Path, Path]) -> Tokenizer:
    return Tokenizer.from_gpt2(*gpt2_files)


@pytest.fixture(scope="session")
def hf_unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte alphabet as transformers writes it (an oracle independent of ours)."""
    pytest.importorskip("transformers")
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


@pytest.fixture(scope="session")
def gpt2_ranks(
    gpt2_files: tuple[Path, Path], hf_unicode_to_byte: dict[str, int]
) -> dict[bytes, int]:
    """tiktoken's mergeable_ranks for gpt2: each encoder.json token mapped back to its bytes."""
    encoder = read_json(gpt2_files[0])
    return {
        bytes(hf_unicode_to_byte[c] for c in t): i
        for t, i in encoder.items()
        if t != "<|endoftext|>"
    }


@pytest.fixture(scope="session")
def tiktoken_gpt2(gpt2_ranks: dict[bytes, int]):
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken_ext.openai_public import r50k_pat_str

    return tiktoken.Encoding(
        "gpt2-offline",
        pat_str=r50k_pat_str,
        mergeable_ranks=gpt2_ranks,
        special_tokens={"<|endoftext|>": 50256},
    )
