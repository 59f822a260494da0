from __future__ import annotations

import pytest
import torch

from glassgpt.model import GPT, GPTConfig
from glassgpt.train.trainer import cpu_has_bf16, resolve_precision


def test_auto_precision_on_cpu_follows_the_processor() -> None:
    dtype, scaler = resolve_precision("auto", torch.device("cpu"))
    assert dtype == (torch.bfloat16 if cpu_has_bf16() else None) and not scaler
    assert resolve_precision("fp32", torch.device("cpu")) == (None, False)


@pytest.mark.parametrize(
    ("d_head", "positional"),
    [(16, "learned"), (16, "rope"), (64, "learned")],  # heads under 64 run attention in float32
)
def test_bf16_autocast_forward_and_backward_stay_close_to_float32(
    d_head: int, positional: str
) -> None:
    torch.manual_seed(0)
    config = GPTConfig(
        n_vocab=50, n_ctx=32, d_model=2 * d_head, n_layers=2, n_heads=2, positional=positional
    )
    model = GPT(config)
    x = torch.randint(0, 50, (4, 32))
    _, loss32 = model(x, x)
    loss32.backward()
    grads32 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss16 = model(x, x)
    loss16.backward()
    assert logits.dtype == torch.bfloat16
    assert loss16.item() == pytest.approx(loss32.item(), rel=2e-2)
    for g32, p in zip(grads32, model.parameters()):
        if g32.norm() < 1e-6:  # b_K: its gradient is 0 in exact arithmetic (softmax shift)
            continue
        assert torch.nn.functional.cosine_similarity(g32.flatten(), p.grad.flatten(), 0) > 0.98
