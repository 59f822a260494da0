"""Probes of a model's circuits: head scores, logit-lens losses and attention entropies.

On random sequences of n tokens repeated once (t₀ … t_{n−1} t₀ … t_{n−1}), with A a head's
pattern [T_q, T_k] averaged over the batch:

    previous token   mean_{1 ≤ i < 2n}  A[i, i − 1]        (attends to the token before)
    duplicate token  mean_{n ≤ i < 2n}  A[i, i − n]        (to the earlier copy of itself)
    induction        mean_{n ≤ i < 2n}  A[i, i − n + 1]    (to the token after its earlier copy)

On text (x, y) with x_l the residual stream after block l and A the patterns of its heads:

    lens loss     L_l = mean_i −log softmax(N_f(x_l) W_U + b_U)[i, y_i]   (the logit lens)
    entropy       H_l = mean_{b, h, i} −Σ_j A[b, h, i, j] log A[b, h, i, j]   (nats)

These are the pure pieces that both the trainer (scores at every evaluation, without importing
``glassgpt.inspect``, which sits above it) and :mod:`glassgpt.inspect.heads` use; they live in
``model`` because they read nothing but the model's own activations (:mod:`.hooks`) and do no
I/O. :func:`probe` computes all of them in two forward passes and returns flat, named floats:
``previous_token/L0H1``, ``induction/L1H3``, ``lens_loss/L0``, ``attn_entropy/L1``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from glassgpt.errors import GlassError
from glassgpt.model.gpt import GPT

SCORES = ("previous_token", "duplicate_token", "induction")


def repeated_random_tokens(
    n_vocab: int, seq_len: int, batch: int = 8, *, seed: int = 0, low: int = 0
) -> Tensor:
    """[batch, 2 · seq_len] random ids in [low, n_vocab), each row's first half repeated.

    The first half's tokens are distinct whenever seq_len ≤ n_vocab − low (a random
    permutation), so the earlier copy of each token is unique.

    >>> t = repeated_random_tokens(50, 4, batch=2, seed=1)
    >>> t.shape, bool((t[:, :4] == t[:, 4:]).all())
    (torch.Size([2, 8]), True)
    """
    span = n_vocab - low
    if seq_len < 2 or batch < 1 or span < 2:
        raise GlassError(
            f"repeated sequences need seq_len ≥ 2, batch ≥ 1 and ≥ 2 ids; got seq_len={seq_len}, "
            f"batch={batch}, ids {low}..{n_vocab - 1}"
        )
    gen = torch.Generator().manual_seed(seed)
    if seq_len <= span:
        half = torch.stack([torch.randperm(span, generator=gen)[:seq_len] for _ in range(batch)])
    else:
        half = torch.randint(0, span, (batch, seq_len), generator=gen)
    half = half + low
    return torch.cat([half, half], dim=1)


def pattern_scores(pattern: Tensor, seq_len: int) -> dict[str, Tensor]:
    """The three scores from patterns [..., T, T] of repeated sequences (T = 2 · seq_len) → [...].

    >>> A = torch.diag(torch.ones(5), -1); A[0, 0] = 1  # each query: the token before
    >>> {k: float(v) for k, v in pattern_scores(A, 3).items()}
    {'previous_token': 1.0, 'duplicate_token': 0.0, 'induction': 0.0}
    """
    T = pattern.shape[-1]
    if 2 * seq_len != T:
        raise GlassError(f"patterns of length {T} are not a sequence of {seq_len} repeated")
    prev = pattern.diagonal(offset=-1, dim1=-2, dim2=-1)  # [..., T − 1]
    dup = pattern.diagonal(offset=-seq_len, dim1=-2, dim2=-1)  # [..., seq_len]
    ind = pattern.diagonal(offset=1 - seq_len, dim1=-2, dim2=-1)[..., 1:]  # query i ≥ seq_len
    return {
        "previous_token": prev.mean(-1),
        "duplicate_token": dup.mean(-1),
        "induction": ind.mean(-1),
    }


def attention_entropy(pattern: Tensor) -> Tensor:
    """−Σ_j A[..., i, j] log A[..., i, j] (nats, 0 · log 0 = 0): patterns [..., T, T] → [..., T].

    >>> A = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    >>> [round(float(h), 4) for h in attention_entropy(A)]
    [0.0, 0.6931]
    """
    return (pattern * -pattern.clamp_min(torch.finfo(pattern.dtype).tiny).log()).sum(-1)


def capture(model: GPT, tokens: Tensor, names: list[str]) -> dict[str, Tensor]:
    """The named activations of one forward pass of ``tokens`` [B, T] (no gradient)."""
    store: dict[str, Tensor] = {}

    def record(t: Tensor, name: str) -> None:
        store[name] = t.detach()

    with torch.no_grad(), model.hooks(dict.fromkeys(names, record)):
        model(tokens)
    return store


def mean_patterns(model: GPT, tokens: Tensor) -> Tensor:
    """Every head's pattern averaged over the batch: [n_layers, n_heads, T, T] (bfloat16 and
    float16 patterns averaged in float32)."""
    L = model.config.n_layers
    names = [f"blocks.{layer}.attn.pattern" for layer in range(L)]
    acts = capture(model, tokens, names)
    patterns = torch.stack([acts[n] for n in names])  # [L, B, H, T, T]
    return patterns.to(torch.promote_types(patterns.dtype, torch.float32)).mean(1)


def probe(model: GPT, repeated: Tensor, x: Tensor, y: Tensor) -> dict[str, float]:
    """Head scores on ``repeated`` [B, 2n] and lens losses and entropies on text ``x``, ``y``
    [B, T] (targets −1 are ignored), as flat named floats (see the module docstring).

    >>> from glassgpt.model import GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=20, n_ctx=8, d_model=8, n_layers=2, n_heads=2))
    >>> x = torch.randint(0, 20, (2, 8)); out = probe(model, repeated_random_tokens(20, 4), x, x)
    >>> sorted(k for k in out if k.endswith("L1")), len(out)
    (['attn_entropy/L1', 'lens_loss/L1'], 16)
    """
    was_training = model.training
    model.eval()
    try:
        n = repeated.shape[1] // 2
        scores = pattern_scores(mean_patterns(model, repeated), n)  # each [L, H]
        L = model.config.n_layers
        sites = ("resid_post", "attn.pattern")
        names = [f"blocks.{layer}.{site}" for layer in range(L) for site in sites]
        acts = capture(model, x, names)
        out: dict[str, float] = {}
        for name in SCORES:
            for (layer, head), value in _indexed(scores[name]):
                out[f"{name}/L{layer}H{head}"] = value
        with torch.no_grad():
            for layer in range(L):
                resid = acts[f"blocks.{layer}.resid_post"]  # [B, T, d_model]
                if model.ln_final is not None:
                    resid = model.ln_final(resid)
                logits = model.unembed(resid, model.embed.W_E).float()  # [B, T, n_vocab]
                loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1)
                out[f"lens_loss/L{layer}"] = float(loss)
            for layer in range(L):
                pattern = acts[f"blocks.{layer}.attn.pattern"].float()  # [B, H, T, T]
                out[f"attn_entropy/L{layer}"] = float(attention_entropy(pattern).mean())
    finally:
        model.train(was_training)
    return out


def _indexed(scores: Tensor) -> list[tuple[tuple[int, int], float]]:
    """[L, H] → [((layer, head), value), …] in layer-major order."""
    H = scores.shape[1]
    return [(divmod(i, H), float(v)) for i, v in enumerate(scores.flatten().tolist())]
