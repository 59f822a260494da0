from __future__ import annotations

import pytest
import torch

from glassgpt.config import ConfigError
from glassgpt.model import GPT, GPTConfig
from glassgpt.train.config import TrainConfig, load_run_config
from glassgpt.train.muon import MuonAdamW, matrices, orthogonalize
from glassgpt.train.optim import build_optimizer, load_optimizer_tensors, optimizer_tensors

CFG = GPTConfig(n_vocab=17, n_ctx=16, d_model=32, n_layers=2, n_heads=4, bias=False)
TRAIN = TrainConfig(optimizer="muon", lr=2e-2, muon_lr=3e-2, weight_decay=0.1, warmup_steps=0)


def model_with_grads(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(CFG)
    x = torch.randint(0, CFG.n_vocab, (4, CFG.n_ctx))
    _, loss = model(x, x.roll(1, dims=1))
    loss.backward()
    return model


def test_orthogonalize_flattens_the_singular_values_of_a_tall_and_a_wide_matrix() -> None:
    torch.manual_seed(0)
    for rows, cols in [(48, 16), (16, 48)]:
        k = min(rows, cols)
        U, _ = torch.linalg.qr(torch.randn(rows, k, dtype=torch.float64))
        V, _ = torch.linalg.qr(torch.randn(cols, k, dtype=torch.float64))
        S = torch.logspace(-1, 1, k, dtype=torch.float64)  # singular values 0.1 … 10
        O = orthogonalize(U @ torch.diag(S) @ V.T)
        inner = U.T @ O @ V  # diagonal if O keeps G's singular vectors
        s = torch.diagonal(inner)
        assert s.min() > 0.5 and s.max() < 1.25  # NS₅ lands near 1, not exactly on it
        assert (inner - torch.diag(s)).abs().max() < 1e-9
        assert torch.allclose(torch.linalg.svdvals(O).sort().values, s.sort().values)


def conditioned(rows: int, cols: int, low: float, high: float) -> torch.Tensor:
    """A random [rows, cols] matrix with singular values spread over [low, high]."""
    k = min(rows, cols)
    U, _ = torch.linalg.qr(torch.randn(rows, k))
    V, _ = torch.linalg.qr(torch.randn(cols, k))
    return U @ torch.diag(torch.linspace(low, high, k)) @ V.T


@pytest.mark.parametrize("steps", [1, 3])
def test_each_matrix_moves_as_torch_muon_moves_it(steps: int) -> None:
    """The oracle: torch.optim.Muon (match_rms_adamw) on each matrix as its own 2-D
    parameter, fed the same gradients. Torch's Newton–Schulz runs in bf16, whose error grows
    in directions of small singular values, so the gradients here are well conditioned:
    G_t = G + 0.2 t H keeps every singular value of the momentum ≥ 0.6 (Weyl). There torch's
    bf16 result is about 2% (relative, Frobenius) from a float64 Newton–Schulz; 4% allowed."""
    model = model_with_grads()
    opt = build_optimizer(model, TRAIN)
    assert isinstance(opt, MuonAdamW)
    (muon_group,) = [g for g in opt.param_groups if g.get("muon")]
    assert all(n.startswith("blocks.") for n in muon_group["names"])
    assert {n.rsplit(".", 1)[1] for n in muon_group["names"]} == {"W_QKV", "W_O", "W_in", "W_out"}
    named = dict(zip(muon_group["names"], muon_group["params"]))
    oracle = {}  # (name, i) → (a 2-D copy of matrix i, torch's Muon over it, G, H)
    for n, p in named.items():
        for i, W in enumerate(matrices(n, p.detach())):
            copy = torch.nn.Parameter(W.clone())
            torch_opt = torch.optim.Muon(
                [copy], lr=TRAIN.muon_lr, weight_decay=TRAIN.weight_decay,
                momentum=TRAIN.muon_momentum, adjust_lr_fn="match_rms_adamw",
            )  # fmt: skip
            G, H = conditioned(*W.shape, 1.0, 2.0), conditioned(*W.shape, 0.5, 1.0)
            oracle[n, i] = (copy, torch_opt, G, H)
    before = {n: p.detach().clone() for n, p in named.items()}
    for t in range(steps):
        for n, p in named.items():
            grad = torch.zeros_like(p)
            for i, G_view in enumerate(matrices(n, grad)):
                copy, torch_opt, G, H = oracle[n, i]
                copy.grad = G + 0.2 * t * H
                G_view.copy_(copy.grad)
                torch_opt.step()
            p.grad = grad
        opt.step()
    for n, p in named.items():
        for i, (W, W0) in enumerate(zip(matrices(n, p.detach()), matrices(n, before[n]))):
            ours, theirs = W - W0, oracle[n, i][0].detach() - W0
            assert (ours - theirs).norm() < 0.04 * theirs.norm(), (n, i)


@pytest.mark.parametrize("ns_steps", [2, 5])
def test_muon_ns_steps_sets_the_newton_schulz_steps(ns_steps: int) -> None:
    """The first step moves W_in by −η_M · 0.2 √max(A, B) · NS_k(G) (no decay; the first
    Nesterov U is a multiple of G, and NS normalises it)."""
    model = model_with_grads()
    cfg = TrainConfig(optimizer="muon", lr=2e-2, muon_lr=3e-2, weight_decay=0.0,
                      warmup_steps=0, muon_ns_steps=ns_steps)  # fmt: skip
    opt = build_optimizer(model, cfg)
    (muon_group,) = [g for g in opt.param_groups if g.get("muon")]
    W = model.blocks[0].mlp.W_in
    G, W0 = W.grad.clone(), W.detach().clone()
    opt.step()
    A, B = W.shape
    want = -muon_group["lr"] * 0.2 * max(A, B) ** 0.5 * orthogonalize(G, ns_steps)
    torch.testing.assert_close(W.detach() - W0, want, rtol=1e-4, atol=1e-7)
    other = orthogonalize(G, 7 - ns_steps)  # a different number of steps moves W otherwise
    assert (other - orthogonalize(G, ns_steps)).abs().max() > 1e-3


def test_the_other_parameters_move_as_torch_adamw_moves_them() -> None:
    model = model_with_grads()
    opt = build_optimizer(model, TRAIN)
    others = [(n, p) for g in opt.param_groups if not g.get("muon")
              for n, p in zip(g["names"], g["params"])]  # fmt: skip
    assert {n for n, _ in others} >= {"embed.W_E", "pos_embed.W_P", "ln_final.w"}
    copies = {n: torch.nn.Parameter(p.detach().clone()) for n, p in others}
    decayed = [copies[n] for n, p in others if p.dim() >= 2]
    flat = [copies[n] for n, p in others if p.dim() < 2]
    ref = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": TRAIN.weight_decay},
         {"params": flat, "weight_decay": 0.0}],
        lr=TRAIN.lr, betas=(TRAIN.beta1, TRAIN.beta2), eps=TRAIN.eps,
    )  # fmt: skip
    for n, p in others:
        copies[n].grad = p.grad.clone()
    opt.step()
    ref.step()
    for n, p in others:
        torch.testing.assert_close(p.detach(), copies[n].detach(), rtol=1e-6, atol=1e-7)


