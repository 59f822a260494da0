"""The kernels' door (``glassgpt.kernels``): every declared operation computes the same thing
with its compiled extension hidden (PyTorch's fallback, as after an install without a C
compiler) as with it; ``built`` and ``hidden`` answer for every extension one way."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from glassgpt import kernels
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.precision import cast
from glassgpt.sample import generate

ALL = kernels.EXTENSIONS


def both(fn, *extensions: str):  # type: ignore[no-untyped-def]
    """fn() with the extensions, and with them hidden."""
    with_them = fn()
    with kernels.hidden(*extensions):
        without = fn()
    return with_them, without


def close(a, b, tol: float = 1e-5) -> bool:  # type: ignore[no-untyped-def]
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):  # to tol of the largest value: sums in another order
        scale = float(a.abs().max()) if a.numel() and a.is_floating_point() else 0.0
        return a.shape == b.shape and torch.allclose(a, b, rtol=tol, atol=tol * max(scale, 1.0))
    return a == b


def test_every_operation_is_declared_and_its_function_exists() -> None:
    for name, op in kernels.OPS.items():
        assert op.name == name and callable(op.fn())
        assert op.extension is None or op.extension in ALL
        assert op.saves and op.takes and op.compiled
    used = {op.extension for op in kernels.OPS.values()}
    assert used == set(ALL)  # every extension serves some declared operation


@pytest.mark.parametrize("name", ALL)
def test_built_answers_as_the_files_say_and_hidden_turns_it_off(name: str) -> None:
    present = importlib.util.find_spec(f"glassgpt.kernels.{name}") is not None
    assert kernels.built(name) == present
    with kernels.hidden(name):
        assert not kernels.built(name)
        assert all(not op.built() for op in kernels.OPS.values() if op.extension == name)
    assert kernels.built(name) == present
    with pytest.raises(ValueError, match="_nope"):
        kernels.built("_nope")


def test_matmul_and_packing_without_gemv_or_int8() -> None:
    g = torch.Generator().manual_seed(0)
    W, b = torch.randn(64, 96, generator=g), torch.randn(96, generator=g)
    x1, x8 = torch.randn(1, 64, generator=g), torch.randn(20, 64, generator=g)

    def products(pack: str | None):  # type: ignore[no-untyped-def]
        W_ = W.clone()
        if pack == "float32":
            kernels.pack(W_)
        elif pack == "int8":
            kernels.pack_int8(W_)
        with torch.inference_mode():
            return kernels.matmul(x1, W_, b), kernels.matmul(x8, W_, b)

    for pack in (None, "float32", "int8"):
        a, c = both(lambda pack=pack: products(pack), "_gemv", "_int8")
        assert close(a, c, 1e-4), pack


def test_decoding_attention_without_attend() -> None:
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 1, 16, generator=g)
    k, v = torch.randn(2, 3, 9, 16, generator=g), torch.randn(2, 3, 9, 16, generator=g)
    with torch.inference_mode():
        a, c = both(lambda: kernels.attention(q, k, v, 8), "_attend")
    assert close(a, c)


def test_training_attention_and_its_gradients_without_flash() -> None:
    g = torch.Generator().manual_seed(2)
    leaves = [torch.randn(2, 2, 12, 8, generator=g, requires_grad=True) for _ in range(3)]

    def run():  # type: ignore[no-untyped-def]
        z = kernels.attention(*leaves)
        grads = torch.autograd.grad((z * z).sum(), leaves)
        return z.detach(), grads

    a, c = both(run, "_flash")
    assert close(a, c)


@pytest.mark.parametrize("rows", [2, 40])  # a decoding step's few rows, a training batch's
def test_norms_and_gelus_with_their_gradients_without_rowwise(rows: int) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(rows, 32, generator=g)
    w, b = torch.randn(32, generator=g), torch.randn(32, generator=g)

    def run(grad: bool):  # type: ignore[no-untyped-def]
        xs = x.clone().requires_grad_(grad)
        outs = [kernels.layer_norm(xs, w, b, 1e-5), kernels.rms_norm(xs, w, 1e-5),
                kernels.gelu_tanh(xs), kernels.gelu_exact(xs)]  # fmt: skip
        if not grad:
            return outs
        return [o.detach() for o in outs], torch.autograd.grad(sum(o.sum() for o in outs), xs)

    with torch.inference_mode():
        a, c = both(lambda: run(False), "_rowwise")
    assert close(a, c)
    a, c = both(lambda: run(True), "_rowwise")
    assert close(a, c)


def test_cache_writes_and_lengths_without_rowwise() -> None:
    g = torch.Generator().manual_seed(4)
    k, v = torch.randn(3, 2, 1, 8, generator=g), torch.randn(3, 2, 1, 8, generator=g)

    def run():  # type: ignore[no-untyped-def]
        K, V = torch.zeros(3, 2, 6, 8), torch.zeros(3, 2, 6, 8)
        lengths = torch.tensor([0, 4, 2, 5])
        with torch.inference_mode():
            kernels.write_kv(K, V, k, v, 3)
            K2, V2 = torch.zeros(3, 2, 6, 8), torch.zeros(3, 2, 6, 8)
            if not kernels.write_kv_rows(K2, V2, k, v, lengths[:3]):  # the caller's fallback
                for b in range(3):
                    K2[b, :, lengths[b]], V2[b, :, lengths[b]] = k[b, :, 0], v[b, :, 0]
            kernels.advance(lengths, 3, 2)
        return K, V, K2, V2, lengths

    a, c = both(run, "_rowwise")
    assert close(a, c, 0.0)
    assert c[4].tolist() == [2, 6, 4, 5]


def test_argmax_and_gradient_clipping_without_rowwise() -> None:
    from glassgpt.train.optim import clip_gradients

    g = torch.Generator().manual_seed(5)
    z = torch.randn(4, 50, generator=g)
    picked, fallback = both(lambda: kernels.argmax_rows(z), "_rowwise")
    assert fallback is None  # the caller then takes PyTorch's argmax
    assert picked in (None, z.argmax(dim=1).tolist())

    grads = [torch.randn(7, 5, generator=g), torch.randn(11, generator=g)]

    def clipped():  # type: ignore[no-untyped-def]
        params = [torch.nn.Parameter(torch.zeros_like(t)) for t in grads]
        for p, t in zip(params, grads):
            p.grad = t.clone()
        norm = clip_gradients(params, 0.5)
        return norm, [p.grad for p in params]

    a, c = both(clipped, "_rowwise")
    assert close(a, c)


def test_a_gpt_trains_and_decodes_the_same_with_every_extension_hidden() -> None:
    """Through the model: products, attention, norms, GELU, cache writes and the replayed
    step (its recording) all on PyTorch's fallback give the same logits, gradients and ids."""
    torch.manual_seed(6)
    model = GPT(GPTConfig(n_vocab=40, n_ctx=32, d_model=32, n_layers=2, n_heads=2))
    tokens = torch.randint(0, 40, (3, 16), generator=torch.Generator().manual_seed(7))

    def train_step():  # type: ignore[no-untyped-def]
        model.zero_grad()
        logits, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters()]

    a, c = both(train_step, *ALL)
    assert close(a, c, 1e-4)

    def decode(dtype: str):  # type: ignore[no-untyped-def]
        inference = cast(model.eval(), dtype)  # packed inside the block: hidden means unpacked
        return generate(inference, [[1, 2, 3], [4, 5, 6]], max_new_tokens=10, temperature=0)

    for dtype in ("float32", "int8"):
        a, c = both(lambda dtype=dtype: decode(dtype), *ALL)
        assert a == c, dtype
