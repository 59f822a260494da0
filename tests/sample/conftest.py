"""A trained-run folder in the trainer's checkpoint layout, with a tiny char model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests import runs

from glassgpt.model import GPT, GPTConfig
from glassgpt.tokenizer import CharTokenizer

CHARS = sorted(set("abcdefghijklmnopqrstuvwxyz ,.!?\n"))


def write_run(out: Path, model: GPT, tok: CharTokenizer, steps: tuple[int, ...] = (5, 10)) -> Path:
    """``out/ckpt/step_*`` (and ``best`` at the first step) as ``glassgpt.train`` writes them."""
    return runs.write_run(out, model, tok, steps=steps, best=steps[0], keep_last=3)


@pytest.fixture
def char_run(tmp_path: Path) -> tuple[Path, GPT, CharTokenizer]:
    tok = CharTokenizer(CHARS, special_tokens=["<|endoftext|>"])
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=tok.n_vocab, n_ctx=48, d_model=16, n_layers=2, n_heads=2,
                    positional="rope")  # fmt: skip
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return write_run(tmp_path / "run", model, tok), model, tok
