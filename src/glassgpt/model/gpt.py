"""The GPT function f_θ : V^n → ℝ^{n × n_vocab}, n ≤ n_ctx (decoder-only).

    x₀ = s · X W_E + P[:n]                 X the one-hot tokens, P = W_P, PE, or 0 (RoPE/none),
                                           s = embed_scale (1; Gemma √d_model)
    pre-norm block:   x_mid = x + Attn(N₁(x)),        x_out = x_mid + MLP(N₂(x_mid))
      sandwich_norm:  x_mid = x + N₁'(Attn(N₁(x))),   x_out = x_mid + N₂'(MLP(N₂(x_mid)))
      parallel_residual:  x_out = x + Attn(N₁(x)) + MLP(N₂(x))     (no x_mid)
    post-norm block:  x_mid = N₁(x + Attn(x)),        x_out = N₂(x_mid + MLP(x_mid))
    logits = cap(N_f(x_L) W_U + b_U)       (N_f only for pre-norm; W_U = W_Eᵀ when tied;
                                           cap(z) = c·tanh(z/c) for final_softcap c, else z)
    loss   = mean over t with target_t ≠ −1 of −log softmax(logits_t)[target_t]

Beyond the equations: dropout (train mode only) on x₀, the attention pattern and each
residual branch output; named activations with zero-cost hooks (see ``glassgpt.model.hooks``);
GPT-2 initialisation; an optional KV cache (``forward(tokens, cache=...)``, see
``glassgpt.sample.cache``): the tokens continue the cached ones, their positions start at
the cache's length (or at per-row positions in a left-padded batch), and the logits equal
those of recomputing the whole sequence.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glassgpt.errors import ConfigError, GlassError
from glassgpt.kernels import id_out_of_range
from glassgpt.model.attention import ATTN_IMPLS, Attention
from glassgpt.model.cache import KVCacheProtocol, LayerKV
from glassgpt.model.config import GPTConfig
from glassgpt.model.hooks import HookFn, HookPoint, Hooks, attach, hook_names
from glassgpt.model.layers import (
    MLP,
    Embed,
    LearnedPE,
    Norm,
    Rotary,
    SinusoidalPE,
    Unembed,
    init_normal_,
    norm_init,
    residual_std,
    softcap,
)


class TokenError(GlassError, ValueError):
    """Tokens (or targets) the model cannot take: wrong type or shape, too long, out of range."""


class Block(nn.Module):
    """One residual block: attention then MLP, each wrapped by a norm (pre or post; with
    ``sandwich_norm`` also N' after each sublayer); the subclasses hold the equations. An
    attention-only block has MLP ≡ 0 and N₂ = id. ``kind``: ``full`` or ``sliding`` attention."""

    def __init__(self, config: GPTConfig, hooks: Hooks, layer: int) -> None:
        super().__init__()
        p = f"blocks.{layer}."
        self.kind = config.layer_kinds[layer]
        self.ln1 = Norm(config, hooks, p + "ln1")
        self.attn = Attention(config, hooks, p + "attn", sliding=self.kind == "sliding")
        self.ln2: Norm | nn.Identity = nn.Identity()
        self.mlp: MLP | None = None
        if not config.attn_only:
            self.ln2, self.mlp = Norm(config, hooks, p + "ln2"), MLP(config, hooks, p + "mlp")
        self.ln1_post: Norm | None = None
        self.ln2_post: Norm | None = None
        if config.sandwich_norm:
            self.ln1_post = Norm(config, hooks, p + "ln1_post")
            if not config.attn_only:
                self.ln2_post = Norm(config, hooks, p + "ln2_post")
        self.dropout = config.dropout
        point = lambda site: HookPoint(hooks, p + site)  # noqa: E731
        self.hook_resid_pre, self.hook_attn_out = point("resid_pre"), point("attn_out")
        self.hook_resid_mid, self.hook_mlp_out = point("resid_mid"), point("mlp_out")
        self.hook_resid_post = point("resid_post")

    def attn_out(self, u: Tensor, rope: tuple[Tensor, Tensor] | None, kv: LayerKV | None) -> Tensor:
        """Attn(u) [B, T, d_model] (N₁'(Attn(u)) with sandwich norms), hooked, then dropped
        out (train mode)."""
        out = self.attn(u, rope, kv=kv)
        if self.ln1_post is not None:
            out = self.ln1_post(out)
        return self._drop(self.hook_attn_out(out))

    def mlp_out(self, u: Tensor) -> Tensor:
        """MLP(u) [B, T, d_model] (N₂'(MLP(u)) with sandwich norms), hooked, then dropped out
        (train mode); 0 without an MLP."""
        mlp = self.mlp  # (a submodule: each read is a Module.__getattr__ call)
        if mlp is None:
            return torch.zeros_like(u)
        out = mlp(u)
        if self.ln2_post is not None:
            out = self.ln2_post(out)
        return self._drop(self.hook_mlp_out(out))

    def _drop(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.dropout, training=True) if self.dropout and self.training else x


class PreNormBlock(Block):
    """resid_mid = resid_pre + Attn(N₁(resid_pre)),  resid_post = resid_mid + MLP(N₂(resid_mid))."""

    def forward(
        self, resid_pre: Tensor, rope: tuple[Tensor, Tensor] | None = None,
        kv: LayerKV | None = None,
    ) -> Tensor:  # fmt: skip
        resid_pre = self.hook_resid_pre(resid_pre)  # [B, T, d_model]
        resid_mid = self.hook_resid_mid(resid_pre + self.attn_out(self.ln1(resid_pre), rope, kv))
        resid_post = resid_mid + self.mlp_out(self.ln2(resid_mid))
        return self.hook_resid_post(resid_post)


class ParallelBlock(Block):
    """resid_post = resid_pre + Attn(N₁(resid_pre)) + MLP(N₂(resid_pre)) (GPT-NeoX; no resid_mid)."""

    def forward(
        self, resid_pre: Tensor, rope: tuple[Tensor, Tensor] | None = None,
        kv: LayerKV | None = None,
    ) -> Tensor:  # fmt: skip
        resid_pre = self.hook_resid_pre(resid_pre)  # [B, T, d_model]
        attn = self.attn_out(self.ln1(resid_pre), rope, kv)
        resid_post = resid_pre + attn + self.mlp_out(self.ln2(resid_pre))
        return self.hook_resid_post(resid_post)


class PostNormBlock(Block):
    """resid_mid = N₁(resid_pre + Attn(resid_pre)),  resid_post = N₂(resid_mid + MLP(resid_mid))."""

    def forward(
        self, resid_pre: Tensor, rope: tuple[Tensor, Tensor] | None = None,
        kv: LayerKV | None = None,
    ) -> Tensor:  # fmt: skip
        resid_pre = self.hook_resid_pre(resid_pre)  # [B, T, d_model]
        resid_mid = self.hook_resid_mid(self.ln1(resid_pre + self.attn_out(resid_pre, rope, kv)))
        resid_post = self.ln2(resid_mid + self.mlp_out(resid_mid))
        return self.hook_resid_post(resid_post)


class GPT(nn.Module):
    """The decoder-only GPT: ``GPT(config)(tokens [B, T]) → logits [B, T, n_vocab]``.

    >>> torch.manual_seed(0) and None
    >>> model = GPT(GPTConfig(n_vocab=11, n_ctx=8, d_model=8, n_layers=1, n_heads=2))
    >>> tokens = torch.tensor([[1, 2, 3]])
    >>> model(tokens).shape
    torch.Size([1, 3, 11])
    >>> logits, loss = model(tokens, targets=torch.tensor([[2, 3, -1]]))
    >>> bool(loss > 0)
    True
    >>> seen = {}
    >>> with model.hooks({"blocks.0.attn.pattern": lambda t, name: seen.setdefault(name, t)}):
    ...     _ = model(tokens)
    >>> seen["blocks.0.attn.pattern"].shape
    torch.Size([1, 2, 3, 3])
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise ConfigError("config", f"expected a GPTConfig, got {type(config).__name__}")
        self.config = config
        self._hook_fns: Hooks = {}
        self._hook_names = frozenset(hook_names(config))
        hooks = self._hook_fns
        self.embed = Embed(config)  # W_E [n_vocab, d_model]
        self.pos_embed: LearnedPE | SinusoidalPE | None = None
        self.rotary: Rotary | None = None
        self.rotary_local: Rotary | None = None  # the sliding layers' own (rope_local_base)
        if config.positional == "learned":
            self.pos_embed = LearnedPE(config)  # W_P [n_ctx, d_model]
        elif config.positional == "sinusoidal":
            self.pos_embed = SinusoidalPE(config)
        elif config.positional == "rope":
            self.rotary = Rotary(config)
            if config.rope_local_base is not None and "sliding" in config.layer_kinds:
                self.rotary_local = Rotary(config, local=True)
        block: type[Block] = PreNormBlock if config.norm_placement == "pre" else PostNormBlock
        if config.parallel_residual:
            block = ParallelBlock
        self.blocks = nn.ModuleList(block(config, hooks, layer) for layer in range(config.n_layers))
        self.ln_final = Norm(config, hooks, "ln_final") if config.final_norm else None
        self.hook_embed, self.hook_pos_embed = (
            HookPoint(hooks, "embed"),
            HookPoint(hooks, "pos_embed"),
        )
        self.hook_final = HookPoint(hooks, "ln_final.out")
        self.unembed = Unembed(config)  # W_U [d_model, n_vocab] unless tied, b_U
        if not self.embed.W_E.is_meta:  # a meta model's weights are assigned, never drawn
            self.reset_parameters()

    # -- parameters -----------------------------------------------------------------------
    def reset_parameters(self) -> None:
        """GPT-2 init: matrices N(0, init_std²), W_O and W_out N(0, (init_std/√(2L))²),
        biases 0, norm weights 1. W_Q, W_K and W_V are drawn one after the other, each as
        its own [n_heads, d_model, d_head] matrix (a seed gives the weights it always gave)."""
        std, std_resid = self.config.init_std, residual_std(self.config)
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "W_QKV":
                attn = self.get_submodule(name.rsplit(".", 1)[0])
                for m in ("Q", "K", "V"):
                    W = attn.qkv_weight(m)  # a view of W_QKV
                    drawn = torch.empty(W.shape, dtype=W.dtype, device=W.device)
                    init_normal_(drawn, std)
                    with torch.no_grad():
                        W.copy_(drawn)
            elif leaf.startswith("W_"):
                init_normal_(p, std_resid if leaf in ("W_O", "W_out") else std)
            else:
                with torch.no_grad():
                    p.fill_(norm_init(self.config) if leaf == "w" else 0.0)

    @property
    def W_U(self) -> Tensor:
        """The unembedding [d_model, n_vocab] (a view of W_Eᵀ when tied)."""
        return self.embed.W_E.T if self.unembed.W_U is None else self.unembed.W_U

    @property
    def attn_impl(self) -> str:
        """``auto`` (fused kernel unless scores/pattern are hooked) or ``explicit``."""
        attentions = self._attentions()
        return attentions[0].impl if attentions else "auto"

    @attn_impl.setter
    def attn_impl(self, value: str) -> None:
        if value not in ATTN_IMPLS:
            raise ConfigError("attn_impl", f"must be one of {', '.join(ATTN_IMPLS)}; got {value!r}")
        for attn in self._attentions():
            attn.impl = value

    def _attentions(self) -> list[Attention]:
        return [cast(Block, block).attn for block in self.blocks]

    # -- hooks ----------------------------------------------------------------------------
    def hook_names(self) -> list[str]:
        """The names of every activation of this config, in the order they are computed."""
        return hook_names(self.config)

    @contextmanager
    def hooks(self, fns: Mapping[str, HookFn]) -> Iterator[GPT]:
        """Attach ``{name: fn(tensor, name) -> tensor | None}`` for the ``with`` block."""
        with attach(self._hook_fns, fns, self._hook_names):
            yield self

    # -- the function ---------------------------------------------------------------------
    def forward(
        self, tokens: Tensor, targets: Tensor | None = None, *,
        cache: KVCacheProtocol | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:  # fmt: skip
        """tokens [B, T] int → logits [B, T, n_vocab], or (logits, mean cross-entropy loss).

        ``cache`` (see ``glassgpt.model.cache``; ``glassgpt.sample.cache.KVCache``): the tokens
        continue the cached sequence; their keys and values are appended to it (logits
        [B, 1, n_vocab] for the last position only when ``cache.last_only``).
        """
        B, T = self._check_tokens(tokens, "tokens", low=0)
        offset = 0 if cache is None else cache.begin(B, T)  # first position, or per row [B, T]
        x = self.embed(tokens)  # [B, T, d_model] = X W_E
        if self.config.embed_scale != 1.0:
            x = x * self.config.embed_scale  # s · X W_E
        x = self.hook_embed(x)
        if self.pos_embed is not None:  # W_P[offset:offset+T] or PE[…], [T, d_model]
            pos = self.pos_embed(T, offset, dtype=x.dtype, device=x.device)
            if self.hook_pos_embed.active:  # its hook sees [B, T, d_model]; the sum broadcasts
                pos = self.hook_pos_embed(pos.expand(B, T, -1))
            x = x + pos
        if self.config.dropout and self.training:
            x = F.dropout(x, self.config.dropout, training=True)
        rope = local = None
        if self.rotary is not None:
            rope = local = self.rotary(T, offset, dtype=x.dtype, device=x.device)
        if self.rotary_local is not None:
            local = self.rotary_local(T, offset, dtype=x.dtype, device=x.device)
        layers = [None] * len(self.blocks) if cache is None else cache.layers
        for block, kv in zip(self.blocks, layers, strict=True):
            x = block(x, local if cast(Block, block).kind == "sliding" else rope, kv)
        if cache is not None:
            cache.end(T)
            if cache.last_only and T > 1:
                # [B, 1, d_model]: only the next token's logits are needed (contiguous: every
                # row then takes the final norm's one kernel, whatever B)
                x = x[:, -1:].contiguous()
        if self.ln_final is not None:
            x = self.hook_final(self.ln_final(x))
        logits = self.unembed(x, self.embed.W_E)  # [B, T, n_vocab]
        logits = softcap(logits, self.config.final_softcap)  # c·tanh(logits/c)
        if targets is None:
            return logits
        return logits, self._loss(logits, tokens, targets)

    def _loss(self, logits: Tensor, tokens: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy over positions whose target is not −1, in at least float32."""
        if not isinstance(targets, Tensor) or targets.shape != tokens.shape:
            raise TokenError(
                f"targets must be a tensor of the tokens' shape {tuple(tokens.shape)}, "
                f"got {getattr(targets, 'shape', type(targets).__name__)}"
            )
        self._check_tokens(targets, "targets", low=-1)
        flat = logits.flatten(0, 1)  # [B·T, n_vocab]
        if flat.dtype in (torch.float16, torch.bfloat16):
            flat = flat.float()
        return F.cross_entropy(flat, targets.flatten(), ignore_index=-1)

    def _check_tokens(self, tokens: Tensor, what: str, low: int) -> tuple[int, int]:
        """Raise TokenError unless ``tokens`` is an integer [B, T] tensor with ids in range."""
        if not isinstance(tokens, Tensor):
            raise TokenError(f"{what} must be a torch.Tensor, got {type(tokens).__name__}")
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise TokenError(f"{what} must be integer ids, got dtype {tokens.dtype}")
        if tokens.ndim != 2 or tokens.shape[1] == 0:
            raise TokenError(
                f"{what} must have shape [batch, seq] with seq ≥ 1, got {tuple(tokens.shape)}"
            )
        B, T = tokens.shape
        if self.config.n_ctx < T:
            raise TokenError(f"{what}: sequence length {T} exceeds n_ctx={self.config.n_ctx}")
        n_vocab = self.config.n_vocab
        bad = id_out_of_range(tokens, low, n_vocab, what)  # on a GPU: a device-side assertion
        if bad is not None:
            raise TokenError(
                f"{what}: id {bad} is out of range [{low}, {n_vocab}) for n_vocab={n_vocab}"
            )
        return B, T
