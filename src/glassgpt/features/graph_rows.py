"""The rows of an attribution graph (:mod:`glassgpt.features.graphs`): batched backward passes
through a retained forward of the frozen model, and the contraction of their gradients with
every source's write.

    g_l    = ∂r_t/∂mlp_out_l,  g_E = ∂r_t/∂embed          r_t = x_t[p_t] · v_t, one target per row
    A[t, s] = Σ_{l'} g_l'[p_s] · a_s W_dec[l_s → l'][i_s]   (features)
            = g_l[p] · e_l[p]   (errors),   g_E[p] · s·W_E[x_p]   (tokens)

Three things make it cheap. (1) The frozen model is affine, so one forward pass of B copies of
the prompt, its autograd graph kept, serves every batch: each batch of B targets is one
backward pass, started from the reads' layers (autograd goes no lower than it must), as
circuit-tracer's retained graph does. (2) The model is causal: a read at position p sees only
positions ≤ p, so targets are sorted into ``PREFIXES`` prompt prefixes and each prefix's frozen
model is run on its own (the backward passes shrink with it). (3) A batch of targets sorted
by (position, layer) needs gradients only at positions ≤ its last and layers below its top:
the features' part is one product per (source layer, position) of the stacked gradients
[B, K·d] with the active features' stacked, activation-scaled decoders [K·d, n_p].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from glassgpt.features.replacement import Frozen, Transcoders, run_frozen
from glassgpt.model import GPT
from glassgpt.model.hooks import HookFn

PREFIXES = 4  # prompt prefixes the targets are sorted into (a forward pass each)
Spec = tuple[int | None, int, Tensor]  # (layer read, or None for the final residual; pos; vector)


class Rows:
    """Computes rows of direct effects [n, n_active + L·T + T] for lists of target specs."""

    def __init__(self, model: GPT, tc: Transcoders, fz: Frozen, active: Sequence[Tensor],
                 values: Sequence[Tensor], batch_size: int) -> None:  # fmt: skip
        self.model, self.fz, self.batch = model, fz, batch_size
        self.L, self.T, self.d = fz.writes.shape
        self.sizes = [len(a) for a in active]
        self.offsets = [0, *torch.tensor(self.sizes, dtype=torch.long).cumsum(0).tolist()]
        self.n_cols = self.offsets[-1] + self.L * self.T + self.T
        self.n_backward = 0
        # per source layer: its targets (a run s … s+K−1), [n_s, K·d] decoders scaled by a_s,
        # and where each position's features start (features come sorted by position)
        self.targets: list[range] = []
        self.dec: list[Tensor] = []
        self.starts: list[list[int]] = []
        for s, a in enumerate(active):
            pairs = tc.decoders(s) if len(a) else []
            ts = [t for t, _ in pairs]
            assert ts == list(range(ts[0], ts[0] + len(ts))) if ts else True
            self.targets.append(range(ts[0], ts[0] + len(ts)) if ts else range(0))
            if pairs:
                pos, idx = a[:, 0], a[:, 1]
                v = values[s][:, None].to(fz.writes.dtype)
                D = torch.cat([W.detach()[idx].to(v.dtype) * v for _, W in pairs], 1)
                starts = torch.searchsorted(pos.contiguous(), torch.arange(self.T + 1, device=pos.device)).tolist()  # fmt: skip
            else:
                D, starts = fz.writes.new_zeros(0, 0), [0] * (self.T + 1)
            self.dec.append(D)
            self.starts.append(starts)
        self._graph: tuple[int, Tensor, list[Tensor], object] | None = None

    def fill(self, specs: Sequence[Spec], out: Tensor, where: Sequence[int], *, split: bool = True) -> None:  # fmt: skip
        """out[where[k], :n_cols] = the row of specs[k] (in out's dtype and device). ``split``: sort the
        targets into prompt prefixes (module docstring); without, one forward of the whole
        prompt serves every call (the capped search calls with a few targets at a time)."""
        T, L = self.T, self.L
        n_pre = min(PREFIXES, T) if split else 1
        lengths = sorted({math.ceil(T * (k + 1) / n_pre) for k in range(n_pre)})
        # within a prefix by (layer, position): a batch's backward pass then starts at one
        # layer and its products stop at a few positions
        order = sorted(range(len(specs)), key=lambda k: (L if specs[k][0] is None else specs[k][0], specs[k][1]))  # fmt: skip
        groups: dict[int, list[int]] = {}
        for k in order:
            P = next(n for n in lengths if n > specs[k][1])
            groups.setdefault(P, []).append(k)
        with _weights_fixed(self.model):
            for P, ks in sorted(groups.items()):
                for i in range(0, len(ks), self.batch):
                    self._fill(P, [specs[k] for k in ks[i : i + self.batch]], out,
                               [where[k] for k in ks[i : i + self.batch]])  # fmt: skip

    def _fill(self, P: int, specs: list[Spec], out: Tensor, where: list[int]) -> None:
        rows = self._rows(P, specs)
        out[torch.tensor(where, dtype=torch.long), : self.n_cols] = rows.to(device=out.device, dtype=out.dtype)  # fmt: skip

    def _forward(self, P: int) -> tuple[Tensor, list[Tensor], object]:
        """The frozen model on the prompt's first P tokens, B copies, its graph kept."""
        if self._graph is not None and self._graph[0] == P:
            return self._graph[1:]
        self._graph = None  # free the last prefix's graph before building this one
        fz, B = self.fz, self.batch
        embed = fz.embed[:P].expand(B, P, self.d).clone().requires_grad_(True)
        writes = [fz.writes[l, :P].expand(B, P, self.d).clone().requires_grad_(True) for l in range(self.L)]  # fmt: skip
        with torch.enable_grad():
            lin = run_frozen(self.model, fz, embed, writes, logits=False, extra=_v_alone(self.model))  # fmt: skip
        self._graph = (P, embed, writes, lin)
        return embed, writes, lin

    def _rows(self, P: int, specs: Sequence[Spec]) -> Tensor:
        """One backward pass: the rows of ≤ B specs [len(specs), n_cols] (0 past position P)."""
        embed, writes, lin = self._forward(P)
        fz, L, d, n = self.fz, self.L, self.d, len(specs)
        top = max(L if layer is None else layer for layer, _, _ in specs)  # reads see writes < top
        last = max(pos for _, pos, _ in specs) + 1  # and positions < last
        seeds: dict[int | None, Tensor] = {}
        for b, (layer, pos, vec) in enumerate(specs):
            if layer not in seeds:
                seeds[layer] = embed.new_zeros(self.batch, P, d)
            seeds[layer][b, pos] = vec.detach().to(embed.dtype)
        outs = [lin.final if layer is None else lin.u[layer] for layer in seeds]  # type: ignore[attr-defined]
        with torch.enable_grad():
            grads = torch.autograd.grad(outs, [embed, *writes[:top]], list(seeds.values()),
                                        retain_graph=True, allow_unused=True)  # fmt: skip
        self.n_backward += 1
        g_embed = grads[0] if grads[0] is not None else torch.zeros_like(embed)
        G = embed.new_zeros(self.batch, last, max(top, 1), d)  # [B, p, l', d]: g_l'[p]
        for l, g in enumerate(grads[1:]):
            if g is not None:
                G[:, :, l] = g[:, :last]
        row = embed.new_zeros(self.batch, self.n_cols)
        for s in range(min(top, L)):
            ts, D, starts = self.targets[s], self.dec[s], self.starts[s]
            k = min(ts.stop, top) - ts.start  # the targets below the reads
            if k <= 0 or not len(D):
                continue
            base = self.offsets[s]
            for p in range(last):
                j0, j1 = starts[p], starts[p + 1]
                if j1 > j0:  # [B, k·d] @ [k·d, n_p]
                    g = G[:, p, ts.start : ts.start + k].reshape(self.batch, k * d)
                    row[:, base + j0 : base + j1] = g @ D[j0:j1, : k * d].T
        e0 = self.offsets[-1]
        errs = torch.einsum("bpld,lpd->blp", G, fz.errors[: G.shape[2], :last])
        row[:, e0 : e0 + L * self.T].view(self.batch, L, self.T)[:, : G.shape[2], :last] = errs
        toks = (g_embed[:, :last] * fz.embed[:last]).sum(-1)
        row[:, e0 + L * self.T : e0 + L * self.T + last] = toks
        return row[:n].detach()


def _v_alone(model: GPT) -> dict[str, HookFn]:
    """Hooks making each layer's v its own product x W_V + b_V of the attention's input x.
    The patterns are frozen, so q and k reach no read; but the fused x W_QKV's backward would
    still stack their zero gradients beside v's and multiply all three by W_QKV. With v apart,
    each backward pass multiplies W_V alone (the fused product is then dead in the graph)."""
    post = model.config.norm_placement != "pre"  # post-norm: Attn reads resid_pre itself
    resid: dict[int, Tensor] = {}
    hooks: dict[str, HookFn] = {}

    def keep(t: Tensor, name: str) -> None:
        resid[int(name.split(".")[1])] = t

    for l, block in enumerate(model.blocks):
        attn = block.attn
        start = (attn.n_heads + attn.n_kv_heads) * attn.d_head  # v's columns come last
        W = attn.W_QKV.detach()[:, start:].contiguous()  # [d_model, G·d_head]
        b = None if attn.b_QKV is None else attn.b_QKV.detach().flatten()[start:]

        def v(t: Tensor, _name: str, l: int = l, W: Tensor = W, b: Tensor | None = b) -> Tensor:
            x = resid[l] if post else model.blocks[l].ln1(resid[l])  # (N₁'s scale: frozen)
            out = x @ W.to(x.dtype)
            return (out if b is None else out + b.to(x.dtype)).view(t.shape)

        hooks[f"blocks.{l}.resid_pre"], hooks[f"blocks.{l}.attn.v"] = keep, v
    return hooks


class _weights_fixed:
    """The model's weights without gradients for the block (restored after): the backward
    passes then compute only the gradients of the writes, never ∂W (as circuit-tracer does)."""

    def __init__(self, model: GPT) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]

    def __enter__(self) -> None:
        for p in self.params:
            p.requires_grad_(False)

    def __exit__(self, *exc: object) -> None:
        for p in self.params:
            p.requires_grad_(True)
