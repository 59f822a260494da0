"""The sparse operations under the SAE architectures, each with its own backward.

JumpReLU's step has no useful derivative in θ; its threshold is trained by the
straight-through estimator of Rajamanoharan et al. (2024), a rectangle kernel
K(u) = 1[|u| < ½] of bandwidth ε standing in for the Dirac delta:

    ∂/∂θ [z · H(z − θ)] := −(θ/ε) K((z − θ)/ε),     ∂/∂θ H(z − θ) := −(1/ε) K((z − θ)/ε)

and ∂/∂z of z·H(z − θ) is H(z − θ) (of the step, 0). TopK's encoder and decoder keep only the
k selected latents of each token, forward and backward: no [N, d_sae] product in the gradient.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

# -- the JumpReLU step and its straight-through estimator -------------------------------------


def rectangle(u: Tensor) -> Tensor:
    """K(u) = 1[|u| < ½] (in u's dtype)."""
    return (u.abs() < 0.5).to(u.dtype)


class _JumpReLU(torch.autograd.Function):
    """f = z · H(z − θ); ∂f/∂z = H(z − θ), ∂f/∂θ := −(θ/ε) K((z − θ)/ε)."""

    @staticmethod
    def forward(ctx: Any, z: Tensor, theta: Tensor, eps: float) -> Tensor:
        ctx.save_for_backward(z, theta)
        ctx.eps = eps
        return z * (z > theta).to(z.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        z, theta = ctx.saved_tensors
        eps = ctx.eps
        g_z = grad * (z > theta).to(z.dtype)
        g_theta = grad * (-(theta / eps) * rectangle((z - theta) / eps))
        return g_z, g_theta.reshape(-1, theta.shape[-1]).sum(0), None


class _Step(torch.autograd.Function):
    """H(z − θ); ∂/∂z := 0, ∂/∂θ := −(1/ε) K((z − θ)/ε)."""

    @staticmethod
    def forward(ctx: Any, z: Tensor, theta: Tensor, eps: float) -> Tensor:
        ctx.save_for_backward(z, theta)
        ctx.eps = eps
        return (z > theta).to(z.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor, None]:
        z, theta = ctx.saved_tensors
        eps = ctx.eps
        g_theta = grad * (-(1.0 / eps) * rectangle((z - theta) / eps))
        return None, g_theta.reshape(-1, theta.shape[-1]).sum(0), None


def jumprelu(z: Tensor, theta: Tensor, bandwidth: float) -> Tensor:
    """z · H(z − θ) with the straight-through threshold gradient (the module docstring)."""
    return _JumpReLU.apply(z, theta, bandwidth)


def step(z: Tensor, theta: Tensor, bandwidth: float) -> Tensor:
    """H(z − θ) with the straight-through threshold gradient (the module docstring)."""
    return _Step.apply(z, theta, bandwidth)


def topk_relu(z: Tensor, k: int) -> Tensor:
    """ReLU(z) on the k largest entries of each row of z [..., d_sae], 0 elsewhere.

    >>> topk_relu(torch.tensor([[3.0, -1.0, 2.0, 5.0]]), 2).tolist()
    [[3.0, 0.0, 0.0, 5.0]]
    """
    values, index = z.topk(k, dim=-1, sorted=False)
    return torch.zeros_like(z).scatter_(-1, index, values.relu())


class _TopKEncoder(torch.autograd.Function):
    """(values, index) of the k largest z = u W_enc + b_enc of each row u [N, d_in]. The
    gradient of z is 0 off the k selected entries, so the backward reads only those columns:
    ∂W_enc[:, i] = Σₙ uₙ gₙᵢ, ∂b_enc[i] = Σₙ gₙᵢ, ∂uₙ = Σᵢ gₙᵢ W_enc[:, i] over the selected i,
    O(N·k·d_in) where autograd's dense path spends two [N, d_sae] × d_in products."""

    @staticmethod
    def forward(ctx: Any, u: Tensor, W_enc: Tensor, b_enc: Tensor, k: int) -> tuple[Tensor, Tensor]:
        z = torch.addmm(b_enc, u, W_enc)  # [N, d_sae]
        values, index = z.topk(k, dim=-1, sorted=False)  # [N, k] each
        ctx.save_for_backward(u, W_enc, index)
        ctx.mark_non_differentiable(index)
        return values, index

    @staticmethod
    def backward(ctx: Any, g: Tensor, _: Any) -> tuple[Tensor | None, ...]:
        u, W_enc, index = ctx.saved_tensors
        d_sae = W_enc.shape[1]
        g_u = g_W = g_b = None
        if ctx.needs_input_grad[0]:
            g_u = F.embedding_bag(index, W_enc.T.contiguous(), per_sample_weights=g, mode="sum")
        if ctx.needs_input_grad[1]:
            g_W = torch.sparse.mm(_selection(index, g, d_sae), u).T  # Gᵀ u, G [N, d_sae] sparse
        if ctx.needs_input_grad[2]:
            g_b = g.new_zeros(d_sae).index_add_(0, index.reshape(-1), g.reshape(-1))
        return g_u, g_W, g_b, None


def _selection(index: Tensor, values: Tensor, d_sae: int) -> Tensor:
    """Gᵀ as a sparse [d_sae, N] tensor: G[n, index[n, j]] = values[n, j], 0 elsewhere."""
    N, k = index.shape
    rows = torch.arange(N, device=index.device).repeat_interleave(k)
    at = torch.stack([index.reshape(-1), rows])
    return torch.sparse_coo_tensor(at, values.reshape(-1), (d_sae, N), check_invariants=False)


class _SparseDecoder(torch.autograd.Function):
    """x̂ₙ = Σⱼ vₙⱼ W_dec[iₙⱼ]; ∂W_dec = Gᵀ ∂x̂ (G the sparse codes), ∂vₙⱼ = W_dec[iₙⱼ] · ∂x̂ₙ."""

    @staticmethod
    def forward(ctx: Any, values: Tensor, index: Tensor, W_dec: Tensor) -> Tensor:
        ctx.save_for_backward(values, index, W_dec)
        return F.embedding_bag(index, W_dec, per_sample_weights=values, mode="sum")

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, Tensor | None]:
        values, index, W_dec = ctx.saved_tensors
        g_v = g_W = None
        if ctx.needs_input_grad[0]:
            g_v = torch.bmm(W_dec[index], g[:, :, None]).squeeze(-1)  # [N, k]
        if ctx.needs_input_grad[2]:
            g_W = torch.sparse.mm(_selection(index, values, W_dec.shape[0]), g)
        return g_v, None, g_W


def topk_encode(u: Tensor, W_enc: Tensor, b_enc: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(values, index) [N, k] of the k largest entries of u W_enc + b_enc per row (the
    gradient by :class:`_TopKEncoder`'s sparse backward)."""
    return _TopKEncoder.apply(u, W_enc, b_enc, k)


def sparse_decode(values: Tensor, index: Tensor, W_dec: Tensor) -> Tensor:
    """Σⱼ values[n, j] · W_dec[index[n, j]]  [N, d]: f W_dec for f nonzero only at ``index``
    (the gradient by :class:`_SparseDecoder`: O(N·k·d), no [N, d_sae] product)."""
    return _SparseDecoder.apply(values, index, W_dec)


def batch_topk_relu(z: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """ReLU(z) on the k·B largest entries of the whole batch z [..., d_sae] (B = its tokens),
    and the least value kept (for the evaluation threshold θ)."""
    flat = z.reshape(-1)
    n = z.numel() // z.shape[-1]
    values, index = flat.topk(min(k * n, flat.numel()), sorted=False)
    acts = torch.zeros_like(flat).scatter_(0, index, values.relu()).reshape(z.shape)
    return acts, values.min()
