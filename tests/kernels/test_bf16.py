"""bf16 autocast products and GELUs on a CPU without bf16 arithmetic (``glassgpt.kernels.bf16``):
the same function as PyTorch's bf16 kernels (inputs rounded to bf16, float32 sums, outputs
rounded to bf16), forward and backward, against PyTorch's own bf16 path and float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from glassgpt.kernels import activations, bf16, dense
from glassgpt.model import GPT, GPTConfig

BF16_ULP = 2.0**-7  # relative spacing of bf16 values


@pytest.fixture
def emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bf16, "native", lambda: False)


def _operands(transposed: bool, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 5, 24, generator=g)
    W = torch.randn(*((17, 24) if transposed else (24, 17)), generator=g) / 5
    b = torch.randn(17, generator=g) if bias else None
    return x, W, b


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_is_the_rounded_float64_product_of_rounded_inputs(
    transposed: bool, bias: bool, emulated: None
) -> None:
    x, W, b = _operands(transposed, bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = dense.matmul(x, W, b, transposed=transposed)
    assert y.dtype == torch.bfloat16 and y.grad_fn is None
    r = lambda t: t.to(torch.bfloat16).double()  # noqa: E731
    Wr = r(W) if transposed else r(W).T
    want = F.linear(r(x), Wr, None if b is None else r(b))
    # float32 sums of exact products: at most one rounding step from the float64 result
    err = (y.double() - want).abs()
    assert bool((err <= BF16_ULP * want.abs() + 1e-6).all()), err.max()
    assert (y.double() == want.to(torch.bfloat16).double()).float().mean() > 0.97


@pytest.mark.parametrize("transposed", [False, True])
def test_gradients_match_pytorch_bf16_autocast(transposed: bool, monkeypatch) -> None:
    """The same loss through PyTorch's bf16 autocast kernels (native) and through float32
    products (emulated): outputs and the gradients of x, W and b agree to bf16 accuracy."""
    results = []
    for native in (True, False):
        monkeypatch.setattr(bf16, "native", lambda native=native: native)
        x, W, b = (t.requires_grad_() for t in _operands(transposed, True, seed=1))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = dense.matmul(x, W, b, transposed=transposed)
        assert (y.grad_fn.name() == "Bf16LinearBackward") is not native
        (y.float() ** 2).sum().backward()
        results.append((y.float(), x.grad, W.grad, b.grad))
        assert x.grad.dtype == W.grad.dtype == b.grad.dtype == torch.float32
    for native, emulated in zip(*results):
        torch.testing.assert_close(emulated, native, rtol=2 * BF16_ULP, atol=2e-2)


def test_no_emulation_outside_bf16_autocast_or_with_native_bf16(monkeypatch) -> None:
    x = _operands(False, True)[0]
    monkeypatch.setattr(bf16, "native", lambda: False)
    assert not bf16.emulated(x)  # no autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert bf16.emulated(x) and not bf16.emulated(x.double())
    monkeypatch.setattr(bf16, "native", lambda: True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not bf16.emulated(x)


@pytest.mark.parametrize("kind", ["tanh", "exact"])
def test_bf16_gelu_through_the_float32_kernel_matches_pytorch(kind: str, emulated: None) -> None:
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 8, 96, generator=g) * 2).bfloat16()
    fn = activations.gelu_tanh if kind == "tanh" else activations.gelu_exact
    approximate = "tanh" if kind == "tanh" else "none"
    a, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, y_ref = fn(a), F.gelu(ref, approximate=approximate)
    assert y.dtype == torch.bfloat16 and y.grad_fn is not None
    assert "GELU" in y.grad_fn.next_functions[0][0].name()  # glassgpt's kernel, not F.gelu
    torch.testing.assert_close(y, y_ref, rtol=BF16_ULP, atol=1e-2)
    gy = torch.randn(4, 8, 96, generator=g).bfloat16()
    y.backward(gy)
    y_ref.backward(gy)
    assert a.grad.dtype == torch.bfloat16
    torch.testing.assert_close(a.grad, ref.grad, rtol=2 * BF16_ULP, atol=2e-2)


def test_a_gpt_trains_the_same_under_emulated_and_native_bf16(monkeypatch) -> None:
    """One bf16-autocast loss and its gradients through PyTorch's bf16 kernels and through
    float32 products of bf16-rounded operands: equal to bf16 accuracy."""
    cfg = GPTConfig(n_vocab=37, n_ctx=16, d_model=32, n_layers=2, n_heads=2, mlp="gelu_tanh")
    torch.manual_seed(0)
    model = GPT(cfg)
    tokens = torch.randint(0, 37, (3, 16))
    targets = torch.randint(0, 37, (3, 16))
    out = []
    for native in (True, False):
        monkeypatch.setattr(bf16, "native", lambda native=native: native)
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(tokens, targets=targets)
        loss.backward()
        out.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_n, grads_n), (loss_e, grads_e) = out
    assert abs(loss_e - loss_n) < 1e-2 * loss_n
    for name, g_n in grads_n.items():
        g_e = grads_e[name]
        cos = F.cosine_similarity(g_e.flatten(), g_n.flatten(), dim=0)
        assert cos > 0.99, (name, float(cos))
