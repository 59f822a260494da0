"""A tiny run folder as ``glassgpt train`` leaves one: a checkpoint of a small random GPT with a
character tokenizer, and its prepared data shards in ``RUN/data``."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import torch
from tests import runs

from glassgpt.data import prepare
from glassgpt.model import GPT, GPTConfig
from glassgpt.tokenizer import CharTokenizer

CHARS = sorted(set(string.ascii_letters + string.digits + " ,.:;!?'\n-"))


def write_run(
    out: Path, *, n_layers: int = 2, d_model: int = 16, text_chars: int = 6000, seed: int = 0
) -> Path:
    """``out/ckpt/step_000001`` (model, config.toml, tokenizer; :func:`tests.runs.write_run`)
    and ``out/data`` (shards); ``seed`` draws the model's weights."""
    tok = CharTokenizer(CHARS, special_tokens=["<|endoftext|>"])
    torch.manual_seed(seed)
    cfg = GPTConfig(n_vocab=tok.n_vocab, n_ctx=32, d_model=d_model, n_layers=n_layers, n_heads=2)
    model = GPT(cfg).eval()
    runs.write_run(out, model, tok, keep_last=1)
    gen = torch.Generator().manual_seed(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "and", "then", "slept"]
    idx = torch.randint(0, len(words), (text_chars // 4,), generator=gen).tolist()
    (out / "text.txt").write_text(" ".join(words[i] for i in idx) + "\n")
    prepare([out / "text.txt"], out / "data", tok, val_fraction=0.2)
    return out


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(tmp_path_factory.mktemp("features") / "run")


@pytest.fixture
def make_run():
    """``make_run(folder, **shape)``: another run folder (:func:`write_run`)."""
    return write_run
