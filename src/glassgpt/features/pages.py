"""Feature pages: what each latent of an SAE responds to, from one pass over a corpus.

    f(w)         = SAE.encode(a_site(w))   [B, T, d_sae], windows w of the corpus in order
    density_i    = #{tokens with f_i > 0} / N
    top_i        = the K tokens (w, t) of largest f_i > 0, each with its context
                   w[t − before … t + after] and f_i at every token of it
    histogram_i  = counts of the nonzero f_i in log-spaced bins: bin j holds
                   10^(lo + (j−1)/per_decade) ≤ f < 10^(lo + j/per_decade), bin 0 what lies
                   below 10^lo, the last bin what lies at or above 10^hi
    logit effect = N_f'(d_i) W_U,  d_i the latent's direction in the residual stream:
                   W_dec[i] for a residual-width site (resid_*, attn_out, mlp_out, and a
                   transcoder's mlp_out), W_dec[i] W_out for ``mlp.post``, Σ_h W_dec[i, h] W_O[h]
                   for ``attn.z``; N_f' is the final norm with its scale frozen, as in direct
                   logit attribution (glassgpt.inspect.lens): (d − μ(d)) ⊙ w (layernorm) or
                   d ⊙ w (rmsnorm), the scale s left out (one positive number per position: it
                   scales every token's logit alike and does not reorder them); a post-norm
                   model has no final norm, and d W_U is taken as it is

The direct path only: what the latent writes, read straight into the vocabulary, ignoring
the later layers. The pass streams batches of windows through the model and the SAE; the
running top K is one ``torch.topk`` over [K old + K new] candidates per latent and batch
(the new ones: the batch's entries above the latent's K-th value so far, sorted by value and
grouped by latent), the histogram one ``bucketize`` and ``bincount`` over the nonzero
(latent, bin) pairs: no Python loop over tokens or latents. A TopK SAE's codes travel as
their k entries per token, never as a dense [B·T, d_sae] tensor. Memory: one batch's f [B·T, d_sae] and the pages.

Store (:func:`save_pages`, :func:`load_pages`): one safetensors file per SAE (default
``SAE_DIR/features.safetensors``), written atomically; its JSON metadata under
``glassgpt`` ({"format": "glassgpt-features", "version": 1, ...}). A CLT's pages
(glassgpt.features.clt_pages) number feature i of layer l as l · d_sae + i and add
``decoder_norms`` [L · d_sae, L]: ‖W_dec[l][t − l][i]‖ for each target layer t ≥ l (0 below
l). The labels beside it (``labels.json``, written by ``glassgpt sae label``) are read with
it and shown on each page (a CLT's by "l/i").
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as st_save
from torch import Tensor

from glassgpt.errors import GlassError, InputFileError
from glassgpt.features.labels import read_labels
from glassgpt.features.sae import SAE, TopK
from glassgpt.features.sites import check_model, read
from glassgpt.formats import check_format
from glassgpt.model import GPT
from glassgpt.storage import atomic_write

FORMAT, VERSION = "glassgpt-features", 1
FILE = "features.safetensors"
ARRAYS = ("top_values", "top_where", "top_tokens", "top_acts", "hist", "count",
          "logit_top_ids", "logit_top_values", "logit_bottom_ids", "logit_bottom_values")  # fmt: skip


@dataclass(frozen=True)
class Binning:
    """Log-spaced histogram bins: ``per_decade`` bins from 10^lo to 10^hi, one below, one above.

    >>> b = Binning(lo=-1, hi=1, per_decade=1)
    >>> b.edges.tolist(), b.n_bins
    ([0.1, 1.0, 10.0], 4)
    >>> b.bin(torch.tensor([0.05, 0.1, 0.5, 3.0, 10.0])).tolist()
    [0, 1, 1, 2, 3]
    """

    lo: int = -3
    hi: int = 3
    per_decade: int = 8

    @property
    def edges(self) -> Tensor:
        n = (self.hi - self.lo) * self.per_decade
        return 10.0 ** torch.linspace(self.lo, self.hi, n + 1, dtype=torch.float64)

    @property
    def n_bins(self) -> int:
        return (self.hi - self.lo) * self.per_decade + 2

    def bin(self, values: Tensor) -> Tensor:
        """The bin of each (positive) value: bucketize with edges[j−1] ≤ v < edges[j] → j."""
        return torch.bucketize(values.double(), self.edges, right=True)


@dataclass
class FeaturePages:
    """The pages of every latent (arrays indexed by latent first) and what they were read from.

    ``top_where`` is the corpus offset of each top token (−1: an empty slot), ``top_tokens``
    [d_sae, K, W] the context's ids (−1 beyond its window), ``top_acts`` f_i there, with the
    top token at column ``before``.
    """

    top_values: Tensor  # [d_sae, K] float32, descending; 0 in empty slots
    top_where: Tensor  # [d_sae, K] int64
    top_tokens: Tensor  # [d_sae, K, W] int32
    top_acts: Tensor  # [d_sae, K, W] float32
    hist: Tensor  # [d_sae, n_bins] int64
    count: Tensor  # [d_sae] int64: tokens with f_i > 0
    logit_top_ids: Tensor  # [d_sae, n] int64 (n = 0 when the site has no logit effect)
    logit_top_values: Tensor  # [d_sae, n] float32
    logit_bottom_ids: Tensor
    logit_bottom_values: Tensor
    meta: dict[str, Any] = field(default_factory=dict)  # tokens, before, after, binning, sae, …
    decoder_norms: Tensor | None = None  # a CLT's [L · d_sae, L]; None for an SAE
    labels: dict[str, dict[str, Any]] = field(default_factory=dict)  # labels.json's, by "i"

    @property
    def d_sae(self) -> int:
        return int(self.count.shape[0])

    @property
    def tokens(self) -> int:
        return int(self.meta["tokens"])

    @property
    def density(self) -> Tensor:
        return self.count.double() / max(self.tokens, 1)

    @property
    def binning(self) -> Binning:
        return Binning(**self.meta["binning"])

    def page(self, i: int, texts: Sequence[str]) -> dict[str, Any]:
        """Latent ``i``'s page as JSON (``texts``: the text of every token id)."""
        if not 0 <= i < self.d_sae:
            raise GlassError(f"feature {i}: out of range (this SAE has {self.d_sae} latents)")
        before = int(self.meta["before"])
        contexts = []
        for k in range(self.top_values.shape[1]):
            if int(self.top_where[i, k]) < 0:
                break
            ids, acts = self.top_tokens[i, k].tolist(), self.top_acts[i, k].tolist()
            keep = [j for j, t in enumerate(ids) if t >= 0]
            contexts.append({
                "value": float(self.top_values[i, k]), "where": int(self.top_where[i, k]),
                "tokens": [texts[ids[j]] for j in keep], "acts": [round(acts[j], 5) for j in keep],
                "at": keep.index(before),
            })  # fmt: skip
        edges = self.binning.edges.tolist()
        nz = self.hist[i].nonzero().squeeze(-1).tolist()
        hist = [] if not nz else [
            {"lo": edges[j - 1] if j > 0 else 0.0, "hi": edges[j] if j < len(edges) else None,
             "count": int(self.hist[i, j])} for j in range(nz[0], nz[-1] + 1)
        ]  # fmt: skip

        def logits(ids: Tensor, values: Tensor) -> list[dict[str, Any]]:
            return [{"id": int(t), "text": texts[int(t)], "value": round(float(v), 5)}
                    for t, v in zip(ids[i], values[i])]  # fmt: skip

        page = {
            "id": i, "density": float(self.density[i]), "count": int(self.count[i]),
            "tokens": self.tokens, "max": float(self.top_values[i, 0]) if contexts else 0.0,
            "contexts": contexts, "histogram": hist,
            "logit_top": logits(self.logit_top_ids, self.logit_top_values),
            "logit_bottom": logits(self.logit_bottom_ids, self.logit_bottom_values),
            "label": self.labels.get(str(i)),  # {"label", "detection", …} or None
        }  # fmt: skip
        if self.decoder_norms is not None:  # a CLT's feature: its layer and its writes
            S, norms = int(self.meta["clt"]["d_sae"]), self.decoder_norms[i].tolist()
            layer = i // S
            page.update(layer=layer, index=i % S, label=self.labels.get(f"{layer}/{i % S}"), decoder_norms=[
                {"layer": t, "norm": float(f"{norms[t]:.6g}")} for t in range(layer, len(norms))])  # fmt: skip
        return page


