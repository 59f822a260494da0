"""Low-rank matrices kept as their factors: M = A B, A [..., m, r], B [..., r, n], r ≪ m, n.

A head's circuits over the vocabulary (QK, OV: n_vocab × n_vocab) have rank at most d_head,
so they are stored as two thin factors and every question is answered from the factors:

    M[i, :]          = A[i] B                               (rows, columns, a block)
    ‖M‖_F²           = tr((AᵀA)(BBᵀ))                       r × r work
    eigenvalues(M)   = eigenvalues(B A)  plus m − r zeros   (square M)
    singular values  = those of R_A R_Bᵀ, with A = Q_A R_A, Bᵀ = Q_B R_B

Only :meth:`FactoredMatrix.full` builds the m × n matrix; :meth:`top_pairs` scans it in row
blocks, so its memory stays at ``block × n``.

Precision: values are in the factors' dtype; norms, eigenvalues and singular values of
bfloat16 or float16 factors are computed and returned in float32 (:func:`widened`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from glassgpt.errors import GlassError


def widened(t: Tensor) -> Tensor:
    """``t`` in float32 if it is half precision; float32 and float64 are kept.

    The rule of every ``glassgpt.inspect`` result: the model's dtype, but at least float32.

    >>> [widened(torch.ones(1, dtype=d)).dtype for d in (torch.bfloat16, torch.float64)]
    [torch.float32, torch.float64]
    """
    return t.to(torch.promote_types(t.dtype, torch.float32))


@dataclass(frozen=True)
class FactoredMatrix:
    """M = A @ B without forming it. Leading dimensions of A and B are batch dimensions.

    >>> A, B = torch.randn(50, 3, dtype=torch.float64), torch.randn(3, 40, dtype=torch.float64)
    >>> M = FactoredMatrix(A, B)
    >>> M.shape, M.rank
    ((50, 40), 3)
    >>> bool(torch.allclose(M.rows([4, 7]), (A @ B)[[4, 7]]))
    True
    >>> bool(torch.isclose(M.norm(), torch.linalg.matrix_norm(A @ B)))
    True
    """

    A: Tensor  # [..., m, r]
    B: Tensor  # [..., r, n]

    def __post_init__(self) -> None:
        if self.A.ndim < 2 or self.B.ndim < 2 or self.A.shape[-1] != self.B.shape[-2]:
            raise GlassError(
                f"factors do not chain: A {tuple(self.A.shape)} @ B {tuple(self.B.shape)}"
            )

    # -- shape ------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        batch = torch.broadcast_shapes(self.A.shape[:-2], self.B.shape[:-2])
        return (*batch, self.A.shape[-2], self.B.shape[-1])

    @property
    def rank(self) -> int:
        """The inner dimension r (an upper bound on the rank)."""
        return self.A.shape[-1]

    @property
    def T(self) -> FactoredMatrix:
        """Mᵀ = Bᵀ Aᵀ."""
        return FactoredMatrix(self.B.transpose(-1, -2), self.A.transpose(-1, -2))

    def __getitem__(self, index: int | slice) -> FactoredMatrix:
        """Index the batch dimensions: ``M[h]`` is head h of a stack of heads."""
        if len(self.shape) < 3:
            raise GlassError("this FactoredMatrix has no batch dimension to index")
        A = self.A.expand(*self.shape[:-2], *self.A.shape[-2:])
        B = self.B.expand(*self.shape[:-2], *self.B.shape[-2:])
        return FactoredMatrix(A[index], B[index])

    def __matmul__(self, other: Tensor | FactoredMatrix) -> FactoredMatrix:
        """M @ X keeps the rank: A (B X)."""
        if isinstance(other, FactoredMatrix):
            return FactoredMatrix(self.A, (self.B @ other.A) @ other.B)
        return FactoredMatrix(self.A, self.B @ other)

    def __rmatmul__(self, other: Tensor) -> FactoredMatrix:
        return FactoredMatrix(other @ self.A, self.B)

    # -- values -----------------------------------------------------------------------------
    def full(self) -> Tensor:
        """The m × n matrix itself (memory m · n per batch entry: only when asked)."""
        return self.A @ self.B

    def rows(self, index: Tensor | list[int] | slice) -> Tensor:
        """M[..., index, :] = A[..., index, :] B."""
        return self.A[..., index, :] @ self.B

    def cols(self, index: Tensor | list[int] | slice) -> Tensor:
        """M[..., :, index] = A B[..., :, index]."""
        return self.A @ self.B[..., :, index]

    def block(self, rows: Tensor | list[int], cols: Tensor | list[int]) -> Tensor:
        """M[rows][:, cols] [..., len(rows), len(cols)]."""
        return self.A[..., rows, :] @ self.B[..., :, cols]

    def norm(self) -> Tensor:
        """Frobenius norm ‖A B‖_F = √tr((AᵀA)(BBᵀ)), per batch entry."""
        A, B = widened(self.A), widened(self.B)
        gram_a = A.transpose(-1, -2) @ A  # [..., r, r]
        gram_b = B @ B.transpose(-1, -2)  # [..., r, r]
        sq = (gram_a * gram_b.transpose(-1, -2)).sum((-1, -2))
        return sq.clamp_min(0).sqrt()

    def eigenvalues(self) -> Tensor:
        """The r eigenvalues of B A, which are the non-zero eigenvalues of the square M (complex)."""
        if self.A.shape[-2] != self.B.shape[-1]:
            raise GlassError(f"eigenvalues need a square matrix, this one is {self.shape}")
        return torch.linalg.eigvals(widened(self.B) @ widened(self.A))

    def singular_values(self) -> Tensor:
        """The r largest singular values of M, from R_A R_Bᵀ (A = Q_A R_A, Bᵀ = Q_B R_B)."""
        _, R_a = torch.linalg.qr(widened(self.A))
        _, R_b = torch.linalg.qr(widened(self.B).transpose(-1, -2))
        return torch.linalg.svdvals(R_a @ R_b.transpose(-1, -2))

    def top_pairs(
        self,
        k: int = 10,
        *,
        rows: Tensor | list[int] | None = None,
        largest: bool = True,
        block: int = 1024,
    ) -> list[tuple[int, int, float]]:
        """The k largest (or smallest) entries as (row, col, value), best first.

        Scans ``rows`` (default all) in blocks of ``block`` rows; a 2-D matrix only.
        """
        if len(self.shape) != 2:
            raise GlassError(f"top_pairs needs one matrix, got the batch shape {self.shape}")
        if k < 1:
            raise GlassError(f"top_pairs: k must be ≥ 1, got {k}")
        row_ids = torch.arange(self.shape[0]) if rows is None else torch.as_tensor(rows)
        sign = 1.0 if largest else -1.0
        best_v = torch.empty(0, dtype=self.A.dtype)
        best_i = torch.empty(0, dtype=torch.long)
        n = self.shape[1]
        for start in range(0, len(row_ids), block):
            ids = row_ids[start : start + block]
            values = (sign * self.rows(ids.to(self.A.device))).flatten().cpu()
            v, flat = torch.topk(values, min(k, values.numel()))
            pos = ids[flat // n] * n + flat % n
            best_v, order = torch.topk(torch.cat([best_v, v]), min(k, len(best_v) + len(v)))
            best_i = torch.cat([best_i, pos])[order]
        return [(int(i // n), int(i % n), float(sign * v)) for i, v in zip(best_i, best_v)]


def copying_score(ov: FactoredMatrix) -> Tensor:
    """Re(Σ λ) / Σ |λ| over the eigenvalues λ of a square circuit, in [−1, 1] (per batch entry).

    1 when every eigenvalue is positive (the circuit copies: the source token raises its own
    logit), −1 when every one is negative.

    >>> copying_score(FactoredMatrix(torch.eye(4)[:, :2], torch.eye(4)[:2])).item()
    1.0
    """
    lam = ov.eigenvalues()
    return lam.sum(-1).real / lam.abs().sum(-1).clamp_min(torch.finfo(lam.real.dtype).tiny)
