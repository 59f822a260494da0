"""The contexts ``glassgpt sae label`` shows: a feature's top contexts from its pages, split into
those that explain and those held out for detection, and random contexts where it is silent.

    explain  = the top context and the next N of the rest (strongest first)
    held out = H contexts spread evenly over ranks 1 … K−1 of the K top contexts, so that the
               test spans the feature's range, not only its weakest top activations
    quiet    = H contexts of the same width from random windows of the corpus, f_i = 0 at
               every token of each (delphi's random non-activating examples)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.features.clt import CLT
from glassgpt.features.clt_train import check_clt, read_layers
from glassgpt.features.sae import SAE
from glassgpt.features.sites import check_model, read
from glassgpt.model import GPT


def split_ranks(available: int, explain: int, holdout: int) -> tuple[list[int], list[int]]:
    """(ranks that explain, ranks held out) among ``available`` top contexts (rank 0 the
    strongest): ``holdout`` ranks spread over 1 … available−1, at most half of them, and up to
    ``explain`` of the others, rank 0 first.

    >>> split_ranks(20, 10, 5)
    ([0, 1, 3, 4, 5, 7, 8, 9, 11, 12], [2, 6, 10, 14, 18])
    >>> split_ranks(3, 10, 5), split_ranks(1, 10, 5), split_ranks(0, 10, 5)
    (([0, 1], [2]), ([0], []), ([], []))
    """
    if available < 1:
        return [], []
    h = min(holdout, available // 2)
    step = (available - 1) / max(h, 1)
    held = [1 + int(j * step + step / 2) for j in range(h)]
    rest = [r for r in range(available) if r not in held]
    return rest[:explain], held


@torch.no_grad()
def quiet_contexts(
    model: GPT,
    sae: SAE | CLT,
    stream: Any,
    features: Sequence[int],
    *,
    n: int,
    width: tuple[int, int],
    seq_len: int,
    tokens: int,
    seed: int = 0,
    batch_tokens: int = 4096,
) -> dict[int, list[list[int]]]:
    """Up to ``n`` contexts (token ids, before + 1 + after wide) per feature from random windows
    of ``stream`` (about ``tokens`` tokens, drawn with ``seed``), each with f_i = 0 at every
    token; one per window while windows last. A feature's picks depend only on ``seed`` and its
    index, so a resumed run shows the same ones. A CLT's features are numbered as its pages
    number them: feature i of layer l is l · d_sae + i, read from u_l."""
    before, after = width
    W, T = before + after + 1, seq_len
    if len(stream) < T:
        raise GlassError(f"the data has {len(stream)} tokens, fewer than one window of {T}")
    if W > T:
        raise GlassError(f"contexts of {W} tokens do not fit windows of {T}")
    if isinstance(sae, CLT):
        check_clt(sae, model)
    else:
        site = check_model(sae, model)
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    R = max(1, tokens // T)
    starts = torch.randint(0, len(stream) - T + 1, (R,), generator=gen).tolist()
    rows = torch.stack([torch.from_numpy(stream.read(s, T).astype("int64")) for s in starts])
    sel = torch.tensor(list(features), dtype=torch.long)
    where, which = [], []  # (token of the flattened windows, feature's column) where f > 0
    B = max(1, batch_tokens // T)
    for b in range(0, R, B):
        if isinstance(sae, CLT):  # [B, T, L, d_sae] → [B, T, L · d_sae]
            f = sae.encode(read_layers(model, rows[b : b + B].to(device))[0]).flatten(-2)
        else:
            x, _ = read(model, rows[b : b + B].to(device), site)
            f = sae.encode(x.to(sae.W_enc.dtype))  # [B, T, d_sae]
        on = f.reshape(-1, f.shape[-1])[:, sel.to(f.device)] > 0  # [B·T, F]
        t, c = on.nonzero(as_tuple=True)
        where.append(t.cpu() + b * T)
        which.append(c.cpu())
    tok, col = torch.cat(where), torch.cat(which)
    order = col.argsort(stable=True)
    tok, col = tok[order], col[order]
    ends = torch.cumsum(torch.bincount(col, minlength=len(sel)), 0).tolist()
    out: dict[int, list[list[int]]] = {}
    for c, i in enumerate(sel.tolist()):
        busy = torch.zeros(R * T, dtype=torch.int32)
        busy[tok[(ends[c - 1] if c else 0) : ends[c]]] = 1
        cum = torch.cat([torch.zeros(R, 1, dtype=torch.int32), busy.view(R, T).cumsum(1)], 1)
        centres = torch.arange(before, T - after)
        silent = (cum[:, centres + after + 1] - cum[:, centres - before]) == 0  # [R, centres]
        r, j = silent.nonzero(as_tuple=True)
        out[i] = [rows[a, b : b + W].tolist() for a, b in _pick(r, centres[j] - before, n, seed, i)]
    return out


def _pick(r: Tensor, first: Tensor, n: int, seed: int, i: int) -> list[tuple[int, int]]:
    """``n`` of the candidates (window r, first token), in an order drawn from (seed, i): one
    per window first, then the rest."""
    perm = torch.randperm(len(r), generator=torch.Generator().manual_seed(seed * 1_000_003 + i))
    seen: set[int] = set()
    first_pass, second = [], []
    for p in perm.tolist():
        a = int(r[p])
        (second if a in seen else first_pass).append((a, int(first[p])))
        seen.add(a)
        if len(first_pass) >= n:
            break
    return (first_pass + second)[:n]