class TopContexts:
    """Running per-latent top K of f > 0 over batches, with each top token's context."""

    def __init__(self, d_sae: int, *, top: int, before: int, after: int, binning: Binning) -> None:
        if top < 1 or before < 0 or after < 0:
            raise GlassError(f"top={top}, before={before}, after={after}: need top ≥ 1, the others ≥ 0")  # fmt: skip
        self.K, self.before, self.after, self.binning = top, before, after, binning
        W = before + after + 1
        self.values = torch.full((d_sae, top), -math.inf)
        self.where = torch.full((d_sae, top), -1, dtype=torch.int64)
        self.ctx_tokens = torch.full((d_sae, top, W), -1, dtype=torch.int32)
        self.ctx_acts = torch.zeros(d_sae, top, W)
        self.hist = torch.zeros(d_sae * binning.n_bins, dtype=torch.int64)
        self.count = torch.zeros(d_sae, dtype=torch.int64)
        self.tokens = 0

    @torch.no_grad()
    def add(self, tokens: Tensor, f: Tensor, where: Tensor) -> None:
        """One batch: ``tokens`` [B, T], dense ``f`` [B, T, d_sae], ``where`` [B] the windows'
        corpus offsets."""
        B, T, S = f.shape
        flat = f.detach().float().cpu().reshape(B * T, S)
        rows, cols = (flat > 0).nonzero(as_tuple=True)
        self._add(tokens, rows, cols, flat[rows, cols], lambda n, i: flat[n, i[..., None]], where)

    @torch.no_grad()
    def add_sparse(self, tokens: Tensor, values: Tensor, index: Tensor, where: Tensor) -> None:
        """One batch of codes given by their nonzero entries: f[b, t, index[b, t, j]] =
        values[b, t, j] (a TopK SAE's k per token; entries ≤ 0 are not active)."""
        B, T, k = values.shape
        vals = values.detach().float().cpu().reshape(B * T, k)
        idx = index.cpu().reshape(B * T, k)
        rows, j = (vals > 0).nonzero(as_tuple=True)

        def act_at(n: Tensor, i: Tensor) -> Tensor:  # f_i at tokens n [M, W] for latents i [M]
            out = vals.new_zeros(n.shape)
            for a in range(0, len(n), 4096):  # [4096, W, k] at a time
                m, c = n[a : a + 4096], i[a : a + 4096, None, None]
                out[a : a + 4096] = (vals[m] * (idx[m] == c)).sum(-1)
            return out

        self._add(tokens, rows, idx[rows, j], vals[rows, j], act_at, where)

    def _add(self, tokens: Tensor, rows: Tensor, cols: Tensor, vals: Tensor, act_at: Any,
             where: Tensor) -> None:  # fmt: skip
        """The nonzero entries (token ``rows`` of the flattened batch, latent ``cols``, value
        ``vals``); ``act_at(n [M, W], i [M]) -> [M, W]`` reads f_i at any tokens."""
        B, T = tokens.shape
        S, K, nb = self.count.shape[0], self.K, self.binning.n_bins
        self.tokens += B * T
        self.count += torch.bincount(cols, minlength=S)
        self.hist += torch.bincount(cols * nb + self.binning.bin(vals), minlength=S * nb)
        # only entries above a latent's K-th largest so far can enter its top K (few, once
        # the pass is under way); of those, each latent's K largest: sort by value, then
        # stably by latent
        above = vals > self.values[:, -1][cols]
        rows, cols, vals = rows[above], cols[above], vals[above]
        order = vals.argsort(descending=True, stable=True)
        order = order[cols[order].argsort(stable=True)]
        c = cols[order]
        first = torch.cumsum(torch.bincount(c, minlength=S), 0) - torch.bincount(c, minlength=S)
        rank = torch.arange(len(c)) - first[c]
        keep = rank < K
        sel_c, sel_r, pick = c[keep], rank[keep], order[keep]
        new_v = torch.full((S, K), -math.inf)
        new_v[sel_c, sel_r] = vals[pick]
        new_n = torch.zeros(S, K, dtype=torch.int64)  # the token of each candidate
        new_n[sel_c, sel_r] = rows[pick]
        # merge with the running top K; contexts only for the candidates that get in
        self.values, sel = torch.cat([self.values, new_v], 1).topk(K, dim=1)
        won = (sel >= K) & (self.values > -math.inf)  # [S, K]: slots now held by a new entry
        lat, slot = won.nonzero(as_tuple=True)
        n = new_n[lat, sel[lat, slot] - K]  # [M]
        b, t = n // T, n % T
        offs = torch.arange(-self.before, self.after + 1)
        pos = t[:, None] + offs  # [M, W]
        inside = (pos >= 0) & (pos < T)
        flat_n = b[:, None] * T + pos.clamp(0, T - 1)
        old = sel.clamp(max=K - 1)
        self.where = self.where.gather(1, old)
        self.ctx_tokens = self.ctx_tokens.gather(1, old[..., None].expand_as(self.ctx_tokens))
        self.ctx_acts = self.ctx_acts.gather(1, old[..., None].expand_as(self.ctx_acts))
        self.where[lat, slot] = where.cpu()[b] + t
        tok = tokens.cpu().reshape(-1)[flat_n].to(torch.int32)
        self.ctx_tokens[lat, slot] = torch.where(inside, tok, -1)
        self.ctx_acts[lat, slot] = torch.where(inside, act_at(flat_n, lat), 0.0)
        self.where[self.values == -math.inf] = -1

    def pages(self, logit: tuple[Tensor, ...], meta: dict[str, Any]) -> FeaturePages:
        empty = self.where < 0
        return FeaturePages(
            top_values=torch.where(empty, 0.0, self.values),
            top_where=self.where,
            top_tokens=torch.where(empty[..., None], -1, self.ctx_tokens),
            top_acts=torch.where(empty[..., None], 0.0, self.ctx_acts),
            hist=self.hist.reshape(-1, self.binning.n_bins),
            count=self.count,
            logit_top_ids=logit[0], logit_top_values=logit[1],
            logit_bottom_ids=logit[2], logit_bottom_values=logit[3],
            meta={**meta, "tokens": self.tokens, "before": self.before, "after": self.after,
                  "binning": {"lo": self.binning.lo, "hi": self.binning.hi,
                              "per_decade": self.binning.per_decade}},
        )  # fmt: skip


