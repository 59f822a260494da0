"""Fixtures: tiny models with O(1) random parameters, so every term of the math shows.

(``tests/inspect`` cannot be a package: it would shadow the standard library's ``inspect``.)
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from glassgpt.checkpoint import Run
from glassgpt.cli import ablate as cli_ablate
from glassgpt.cli import inspect as cli_inspect
from glassgpt.cli import patch as cli_patch
from glassgpt.inspect.report import build_report
from glassgpt.model import GPT, GPTConfig
from glassgpt.tokenizer import CharTokenizer

TINY: dict[str, Any] = {
    "n_vocab": 11,
    "n_ctx": 8,
    "d_model": 12,
    "n_layers": 2,
    "n_heads": 3,
    "d_mlp": 16,
    "unembed_bias": True,  # every parameter, b_U too (the default has none, as GPT-2)
}


def tiny_config(**overrides: Any) -> GPTConfig:
    return GPTConfig(**{**TINY, **overrides})


def random_model(config: GPTConfig, seed: int = 0, dtype: torch.dtype = torch.float64) -> GPT:
    """A GPT in eval mode whose parameters (biases and norm weights too) are random, O(1)."""
    torch.manual_seed(seed)
    model = GPT(config).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(dtype)
            p.copy_((1.0 if name.endswith(".w") else 0.0) + 0.4 * noise)
    return model.eval()


def random_tokens(config: GPTConfig, batch: int, length: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, config.n_vocab, (batch, length), generator=gen)


def open_as(monkeypatch: pytest.MonkeyPatch, model: GPT, tok: Any) -> None:
    """Make ``-c ANY`` of ``glassgpt inspect``, ``patch`` and ``ablate`` open ``model`` with
    ``tok`` (no folder read): their ``open_run`` returns this run."""

    def opened(path: Any, **options: Any) -> Run:
        config = {"model": model.config.to_dict()}
        return Run(Path(path), "checkpoint", config, model=model, tokenizer=tok)

    for command in (cli_inspect, cli_patch, cli_ablate):
        monkeypatch.setattr(command, "open_run", opened)


@pytest.fixture
def tiny() -> SimpleNamespace:
    """``tiny.config(**overrides)``, ``tiny.model(config, seed, dtype)``, ``tiny.tokens(config, B, T)``,
    ``tiny.open_as(monkeypatch, model, tok)``."""
    return SimpleNamespace(
        config=tiny_config, model=random_model, tokens=random_tokens, open_as=open_as
    )


PROMPT = "the cat <sat> & the cat sat\non the mat"


@pytest.fixture(scope="session")
def report_html() -> SimpleNamespace:
    """One report of a small random model (built once: rendering figures takes seconds)."""
    tok = CharTokenizer.train([PROMPT + "xyz"])
    cfg = GPTConfig(n_vocab=tok.n_vocab, n_ctx=48, d_model=16, n_layers=2, n_heads=2)
    model = random_model(cfg, seed=0, dtype=torch.float32)
    html = build_report(model, tok, PROMPT, names=["blocks.0.attn.z", "ln_final.scale"])
    return SimpleNamespace(
        html=html, model=model, tokenizer=tok, prompt=PROMPT, n_figures=html.count("<img ")
    )
