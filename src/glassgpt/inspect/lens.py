"""Reading the residual stream in the vocabulary: logit lens, direct logit attribution, loss.

Logit lens: the residual stream after each layer, unembedded as if it were the last,

    lens_l = cap(N_f(x_l) W_U + b_U)     (x_0 = the embeddings; x_L gives the model's logits)

(N_f with its own scale for x_l, its gain o + w (Gemma's 1 + w); cap the final soft-cap
c·tanh(z/c) where the model has one; post-norm models have no N_f and unembed x_l directly).

Direct logit attribution (pre-norm): the final residual is a sum of parts,

    x_L = X W_E + P + Σ_l (Σ_h z_{l,h} W_O[l,h] + b_O[l] + MLP_l(·) − b_out[l] + b_out[l])

and with the final norm's scale s (one number per position, from the actual forward) frozen,
N_f(x) = (x − μ(x)) s ⊙ w + b is affine in x, so

    logits = Σ_parts ((part − μ(part)) s ⊙ w) W_U + b W_U + b_U                (layernorm)
    logits = Σ_parts (part s ⊙ w) W_U + b_U                                     (rmsnorm)

exactly (up to float rounding); w is the gain o + w. With sandwich norms (Gemma) each head's
result and b_O pass N₁' before joining the residual; its scale s' (per position) frozen too,
N₁'(Σ_h r_h) = Σ_h r_h s' ⊙ w', so each head keeps its own part. A final soft-cap
(c·tanh(z/c), Gemma) comes after the sum: ``total()`` is cap(Σ parts), the model's logits,
and each part is in the logit units before the cap. Post-norm models end in a norm whose scale multiplies the
whole sum after the last MLP; they are refused with a clear error.

Per-token loss: loss_t = −log softmax(logits_t)[token_{t+1}].

Precision: every result is in the model's dtype (float64 for a float64 model). For a bfloat16
or float16 model the lens logits stay in its dtype (they are the model's own unembedding),
while probabilities, losses and the attribution's parts (sums of many terms) are computed
and returned in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.inspect.cache import as_batch, evaluating, run_with_cache
from glassgpt.inspect.factored import widened
from glassgpt.model import GPT
from glassgpt.model.gpt import Block
from glassgpt.model.layers import softcap


@dataclass(frozen=True)
class LogitLens:
    """``names[i]`` is the residual read at row i of ``logits`` [n_layers + 1, B, T, n_vocab]."""

    names: list[str]
    logits: Tensor

    def probs(self) -> Tensor:
        """softmax over the vocabulary, same shape as ``logits`` (at least float32)."""
        return torch.softmax(widened(self.logits), dim=-1)

    def top(self, k: int = 1) -> tuple[Tensor, Tensor]:
        """(probabilities, ids) of the k most likely tokens: each [n_layers + 1, B, T, k]."""
        return torch.topk(self.probs(), k, dim=-1)


def logit_lens(model: GPT, tokens: Tensor | Sequence[int]) -> LogitLens:
    """Unembed the residual stream before the first block and after every block.

    >>> from glassgpt.model import GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=6, d_model=8, n_layers=2, n_heads=2))
    >>> lens = logit_lens(model, [1, 2, 3])
    >>> lens.names, lens.logits.shape
    (['blocks.0.resid_pre', 'blocks.0.resid_post', 'blocks.1.resid_post'], torch.Size([3, 1, 3, 10]))
    """
    L = model.config.n_layers
    names = ["blocks.0.resid_pre"] + [f"blocks.{layer}.resid_post" for layer in range(L)]
    with evaluating(model):
        _, cache = run_with_cache(model, tokens, names)
        with torch.no_grad():
            resid = torch.stack([cache[n] for n in names])  # [L + 1, B, T, d_model]
            logits = unembed(model, resid)
    return LogitLens(names, logits)


def unembed(model: GPT, resid: Tensor) -> Tensor:
    """cap(N_f(x) W_U + b_U): a residual stream [..., d_model] read as if it were the last one."""
    if model.ln_final is not None:
        resid = model.ln_final(resid)
    logits = F.linear(resid, model.W_U.T, model.unembed.b_U)  # [..., n_vocab]
    return softcap(logits, model.config.final_softcap)


@dataclass(frozen=True)
class Attribution:
    """The final logits split into parts: ``logits()`` [n_parts, B, T, ·] sums to the model's.

    ``names``: ``embed``, ``pos_embed``, ``blocks.{l}.attn.h{h}`` (each head), ``blocks.{l}.attn.b_O``,
    ``blocks.{l}.mlp`` (without its output bias), ``blocks.{l}.mlp.b_out``, ``ln_final.b``,
    ``unembed.b_U`` (only those the model has). ``resid`` [n_parts − 1, B, T, d_model] holds
    each part after the frozen final norm (the last part, b_U, lives in logit space).
    ``final_softcap``: the model's final cap c (None: none), applied by ``total()`` only.
    """

    names: list[str]
    resid: Tensor
    W_U: Tensor
    b_U: Tensor | None
    final_softcap: float | None = None

    def logits(self, ids: Tensor | None = None) -> Tensor:
        """Each part's logits: [n_parts, B, T, n_vocab], or only ``ids`` ([B, T] or [B, T, k]).

        With every id ([n_vocab] per position) the memory is n_parts · B · T · n_vocab.
        """
        if ids is None:
            out = self.resid @ self.W_U  # [n_parts, B, T, n_vocab]
            b_U = torch.zeros_like(out[0]) if self.b_U is None else self.b_U.expand_as(out[0])
        else:
            squeeze = ids.ndim == 2
            picked = ids[..., None] if squeeze else ids  # [B, T, k]
            cols = self.W_U.T[picked]  # [B, T, k, d_model]
            out = torch.einsum("pbtd,btkd->pbtk", self.resid, cols)
            b_U = torch.zeros_like(out[0]) if self.b_U is None else self.b_U[picked]
            if squeeze:
                out, b_U = out[..., 0], b_U[..., 0]
        if self.b_U is None:
            return out
        return torch.cat([out, b_U[None]])

    def total(self, ids: Tensor | None = None) -> Tensor:
        """cap(Σ parts): the model's logits (or those of ``ids``)."""
        return softcap(self.logits(ids).sum(0), self.final_softcap)


