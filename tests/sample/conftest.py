"""A trained-run folder in the trainer's checkpoint layout, with a tiny char model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from glassgpt.model import GPT, GPTConfig
from glassgpt.tokenizer import CharTokenizer

CHARS = sorted(set("abcdefghijklmnopqrstuvwxyz ,.!?\n"))


def write_run(out: Path, model: GPT, tok: CharTokenizer, steps: tuple[int, ...] = (5, 10)) -> Path:
    """``out/ckpt/step_*`` (and ``best``) as ``glassgpt.train`` writes them."""
    from glassgpt.checkpoint import CheckpointManager
    from glassgpt.train.config import dump_toml

    tok_path = out / "tok.json"
    out.mkdir(parents=True, exist_ok=True)
    tok.save(tok_path)
    files = {
        "config.toml": dump_toml({"seed": 1, "model": model.config.to_dict()}).encode(),
        "tokenizer.json": tok_path.read_bytes(),
    }
    manager = CheckpointManager(out / "ckpt", keep_last=3)
    for step in steps:
        manager.save(step, tensors={"model.safetensors": model.state_dict()}, files=files,
                     state={"trainer": {}})  # fmt: skip
    manager.save(steps[0], tensors={"model.safetensors": model.state_dict()}, files=files,
                 state={"val_loss": 1.0}, best=True)  # fmt: skip
    return out


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
