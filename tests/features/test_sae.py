"""The SAE's equations against a NumPy transcription (float64, hypothesis shapes), TopK and
BatchTopK's counts, JumpReLU's straight-through threshold gradient against finite differences
of the kernel-smoothed objective, the unit-norm decoder, and save/load."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgpt.errors import ConfigError, GlassError, InputFileError
from glassgpt.features.sae import ARCHS, SAE, SAEConfig
from glassgpt.features.sparse import jumprelu, sparse_decode, step, topk_encode
from glassgpt.features.training import update_threshold


def randomised(cfg: SAEConfig, seed: int) -> SAE:
    """An SAE whose every parameter is random, O(1) (thresholds around 0.3)."""
    sae = SAE(cfg, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(math.log(0.3) + 0.5 * noise if name == "log_threshold" else noise)
    return sae


def np_encode(sae: SAE, x: np.ndarray, *, batch: bool) -> np.ndarray:
    """The module docstring's σ((x − b_dec) W_enc + b_enc), written with loops where it selects."""
    cfg = sae.cfg
    W_enc, b_enc = sae.W_enc.detach().numpy(), sae.b_enc.detach().numpy()
    b_dec = sae.b_dec.detach().numpy()
    z = (x if cfg.arch == "transcoder" else x - b_dec) @ W_enc + b_enc  # [N, d_sae]
    act = cfg.activation
    if act == "relu":
        return np.maximum(z, 0)
    if act == "jumprelu":
        theta = np.exp(sae.log_threshold.detach().numpy())
        return np.where(z > theta, z, 0.0)
    out = np.zeros_like(z)
    if act == "topk":
        for n in range(len(z)):
            for i in np.argsort(-z[n], kind="stable")[: cfg.k]:
                out[n, i] = max(z[n, i], 0.0)
        return out
    if batch:  # batchtopk: the k·N largest entries of the whole batch
        order = np.argsort(-z.reshape(-1), kind="stable")[: cfg.k * len(z)]
        flat = out.reshape(-1)
        flat[order] = np.maximum(z.reshape(-1)[order], 0.0)
        return flat.reshape(z.shape)
    theta = float(sae.threshold)
    return np.where(z > theta, z, 0.0)


shapes = st.tuples(
    st.integers(1, 9),  # d_in
    st.integers(1, 40),  # d_sae
    st.integers(1, 12),  # tokens
    st.integers(1, 6),  # k (clipped to d_sae)
    st.integers(0, 2**16),  # seed
)


