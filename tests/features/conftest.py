"""A tiny run folder as ``glassgpt train`` leaves one: a checkpoint of a small random GPT with a
character tokenizer, and its prepared data shards in ``RUN/data``."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import torch

from glassgpt.model import GPT, GPTConfig
from glassgpt.tokenizer import CharTokenizer

CHARS = sorted(set(string.ascii_letters + string.digits + " ,.:;!?'\n-"))


def write_run(out: Path, *, n_layers: int = 2, d_model: int = 16, text_chars: int = 6000) -> Path:
    """``out/ckpt/step_000001`` (model, config.toml, tokenizer) and ``out/data`` (shards)."""
    from glassgpt.checkpoint import CheckpointManager
    from glassgpt.data import prepare
    from glassgpt.train.config import dump_toml

    tok = CharTokenizer(CHARS, special_tokens=["<|endoftext|>"])
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=tok.n_vocab, n_ctx=32, d_model=d_model, n_layers=n_layers, n_heads=2)
    model = GPT(cfg).eval()
    out.mkdir(parents=True, exist_ok=True)
    tok.save(out / "tok.json")
    files = {
        "config.toml": dump_toml({"seed": 1, "model": cfg.to_dict()}).encode(),
        "tokenizer.json": (out / "tok.json").read_bytes(),
    }
    CheckpointManager(out / "ckpt", keep_last=1).save(
        1, tensors={"model.safetensors": model.state_dict()}, files=files, state={"trainer": {}}
    )
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
