"""Muon for the blocks' matrices, AdamW for everything else (``train.optimizer = "muon"``).

Muon (momentum, orthogonalised), for a hidden matrix W [A, B] with gradient G at step t:

    M ← μ M + (1 − μ) G,        U = (1 − μ) G + μ M                 (Nesterov)
    O = NS₅(U) ≈ U_svd V_svdᵀ                                        (Newton–Schulz, below)
    W ← W (1 − η λ) − η_M · 0.2 √max(A, B) · O

where NS₅ runs five steps of X ← a X + (b X Xᵀ + c (X Xᵀ)²) X, (a, b, c) = (3.4445, −4.775,
2.0315), from X = U / ‖U‖_F (on the transposed matrix when A > B): it pushes every singular
value of U towards 1, so the update moves all directions of W by about the same amount. The
factor 0.2 √max(A, B) gives O the root-mean-square size of an AdamW update, so η_M may be set
like an AdamW learning rate; η_M = ``muon_lr`` (default ``lr``), on the same schedule as
``lr``, λ = ``weight_decay``.

This is the update of ``torch.optim.Muon`` with ``adjust_lr_fn="match_rms_adamw"`` (the test
compares the two), computed in float32: PyTorch's runs the Newton–Schulz product in bf16,
which a CPU without bf16 instructions emulates, far slower than float32. Matrices of one shape are orthogonalised
together in one batched product.

Which matrices: every parameter of ≥ 2 dimensions inside ``blocks.`` (the transformer
blocks). W_QKV [d_model, 3·n_heads·d_head] is three matrices, W_Q, W_K and W_V as
[d_model, n_heads·d_head] each; W_O [n_heads, d_head, d_model] is one, [n_heads·d_head,
d_model]; W_in and W_out are one each. The embeddings (W_E, W_P, the unembedding) and all
vectors (norm gains, biases) stay with AdamW, as in :mod:`glassgpt.train.optim`.

On a GPU the device-side skip of a non-finite step (``found_inf``, see the trainer) covers
the AdamW groups only: a NaN reaches the Muon matrices, and the run stops when the host reads
the loss one step later, before any checkpoint is written, as it does for AdamW.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor

from glassgpt.train.adamw import AdamW

NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)
NS_STEPS = 5


def orthogonalize(U: Tensor, steps: int = NS_STEPS, eps: float = 1e-7) -> Tensor:
    """NS₅ of the module docstring for a matrix [A, B] or a stack of them [n, A, B].

    Each step is two fused products, P = b G + c G G and X ← a X + P X (G = X Xᵀ)."""
    a, b, c = NS_COEFFICIENTS
    tall = U.size(-2) > U.size(-1)
    X = U.mT if tall else U
    X = X / X.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    X = X if X.dim() == 3 else X.unsqueeze(0)
    for _ in range(steps):
        gram = X @ X.mT
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        X = torch.baddbmm(X, poly, X, beta=a)
    X = X if U.dim() == 3 else X.squeeze(0)
    return X.mT if tall else X


def matrices(name: str, t: Tensor) -> list[Tensor]:
    """The matrices Muon orthogonalises in parameter ``name`` (views of ``t``, same order)."""
    if name.endswith("W_QKV"):
        return list(t.chunk(3, dim=-1))  # W_Q | W_K | W_V, each [d_model, n_heads·d_head]
    if t.dim() > 2:
        return [t.reshape(-1, t.size(-1))]  # W_O [n_heads, d_head, d_model] → [H·d_head, D]
    return [t]


def is_hidden_matrix(name: str, p: Tensor) -> bool:
    return name.startswith("blocks.") and p.dim() >= 2


class MuonAdamW(AdamW):
    """AdamW whose groups marked ``muon=True`` take the Muon update instead.

    One optimizer, so the trainer's learning-rate setting, gradient zeroing and the
    checkpoints' state by parameter name work as for AdamW; a Muon group's state is a
    ``momentum_buffer`` and a ``step`` count per parameter.
    """

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = self.param_groups
        try:
            self.param_groups = [g for g in groups if not g.get("muon")]
            super().step()
        finally:
            self.param_groups = groups
        for group in groups:
            if group.get("muon"):
                self._muon_step(group)
        return loss

    def _muon_step(self, group: dict) -> None:
        mu, lr, wd = group["momentum"], group["lr"], group["weight_decay"]
        updates: list[tuple[Tensor, Tensor]] = []  # (a matrix view of W, its U)
        for name, p in zip(group["names"], group["params"]):
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:  # "step": AdamW's state loader wants one
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["momentum_buffer"] = torch.zeros_like(p)
            state["step"] += 1
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - mu)
            U = p.grad.lerp(buf, mu)
            if wd:
                p.mul_(1 - lr * wd)
            updates += zip(matrices(name, p), matrices(name, U))
        by_shape: dict[tuple[int, ...], list[tuple[Tensor, Tensor]]] = defaultdict(list)
        for W, U in updates:
            by_shape[tuple(W.shape)].append((W, U))
        for (A, B), pairs in by_shape.items():
            O = orthogonalize(
                torch.stack([U for _, U in pairs]).float(), group.get("ns_steps", NS_STEPS)
            )
            scale = lr * 0.2 * max(A, B) ** 0.5
            for (W, _), o in zip(pairs, O):
                W.add_(o.to(W.dtype), alpha=-scale)