@pytest.mark.parametrize("arch", ARCHS)
@settings(max_examples=25, deadline=None)
@given(shape=shapes)
def test_encode_and_decode_are_the_equations(arch: str, shape: tuple[int, ...]) -> None:
    d_in, d_sae, n, k, seed = shape
    cfg = SAEConfig(d_in=d_in, d_sae=d_sae, arch=arch, k=min(k, d_sae), dtype="float64",
                    d_out=d_in + 2 if arch == "transcoder" else None)  # fmt: skip
    sae = randomised(cfg, seed)
    if arch == "batchtopk":
        sae.threshold.fill_(0.4)
    x = torch.randn(n, d_in, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    for training in (True, False):
        sae.train(training)
        with torch.no_grad():
            acts = sae.encode(x)  # batchtopk: over the batch in training mode
            x_hat = sae.decode(acts)
        want = np_encode(sae, x.numpy(), batch=training)
        # a near-tie of the k-th and (k+1)-th value may pick either; the values kept must agree
        np.testing.assert_allclose(np.sort(acts.numpy(), axis=None), np.sort(want, axis=None),
                                   rtol=1e-12, atol=1e-12)  # fmt: skip
        if arch not in ("topk", "batchtopk") or _no_ties(sae, x):
            np.testing.assert_allclose(acts.numpy(), want, rtol=1e-12, atol=1e-12)
        W_dec, b_dec = sae.W_dec.detach().numpy(), sae.b_dec.detach().numpy()
        np.testing.assert_allclose(x_hat.numpy(), acts.numpy() @ W_dec + b_dec, rtol=1e-12, atol=1e-12)  # fmt: skip
        assert x_hat.shape == (n, cfg.width_out)


def _no_ties(sae: SAE, x: torch.Tensor) -> bool:
    z = sae.pre_acts(x).detach().reshape(-1).numpy()
    return len(np.unique(np.round(z, 9))) == z.size


@settings(max_examples=30, deadline=None)
@given(shape=shapes)
def test_topk_keeps_exactly_k_latents_per_token(shape: tuple[int, ...]) -> None:
    d_in, d_sae, n, k, seed = shape
    k = min(k, d_sae)
    sae = randomised(SAEConfig(d_in=d_in, d_sae=d_sae, arch="topk", k=k, dtype="float64"), seed)
    x = torch.randn(n, d_in, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    with torch.no_grad():
        z = sae.pre_acts(x)
        acts = sae.encode(x)
    # exactly min(k, #positive z) latents fire, and they are the largest z of the token
    positive = (z > 0).sum(-1)
    assert ((acts != 0).sum(-1) == torch.clamp(positive, max=k)).all()
    with torch.no_grad():
        sae.b_enc.add_(z.abs().max() + 1)  # every z > 0: exactly k
        acts = sae.encode(x)
    assert ((acts != 0).sum(-1) == k).all()
    kth = sae.pre_acts(x).detach().topk(k, -1).values[:, -1:]
    assert (sae.pre_acts(x).detach()[acts == 0] <= kth.expand_as(acts)[acts == 0]).all()


@settings(max_examples=30, deadline=None)
@given(shape=shapes)
def test_batchtopk_keeps_k_times_batch_latents_over_the_batch(shape: tuple[int, ...]) -> None:
    d_in, d_sae, n, k, seed = shape
    k = min(k, d_sae)
    cfg = SAEConfig(d_in=d_in, d_sae=d_sae, arch="batchtopk", k=k, dtype="float64")
    sae = randomised(cfg, seed).train()
    with torch.no_grad():
        sae.b_enc.add_(100.0)  # every z > 0
    x = torch.randn(3, n, d_in, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    acts = sae.encode(x)  # [3, n, d_sae]: the batch is all 3·n tokens
    assert int((acts != 0).sum()) == k * 3 * n
    per_token = (acts != 0).sum(-1)
    assert per_token.max() >= per_token.min()  # free to vary per token; the total is fixed
    least = acts.detach()[acts != 0].min()
    assert float(sae.threshold) == 0  # encoding leaves θ alone: the trainer keeps it
    terms = sae.loss(x)
    assert float(terms["least"]) == pytest.approx(float(least), rel=1e-12)
    update_threshold(sae, terms["least"])
    assert float(sae.threshold) == pytest.approx(float(least))  # the first batch sets θ
    update_threshold(sae, terms["least"] + 1)
    assert float(sae.threshold) == pytest.approx(float(least) + 0.01)  # then its running mean
    # evaluation: z · 1[z > θ]
    sae.eval()
    with torch.no_grad():
        z = sae.pre_acts(x)
        assert torch.equal(sae.encode(x), torch.where(z > sae.threshold, z, torch.zeros_like(z)))


# -- JumpReLU: the straight-through threshold gradient -----------------------------------------


def smoothed_objective(
    z: np.ndarray, theta: np.ndarray, c: np.ndarray, lam: float, eps: float
) -> float:
    """S(θ) = Σ c·J̃(z, θ) + λ Σ H̃(z − θ): the step H replaced by its convolution with the
    rectangle kernel in θ, H̃ = clip((z − θ)/ε + ½, 0, 1), and z·H(z − θ) by
    J̃ = z − (clip(θ, z − ε/2, z + ε/2)² − (z − ε/2)²)/(2ε), whose θ-derivative is
    −(θ/ε)·K((z − θ)/ε) (z below, 0 above the window, continuous)."""
    lo, hi = z - eps / 2, z + eps / 2
    J = z - (np.clip(theta, lo, hi) ** 2 - lo**2) / (2 * eps)
    H = np.clip((z - theta) / eps + 0.5, 0.0, 1.0)
    return float((c * J).sum() + lam * H.sum())


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(4, 40), d_sae=st.integers(1, 8))
def test_jumprelu_threshold_gradient_is_the_smoothed_objectives(
    seed: int, n: int, d_sae: int
) -> None:
    rng = np.random.default_rng(seed)
    eps = 0.2  # wide, so many z fall in the kernel's window
    theta = np.exp(rng.normal(np.log(0.5), 0.3, d_sae))
    z = theta + rng.uniform(-0.3, 0.3, (n, d_sae))  # pre-activations around their thresholds
    c = rng.normal(size=(n, d_sae))  # ∂L/∂f of any loss downstream: a fixed linear read-out
    lam = 0.7
    cfg = SAEConfig(
        d_in=1, d_sae=d_sae, arch="jumprelu", dtype="float64", bandwidth=eps, l0_coeff=lam
    )
    sae = SAE(cfg)
    with torch.no_grad():
        sae.log_threshold.copy_(torch.from_numpy(np.log(theta)))
    zt = torch.from_numpy(z)
    out = (torch.from_numpy(c) * jumprelu(zt, sae.theta, eps)).sum()
    out = out + lam * step(zt, sae.theta, eps).sum()
    (g_log,) = torch.autograd.grad(out, sae.log_threshold)
    g_theta = g_log.numpy() / theta  # ∂/∂θ = ∂/∂logθ / θ
    h = 1e-6
    for i in range(d_sae):  # central differences where S is smooth (no kink within h)
        kinks = np.abs(np.abs(z[:, i] - theta[i]) - eps / 2)
        if kinks.min() < 10 * h:
            continue
        up, down = theta.copy(), theta.copy()
        up[i] += h
        down[i] -= h
        fd = (smoothed_objective(z, up, c, lam, eps) - smoothed_objective(z, down, c, lam, eps)) / (
            2 * h
        )
        assert g_theta[i] == pytest.approx(fd, rel=1e-6, abs=1e-6)


def test_jumprelu_gradient_in_z_is_the_step() -> None:
    z = torch.tensor([0.1, 0.29, 0.31, 2.0], dtype=torch.float64, requires_grad=True)
    theta = torch.full((4,), 0.3, dtype=torch.float64)
    (g,) = torch.autograd.grad(jumprelu(z, theta, 0.1).sum(), z)
    assert g.tolist() == [0.0, 0.0, 1.0, 1.0]


# -- the training objective ---------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["relu", "jumprelu", "topk", "transcoder"])
def test_loss_terms_are_the_equations(arch: str) -> None:
    cfg = SAEConfig(d_in=5, d_sae=12, arch=arch, k=3, dtype="float64", aux_k=4, l1_coeff=0.3,
                    l0_coeff=0.2, aux_coeff=0.5)  # fmt: skip
    sae = randomised(cfg, 3)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(7, 5, generator=gen, dtype=torch.float64)
    y = torch.randn(7, 5, generator=gen, dtype=torch.float64) if arch == "transcoder" else x
    dead = torch.zeros(12, dtype=torch.bool)
    dead[[1, 4, 5, 6, 9, 11]] = True
    terms = sae.loss(x, None if arch != "transcoder" else y, dead=dead)
    acts = np_encode(sae, x.numpy(), batch=True)
    W_dec, b_dec = sae.W_dec.detach().numpy(), sae.b_dec.detach().numpy()
    err = y.numpy() - (acts @ W_dec + b_dec)
    assert float(terms["mse"]) == pytest.approx((err**2).sum(-1).mean(), rel=1e-12)
    z = sae.pre_acts(x).detach().numpy()
    if arch == "relu":
        want = 0.3 * (acts * np.linalg.norm(W_dec, axis=1)).sum(-1).mean()
    elif arch == "jumprelu":
        want = 0.2 * (z > np.exp(sae.log_threshold.detach().numpy())).sum(-1).mean()
    else:
        want = 0.0
    assert float(terms["sparsity"]) == pytest.approx(want, rel=1e-12, abs=1e-15)
    if arch in ("topk", "transcoder"):  # AuxK: the 4 largest z among the dead latents
        aux_acts = np.zeros_like(z)
        for n in range(len(z)):
            idx = [i for i in np.argsort(-z[n]) if dead[i]][:4]
            aux_acts[n, idx] = np.maximum(z[n, idx], 0)
        want_aux = 0.5 * ((err - aux_acts @ W_dec) ** 2).sum(-1).mean()
        assert float(terms["aux"]) == pytest.approx(want_aux, rel=1e-12)
    else:
        assert float(terms["aux"]) == 0.0
    total = terms["mse"] + terms["sparsity"] + terms["aux"]
    assert float(terms["loss"]) == pytest.approx(float(total), rel=1e-14)


def test_the_unit_norm_decoder_moves_tangent_to_its_sphere() -> None:
    sae = randomised(SAEConfig(d_in=6, d_sae=10, arch="topk", k=2, dtype="float64"), 0)
    sae.normalize_decoder()
    assert torch.allclose(sae.W_dec.norm(dim=-1), torch.ones(10, dtype=torch.float64))
    x = torch.randn(9, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    sae.loss(x)["loss"].backward()
    g0 = sae.W_dec.grad.clone()
    sae.remove_parallel_grad()
    g, w = sae.W_dec.grad, sae.W_dec.detach()
    assert torch.allclose((g * w).sum(-1), torch.zeros(10, dtype=torch.float64), atol=1e-12)
    # what is removed is parallel to w: g0 − g = (g0·w) w
    assert torch.allclose(g0 - g, (g0 * w).sum(-1, keepdim=True) * w, atol=1e-12)
    relu = randomised(SAEConfig(d_in=6, d_sae=10, arch="relu", dtype="float64"), 0)
    before = relu.W_dec.detach().clone()
    relu.normalize_decoder()  # relu's L1 weighs the norms: they stay free
    assert torch.equal(relu.W_dec.detach(), before)


# -- config and files ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"arch": "gated"}, "arch"),
        ({"k": None}, "k"),
        ({"k": 0}, "k"),
        ({"k": 17}, "k"),
        ({"d_sae": 0}, "d_sae"),
        ({"arch": "jumprelu", "bandwidth": 0.0}, "bandwidth"),
        ({"arch": "relu", "d_out": 3}, "d_out"),
        ({"dtype": "float8"}, "dtype"),
    ],
)
def test_bad_config_names_the_field(fields: dict, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        SAEConfig(**{"d_in": 4, "d_sae": 16, "arch": "topk", "k": 2, **fields})
    assert e.value.field == field and "\n" not in str(e.value)


@pytest.mark.parametrize("arch", ARCHS)
def test_save_and_load_give_the_same_function(tmp_path, arch: str) -> None:
    cfg = SAEConfig(d_in=4, d_sae=16, arch=arch, k=2, hook="blocks.0.resid_post")
    sae = randomised(cfg, 5)
    if arch == "batchtopk":
        sae.threshold.fill_(0.25)
    sae.save(tmp_path / "s", extra={"tokens": 123})
    back = SAE.load(tmp_path / "s")
    assert back.cfg == cfg and not back.training
    x = torch.randn(3, 4)
    sae.eval()
    assert torch.equal(back(x)[0], sae(x)[0]) and torch.equal(back(x)[1], sae(x)[1])
    assert not list(tmp_path.glob("s/.*tmp*"))  # atomic writes leave nothing behind


def test_a_folder_that_is_no_sae_is_one_line(tmp_path) -> None:
    with pytest.raises(InputFileError, match="not an SAE folder"):
        SAE.load(tmp_path)
    (tmp_path / "sae.json").write_text('{"format": "glassgpt-sae", "version": 9}')
    with pytest.raises(InputFileError, match="version 9 is not supported"):
        SAE.load(tmp_path)


def test_an_input_of_another_width_names_both() -> None:
    sae = SAE(SAEConfig(d_in=4, d_sae=8, arch="relu", hook="blocks.0.resid_post"))
    with pytest.raises(GlassError, match=r"blocks.0.resid_post of width 4.*\(2, 5\)"):
        sae.encode(torch.zeros(2, 5))


@settings(max_examples=10, deadline=None)
@given(shape=shapes)
def test_the_sparse_topk_backward_is_the_gradient(shape: tuple[int, ...]) -> None:
    d_in, d_sae, n, k, seed = shape
    k = min(k, d_sae)
    gen = torch.Generator().manual_seed(seed)
    u, W, b = (torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True)
               for s in ((n, d_in), (d_in, d_sae), (d_sae,)))  # fmt: skip
    W_dec = torch.randn(d_sae, d_in, generator=gen, dtype=torch.float64, requires_grad=True)

    def f(u, W, b, W_dec):
        values, index = topk_encode(u, W, b, k)
        return sparse_decode(values.relu(), index, W_dec)

    # finite differences (the selection is fixed under a small step: no near-ties drawn)
    z = (u @ W + b).detach()
    if (
        d_sae > k
        and (z.topk(k + 1, -1).values[:, -2] - z.topk(k + 1, -1).values[:, -1]).min() < 1e-4
    ):
        return
    assert torch.autograd.gradcheck(f, (u, W, b, W_dec), eps=1e-7, atol=1e-6)


def test_the_sparse_topk_loss_is_the_dense_one_with_its_gradients() -> None:
    cfg = SAEConfig(d_in=6, d_sae=30, arch="topk", k=5, dtype="float64", aux_k=3)
    sparse_sae = randomised(cfg, 7)
    x = torch.randn(11, 6, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    dead = torch.arange(30) % 3 == 0
    terms = sparse_sae.loss(x, dead=dead)
    terms["loss"].backward()
    # the same objective written densely with autograd
    p = {n: t.detach().clone().requires_grad_() for n, t in sparse_sae.named_parameters()}
    z = (x - p["b_dec"]) @ p["W_enc"] + p["b_enc"]
    v, i = z.topk(5, -1)
    acts = torch.zeros_like(z).scatter(-1, i, v.relu())
    err = x - (acts @ p["W_dec"] + p["b_dec"])
    masked = torch.where(dead, z, torch.full_like(z, -torch.inf))
    av, ai = masked.topk(3, -1)
    aux_acts = torch.zeros_like(z).scatter(-1, ai, av.relu())
    aux = ((err.detach() - aux_acts @ p["W_dec"]) ** 2).sum(-1).mean()
    dense = (err**2).sum(-1).mean() + cfg.aux_coeff * aux
    dense.backward()
    assert float(terms["loss"]) == pytest.approx(float(dense), rel=1e-12)
    for name, param in sparse_sae.named_parameters():
        assert torch.allclose(param.grad, p[name].grad, rtol=1e-10, atol=1e-12), name


@pytest.mark.parametrize("arch", ARCHS)
def test_rescaled_reads_raw_activations_as_the_scaled_sae_reads_scaled_ones(arch: str) -> None:
    cfg = SAEConfig(d_in=5, d_sae=20, arch=arch, k=3, dtype="float64")
    sae = randomised(cfg, 2).eval()
    if arch == "batchtopk":
        sae.threshold.fill_(0.3)
    x = torch.randn(9, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    s_in, s_out = 1.7, (0.6 if arch == "transcoder" else 1.7)
    raw = sae.rescaled(s_in, s_out)
    x_hat, f = raw(x)
    x_hat_s, f_s = sae(s_in * x)
    assert torch.allclose(x_hat, x_hat_s / s_out, rtol=1e-12, atol=1e-12)
    assert torch.allclose(f, f_s / s_out, rtol=1e-12, atol=1e-12)
    assert torch.equal(raw.W_dec, sae.W_dec)  # unit-norm rows stay unit norm
