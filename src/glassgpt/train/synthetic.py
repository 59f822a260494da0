"""A model that has the induction circuit, in a few hundred steps: the study's toy run.

Each training sequence is random tokens, then a segment of 2 … n_ctx/2 distinct tokens twice;
the loss is taken only inside the second copy, where only induction predicts the next token
(the segment's length and place vary, so no fixed offset does):

    x = u₀ … u_{n_ctx−2m−1}  s₀ … s_{m−1}  s₀ … s_{m−1},   loss on targets s₁ … s_{m−1}

:func:`train_synthetic` trains a 2-layer, 2-head attention-only GPT on it with AdamW
(``glassgpt study induction --synthetic``; ``tests/inspect/test_induction.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from glassgpt.model import GPT, GPTConfig


def segment_batch(
    gen: torch.Generator, size: int, n_vocab: int, n_ctx: int
) -> tuple[Tensor, Tensor]:
    """(x, y), each [size, n_ctx]: random tokens, then a segment of 2 … n_ctx/2 distinct
    tokens twice; targets y are −1 (no loss) except inside the second copy, where only
    induction predicts the next token (the segment's length and place vary, so no offset
    does)."""
    xs, ys = [], []
    for _ in range(size):
        m = int(torch.randint(2, n_ctx // 2 + 1, (), generator=gen))
        seg = torch.randperm(n_vocab, generator=gen)[:m]
        x = torch.cat([torch.randint(0, n_vocab, (n_ctx - 2 * m,), generator=gen), seg, seg])
        y = torch.cat([x[1:], torch.tensor([-1])])
        y[: n_ctx - m] = -1
        xs.append(x)
        ys.append(y)
    return torch.stack(xs), torch.stack(ys)


def train_synthetic(
    steps: int = 300, *, seed: int = 0, n_vocab: int = 32, n_ctx: int = 16, d_model: int = 64
) -> GPT:
    """A 2-layer, 2-head attention-only GPT trained on :func:`segment_batch` (AdamW, 32
    sequences a step), returned in eval mode. Token and position embeddings start N(0, 1)
    and the unembedding is untied: from GPT-2's 0.02 the run sits on a plateau for thousands
    of steps."""
    cfg = GPTConfig(
        n_vocab=n_vocab,
        n_ctx=n_ctx,
        d_model=d_model,
        n_layers=2,
        n_heads=2,
        attn_only=True,
        tie_embeddings=False,
    )
    torch.manual_seed(seed)
    model = GPT(cfg)
    with torch.no_grad():
        model.embed.W_E.normal_(0.0, 1.0)
        model.pos_embed.W_P.normal_(0.0, 1.0)  # type: ignore[union-attr]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed + 1)
    model.train()
    for _ in range(steps):
        x, y = segment_batch(gen, 32, n_vocab, n_ctx)  # [32, n_ctx] each
        _, loss = model(x, targets=y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()