def direct_logit_attribution(model: GPT, tokens: Tensor | Sequence[int]) -> Attribution:
    """Decompose the final logits into embedding, positions, heads, MLPs and biases.

    >>> from glassgpt.model import GPTConfig
    >>> cfg = GPTConfig(n_vocab=10, n_ctx=6, d_model=8, n_layers=1, n_heads=2, unembed_bias=True)
    >>> model = GPT(cfg)
    >>> dla = direct_logit_attribution(model, [1, 2, 3])
    >>> dla.names
    ['embed', 'pos_embed', 'blocks.0.attn.h0', 'blocks.0.attn.h1', 'blocks.0.attn.b_O', 'blocks.0.mlp', 'blocks.0.mlp.b_out', 'ln_final.b', 'unembed.b_U']
    >>> bool(torch.allclose(dla.total(), model(torch.tensor([[1, 2, 3]])), atol=1e-5))
    True
    """
    cfg = model.config
    ln = model.ln_final
    if ln is None:
        raise GlassError(
            "direct logit attribution needs a pre-norm model: in a post-norm model the last "
            "norm's scale multiplies the whole residual, so its parts do not add up"
        )
    names = ["embed"] + (["pos_embed"] if model.pos_embed is not None else [])
    wanted = [*names, "result", "mlp_out", "ln_final.scale"]
    if cfg.attn_only:
        wanted.remove("mlp_out")
    if cfg.sandwich_norm:
        wanted.append("ln1_post.scale")
    with evaluating(model):
        _, cache = run_with_cache(model, tokens, wanted)
    with torch.no_grad():
        parts = [widened(cache[n]) for n in names]
        for layer in range(cfg.n_layers):
            block = cast(Block, model.blocks[layer])
            result = widened(cache["result", layer])  # [B, T, H, d_model]
            b_O = None if block.attn.b_O is None else widened(block.attn.b_O.detach())
            if block.ln1_post is not None:  # N₁'(Σ_h r_h + b_O), its scale s' frozen
                post = widened(cache["ln1_post.scale", layer]) * widened(
                    block.ln1_post.gain.detach()
                )
                result = result * post[:, :, None]
                b_O = None if b_O is None else b_O * post
            parts += result.unbind(2)
            names += [f"blocks.{layer}.attn.h{h}" for h in range(cfg.n_heads)]
            if b_O is not None:
                parts.append(b_O.expand_as(parts[0]))
                names.append(f"blocks.{layer}.attn.b_O")
            if block.mlp is not None:
                b_out = None if block.mlp.b_out is None else widened(block.mlp.b_out.detach())
                if block.ln2_post is not None:  # b_out passes N₂' with the rest: one part
                    b_out = None
                mlp = widened(cache["mlp_out", layer])
                parts.append(mlp if b_out is None else mlp - b_out)
                names.append(f"blocks.{layer}.mlp")
                if b_out is not None:
                    parts.append(b_out.expand_as(parts[0]))
                    names.append(f"blocks.{layer}.mlp.b_out")
        stacked = torch.stack(parts)  # [n_parts, B, T, d_model]
        if ln.kind == "layernorm":
            stacked = stacked - stacked.mean(-1, keepdim=True)
        scale = cache["ln_final.scale"].to(stacked.dtype)  # [B, T, 1], frozen
        stacked = stacked * scale * widened(ln.gain.detach())
        if ln.b is not None:
            stacked = torch.cat([stacked, widened(ln.b.detach()).expand_as(stacked[0])[None]])
            names.append("ln_final.b")
        b_U = model.unembed.b_U
        if b_U is not None:
            names.append("unembed.b_U")
    return Attribution(
        names, stacked, widened(model.W_U.detach()),
        None if b_U is None else widened(b_U.detach()), cfg.final_softcap,
    )  # fmt: skip


def per_token_loss(model: GPT, tokens: Tensor | Sequence[int]) -> Tensor:
    """[B, T − 1]: −log p(token_{t+1} | tokens_≤t) at each position t.

    >>> from glassgpt.model import GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=6, d_model=8, n_layers=1, n_heads=2))
    >>> per_token_loss(model, [1, 2, 3]).shape
    torch.Size([1, 2])
    """
    batch = as_batch(model, tokens)
    if batch.shape[1] < 2:
        raise GlassError("per-token loss needs at least 2 tokens (one to predict the next)")
    with evaluating(model), torch.no_grad():
        logits = model(batch)
    assert isinstance(logits, Tensor)
    logp = torch.log_softmax(widened(logits[:, :-1]), dim=-1)
    return -logp.gather(-1, batch[:, 1:, None])[..., 0]