# -- the logit effect ------------------------------------------------------------------------


def residual_directions(model: GPT, sae: SAE) -> Tensor | None:
    """d_i [d_sae, d_model]: each latent's decoder direction in the residual stream (module
    docstring), or None when the site has none (q, k, v, a norm's scale, …)."""
    W_dec = sae.W_dec.detach()
    site = check_model(sae, model)
    name = site.out_hook or site.hook
    part = name.split(".", 2)[-1] if name.startswith("blocks.") else name
    d = model.config.d_model
    if part in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "embed",
                "pos_embed") and W_dec.shape[1] == d:  # fmt: skip
        return W_dec
    layer = site.layer
    if layer is None:
        return None
    block = model.blocks[layer]
    if part == "mlp.post":
        return W_dec @ block.mlp.W_out.detach().to(W_dec.dtype)  # [d_sae, d_model]
    if part == "attn.z":
        W_O = block.attn.W_O.detach().to(W_dec.dtype)  # [H, d_head, d_model]
        return torch.einsum("shk,hkm->sm", W_dec.reshape(len(W_dec), *W_O.shape[:2]), W_O)
    if part == "attn.result":
        return W_dec.reshape(len(W_dec), model.config.n_heads, d).sum(1)
    return None


@torch.no_grad()
def logit_effect(model: GPT, sae: SAE, n: int = 10, chunk: int = 256) -> tuple[Tensor, ...]:
    """(top ids, top values, bottom ids, bottom values), each [d_sae, n]: the largest and
    smallest entries of N_f'(d_i) W_U (module docstring); [d_sae, 0] when the site has none."""
    return logit_effect_of(model, residual_directions(model, sae), sae.cfg.d_sae, n, chunk)