def test_training_with_muon_lowers_the_loss() -> None:
    torch.manual_seed(0)
    model = GPT(CFG)
    cfg = TrainConfig(optimizer="muon", lr=1e-2, warmup_steps=0)
    opt = build_optimizer(model, cfg)
    text = torch.tensor([i % 7 for i in range(4 * (CFG.n_ctx + 1))]).view(4, -1)
    x, y = text[:, :-1], text[:, 1:]
    losses = []
    for _ in range(30):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_muon_state_is_saved_and_restored_by_name() -> None:
    model = model_with_grads()
    opt = build_optimizer(model, TRAIN)
    opt.step()
    tensors, groups = optimizer_tensors(opt)
    tensors = {k: v.clone() for k, v in tensors.items()}  # as from a file: opt's are not shared
    assert any(k.endswith("W_O.momentum_buffer") for k in tensors)
    twin = model_with_grads()
    twin.load_state_dict(model.state_dict())
    opt2 = build_optimizer(twin, TRAIN)
    load_optimizer_tensors(opt2, tensors, groups)
    for o in (opt, opt2):
        o.step()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("optimizer", "sgd"),
        ("muon_lr", -1.0),
        ("muon_lr", 0.0),
        ("muon_momentum", 1.0),
        ("muon_ns_steps", 0),
        ("muon_ns_steps", 2.5),
    ],
)
def test_bad_optimizer_settings_name_their_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"train.{field}"):
        load_run_config(preset="cpu-tiny", overrides=[f"train.{field}={value}"])
