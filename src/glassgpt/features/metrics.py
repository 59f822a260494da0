"""How good a sparse dictionary is: sparsity, reconstruction, and what the model loses with it.

    L0                 (1/N) Σₙ #{i : fₙᵢ ≠ 0}                     latents firing per token
    FVU                Σₙ ‖yₙ − ŷₙ‖² / Σₙ ‖yₙ − ȳ‖²                 fraction of variance unexplained
    CE loss recovered  (L_zero − L_sae) / (L_zero − L_clean)
                       L_clean  the model's next-token loss
                       L_sae    with the site's activation replaced by the SAE's reconstruction
                                (a transcoder: the MLP's output by its prediction)
                       L_zero   with the site's activation replaced by 0
    density_i          (1/N) Σₙ 1[fₙᵢ ≠ 0];  dead: density 0;  dense: density > ``dense``

1 means the SAE loses nothing the model needs; 0, no better than deleting the activation.

:func:`measure` is the one measurement that ``sae eval`` prints and ``sae train`` closes with:
the first ``EVAL_TOKENS`` tokens of the val split (else train) in windows of min(n_ctx, 256),
so the two agree on the same SAE and data. The dead fraction needs that many: over a few
thousand tokens, a rare latent looks dead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from glassgpt.data import DataDir, iter_eval_batches
from glassgpt.errors import GlassError
from glassgpt.features.sae import SAE
from glassgpt.features.sites import Site, check_model, read, splice_hooks
from glassgpt.model import GPT

DENSE = 0.1  # a latent firing on more than this fraction of tokens is dense
EVAL_TOKENS = 65_536  # sae eval's default, and what sae train's closing line reads
EVAL_BATCH = 8  # windows per forward pass


def l0(acts: Tensor) -> float:
    """Mean number of nonzero latents per token.

    >>> l0(torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]]))
    1.5
    """
    return float((acts != 0).reshape(-1, acts.shape[-1]).sum(-1).double().mean())


def fvu(y: Tensor, y_hat: Tensor) -> float:
    """Σ‖y − ŷ‖² / Σ‖y − ȳ‖² over the tokens (rows) of y [..., d].

    >>> fvu(torch.tensor([[0.0], [2.0]]), torch.tensor([[1.0], [1.0]]))
    1.0
    """
    y, y_hat = y.reshape(-1, y.shape[-1]).double(), y_hat.reshape(-1, y.shape[-1]).double()
    total = (y - y.mean(0)).pow(2).sum()
    return float((y - y_hat).pow(2).sum() / total) if total > 0 else float("nan")


def recovered(clean: float, spliced: float, zero: float) -> float:
    """(L_zero − L_sae) / (L_zero − L_clean).

    >>> recovered(clean=2.0, spliced=2.5, zero=4.0)
    0.75
    """
    return (zero - spliced) / (zero - clean) if zero != clean else float("nan")


def _zero_hooks(site: Site) -> dict[str, Any]:
    return {site.last: lambda t, _name: torch.zeros_like(t)}


@torch.no_grad()
def ce_losses(model: GPT, sae: SAE, x: Tensor, y: Tensor) -> dict[str, float]:
    """The mean next-token loss of the batch x → y [B, T]: clean, with the SAE spliced in, and
    with the site zeroed."""
    site = check_model(sae, model)
    _, clean = model(x, targets=y)
    with model.hooks(splice_hooks(model, sae)):
        _, spliced = model(x, targets=y)
    with model.hooks(_zero_hooks(site)):
        _, zero = model(x, targets=y)
    return {"ce_clean": float(clean), "ce_sae": float(spliced), "ce_zero": float(zero)}


@torch.no_grad()
def evaluate(
    model: GPT,
    sae: SAE,
    batches: Iterable[tuple[Tensor, Tensor]],
    *,
    dense: float = DENSE,
) -> dict[str, Any]:
    """Every metric of the module docstring over token batches (x, y) [B, T], token-weighted:
    ``l0``, ``fvu``, ``mse``, ``ce_clean``, ``ce_sae``, ``ce_zero``, ``ce_recovered``,
    ``dead_fraction``, ``dense_fraction``, ``tokens``. The SAE is put in eval mode."""
    site = check_model(sae, model)
    was_training = sae.training
    sae.eval()
    device = next(sae.parameters()).device
    fires = torch.zeros(sae.cfg.d_sae, dtype=torch.float64, device=device)
    n = 0
    nonzero = 0.0
    err = 0.0
    sum_y: Tensor | None = None
    sum_y2 = 0.0
    ce = {"ce_clean": 0.0, "ce_sae": 0.0, "ce_zero": 0.0}
    try:
        for x, y in batches:
            a, target = read(model, x, site)
            a = a.reshape(-1, a.shape[-1])
            target = (a if target is None else target.reshape(-1, target.shape[-1])).double()
            y_hat, acts = sae(a)
            m = a.shape[0]
            fired = acts != 0
            fires += fired.sum(0).double()
            nonzero += float(fired.sum())
            err += float((target - y_hat.double()).pow(2).sum())
            sum_y = target.sum(0) if sum_y is None else sum_y + target.sum(0)
            sum_y2 += float(target.pow(2).sum())
            for key, value in ce_losses(model, sae, x, y).items():
                ce[key] += value * m
            n += m
    finally:
        sae.train(was_training)
    if n == 0 or sum_y is None:
        raise GlassError("no tokens to evaluate the SAE on")
    variance = sum_y2 - float(sum_y.pow(2).sum()) / n  # Σ‖y − ȳ‖²
    density = fires / n
    out: dict[str, Any] = {key: value / n for key, value in ce.items()}
    out.update(
        l0=nonzero / n,
        fvu=err / variance if variance > 0 else float("nan"),
        mse=err / n,
        ce_recovered=recovered(out["ce_clean"], out["ce_sae"], out["ce_zero"]),
        dead_fraction=float((density == 0).double().mean()),
        dense_fraction=float((density > dense).double().mean()),
        tokens=n,
    )
    return out


def eval_window(n_ctx: int, seq_len: int | None = None) -> int:
    """The window length: ``seq_len``, else n_ctx, at most 256.

    >>> eval_window(1024), eval_window(64), eval_window(64, 16)
    (256, 64, 16)
    """
    T = seq_len or min(n_ctx, 256)
    if not 1 <= T <= n_ctx:
        raise GlassError(f"--seq-len: must be in [1, n_ctx={n_ctx}], got {T}")
    return T


def eval_split(data: DataDir, seq_len: int) -> str:
    """val, when it holds more than one window's tokens; else train."""
    return "val" if "val" in data.meta.splits and data.split("val").tokens > seq_len else "train"


def measure(
    model: GPT,
    sae: Any,
    stream: Any,
    *,
    seq_len: int,
    tokens: int = EVAL_TOKENS,
    device: torch.device | str | None = None,
    dense: float = DENSE,
    how: Callable[..., dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """:func:`evaluate` (or ``how``, with its arguments: a CLT's) on the first ``tokens``
    tokens of ``stream`` (whole windows of ``seq_len``, ``EVAL_BATCH`` to a forward; at least
    one batch)."""
    if tokens < 1:
        raise GlassError(f"--tokens: must be ≥ 1, got {tokens}")
    max_batches = max(1, tokens // (EVAL_BATCH * seq_len))
    batches = ((x.to(device), y.to(device)) if device is not None else (x, y)
               for x, y in iter_eval_batches(stream, batch_size=EVAL_BATCH, seq_len=seq_len,
                                             max_batches=max_batches))  # fmt: skip
    return (how or evaluate)(model, sae, batches, dense=dense)