@torch.no_grad()
def logit_effect_of(model: GPT, dirs: Tensor | None, S: int, n: int = 10, chunk: int = 256) -> tuple[Tensor, ...]:  # fmt: skip
    """:func:`logit_effect` of the residual directions ``dirs`` [S, d_model] (None: none)."""
    if dirs is None or n < 1:
        e = torch.zeros(S, 0)
        return e.long(), e, e.long(), e
    W_U = model.W_U.detach().double().cpu()
    ln = model.ln_final
    n = min(n, W_U.shape[1])
    out: list[list[Tensor]] = [[], [], [], []]
    for start in range(0, S, chunk):
        dd = dirs[start : start + chunk].double().cpu()
        if ln is not None:
            if ln.kind == "layernorm":
                dd = dd - dd.mean(-1, keepdim=True)
            dd = dd * ln.gain.detach().double().cpu()  # o + w (Gemma: 1 + w)
        z = dd @ W_U  # [chunk, n_vocab]
        for j, largest in ((0, True), (2, False)):
            v, i = z.topk(n, dim=1, largest=largest)
            out[j].append(i)
            out[j + 1].append(v.float())
    return tuple(torch.cat(parts) for parts in out)


# -- the pass ---------------------------------------------------------------------------------


@torch.no_grad()
def compute_pages(
    model: GPT,
    sae: SAE,
    batches: Iterable[tuple[Tensor, Tensor]],
    *,
    top: int = 20,
    before: int = 12,
    after: int = 4,
    binning: Binning | None = None,
    logits: int = 10,
    meta: dict[str, Any] | None = None,
) -> FeaturePages:
    """The pages of every latent over ``batches`` of (windows [B, T], their corpus offsets [B])."""
    site = check_model(sae, model)
    sae = sae.eval()
    device = next(model.parameters()).device
    acc = TopContexts(sae.cfg.d_sae, top=top, before=before, after=after, binning=binning or Binning())  # fmt: skip
    for tokens, where in batches:
        x, _ = read(model, tokens.to(device), site)
        if isinstance(sae, TopK):  # f = ReLU on the k largest z: only those k travel
            assert sae.cfg.k is not None
            values, index = sae.pre_acts(x.to(sae.W_enc.dtype)).topk(sae.cfg.k, dim=-1)
            acc.add_sparse(tokens, values.relu(), index, where)
        else:
            acc.add(tokens, sae.encode(x.to(sae.W_enc.dtype)), where)  # [B, T, d_sae]
    if acc.tokens == 0:
        raise GlassError("no tokens to compute feature pages on (the data is empty)")
    return acc.pages(logit_effect(model, sae, logits), dict(meta or {}, hook=sae.cfg.hook))


