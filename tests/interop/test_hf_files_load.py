"""An import builds its GPT on the meta device and assigns the file's tensors to it: no
weight is drawn first (a random init of meta tensors does nothing but cost time: PyTorch's
``normal_`` on them imported ``torch._dynamo``, seconds of a 1B model's load;
``bench/loading.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.interop.hf_cases import CASES, make, tokens

from glassgpt.interop import from_hf
from glassgpt.model import GPT, GPTConfig


def test_an_import_draws_no_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hf = make(CASES["llama-gqa2-llama3-untied"])
    hf.save_pretrained(tmp_path)
    drawn: list[GPT] = []
    reset = GPT.reset_parameters
    monkeypatch.setattr(GPT, "reset_parameters", lambda self: drawn.append(self) or reset(self))
    model = from_hf(tmp_path)
    assert drawn == []
    with torch.no_grad():
        torch.testing.assert_close(model(tokens()), hf(tokens()).logits, rtol=1e-5, atol=1e-5)
    torch.manual_seed(0)  # a model made on a real device still draws its weights, as before
    a = GPT(GPTConfig(n_vocab=10, n_ctx=4, d_model=8, n_layers=1, n_heads=2))
    torch.manual_seed(0)
    b = GPT(GPTConfig(n_vocab=10, n_ctx=4, d_model=8, n_layers=1, n_heads=2))
    assert len(drawn) == 2 and torch.equal(a.embed.W_E, b.embed.W_E)
    assert float(a.embed.W_E.detach().std()) > 0.01