def windows(
    stream: Any, *, seq_len: int, batch: int, tokens: int
) -> Iterable[tuple[Tensor, Tensor]]:
    """(windows [B, T], offsets [B]): disjoint consecutive windows of ``stream`` from its start,
    about ``tokens`` tokens in all (whole windows; the last batch may be short)."""
    n = min(len(stream) // seq_len, max(1, -(-tokens // seq_len)))
    if n == 0:
        raise GlassError(f"the data has {len(stream)} tokens, fewer than one window of {seq_len}")
    for first in range(0, n, batch):
        starts = torch.arange(first, min(first + batch, n)) * seq_len
        rows = [torch.from_numpy(stream.read(int(s), seq_len).astype("int64")) for s in starts]
        yield torch.stack(rows), starts


# -- the file -----------------------------------------------------------------------------------


def save_pages(path: str | Path, pages: FeaturePages) -> Path:
    """Write ``pages`` to one safetensors file (arrays + JSON metadata), atomically."""
    path = Path(path)
    tensors = {name: getattr(pages, name).contiguous() for name in ARRAYS}
    if pages.decoder_norms is not None:
        tensors["decoder_norms"] = pages.decoder_norms.float().contiguous()
    doc = {"format": FORMAT, "version": VERSION, **pages.meta}
    atomic_write(path, st_save(tensors, metadata={"glassgpt": json.dumps(doc)}))
    return path


def load_pages(path: str | Path) -> FeaturePages:
    """The pages in ``path`` (a file, or an SAE folder holding ``features.safetensors``)."""
    path = Path(path)
    if path.is_dir():
        path = next((p / FILE for p in (path, path / "sae", path / "clt") if (p / FILE).is_file()), path / FILE)  # fmt: skip
    if not path.is_file():
        raise InputFileError(f"{path}: no feature pages (make them with glassgpt sae features)")
    try:
        with safe_open(str(path), framework="pt") as f:
            doc = json.loads((f.metadata() or {}).get("glassgpt", "null"))
            doc = check_format(doc, path, FORMAT, VERSION, what="feature pages format",
                               not_ours="not a glassgpt feature pages file")  # fmt: skip
            arrays = {name: f.get_tensor(name) for name in ARRAYS}
            norms = f.get_tensor("decoder_norms") if "decoder_norms" in f.keys() else None  # noqa: SIM118 (safe_open has no __contains__)
    except (SafetensorError, OSError, ValueError) as e:
        raise InputFileError(f"{path}: unreadable ({str(e).splitlines()[0]})") from None
    except KeyError as e:
        raise InputFileError(f"{path}: lacks the array {e}") from None
    meta = {k: v for k, v in doc.items() if k not in ("format", "version")}
    return FeaturePages(**arrays, meta=meta, decoder_norms=norms, labels=read_labels(path.parent))
