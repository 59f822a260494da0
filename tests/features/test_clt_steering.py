"""Intervening on CLT features in the real forward pass (glassgpt.features.clt_steering):
an edit that changes nothing changes nothing, and an edit at the last layer is the direct
write of the difference through its decoder, by a plain hook."""

from __future__ import annotations

import pytest
import torch

from glassgpt.errors import GlassError
from glassgpt.features.clt import CLT, CLTConfig
from glassgpt.features.clt_steering import Edit, edit_hooks, intervene
from glassgpt.features.clt_train import read_layers
from glassgpt.model import GPT, GPTConfig


def setup() -> tuple[GPT, CLT, torch.Tensor]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=20, n_ctx=16, d_model=16, n_layers=3, n_heads=2)).eval()
    clt = CLT(CLTConfig(d_model=16, d_sae=12, n_layers=3, arch="jumprelu"), seed=1).eval()
    return model, clt, torch.randint(0, 20, (9,), generator=torch.Generator().manual_seed(2))


def test_an_edit_that_changes_nothing_changes_nothing() -> None:
    model, clt, tokens = setup()
    clean, edited = intervene(model, clt, tokens, [Edit(0, 3, pos=4, scale=1.0), Edit(1, 2, scale=1.0)])  # fmt: skip
    assert torch.equal(clean, edited)
    _, zeroed = intervene(model, clt, tokens, [Edit(0, f) for f in range(12)])
    assert not torch.allclose(clean[1:], zeroed[1:])  # zeroing layer 0's features moves them


def test_an_edit_at_the_last_layer_is_its_decoders_write() -> None:
    model, clt, tokens = setup()
    with torch.no_grad():
        u, _ = read_layers(model, tokens[None])
        a = clt.encode(u[0, :, 2], 2)  # [T, S] the last layer's features
        direction = clt.decoder(2, 2)[5]

        def add(t: torch.Tensor, _name: str) -> torch.Tensor:
            t = t.clone()
            t[0, 6] += (7.5 - a[6, 5]) * direction
            return t

        with model.hooks({"blocks.2.mlp_out": add}):
            want = model(tokens[None])[0]
    _, got = intervene(model, clt, tokens, [Edit(2, 5, pos=6, value=7.5)])
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
    assert not torch.allclose(got, model(tokens[None])[0].detach(), atol=1e-3)


def test_adding_to_a_feature_writes_its_decoders_into_every_later_mlp() -> None:
    """a' = a + α at every position: each MLP output t ≥ l gains α · W_dec[l → t], and the
    later layers' own features, read again, are left as they are."""
    model, clt, tokens = setup()
    alpha, l, i = -1.75, 1, 4
    push = {f"blocks.{t}.mlp_out": (lambda x, _n, t=t: x + alpha * clt.decoder(l, t)[i]) for t in (1, 2)}  # fmt: skip
    with torch.no_grad(), model.hooks(push):
        want = model(tokens[None])[0]
    clean, got = intervene(model, clt, tokens, [Edit(l, i, add=alpha)])
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
    assert not torch.allclose(got[0], clean[0], atol=1e-3)  # every position, the first included
    _, none = intervene(model, clt, tokens, [Edit(l, i, add=0.0)])
    assert torch.equal(none, clean)


def test_bad_edits_are_one_line() -> None:
    model, clt, tokens = setup()
    with pytest.raises(GlassError, match=r"feature 3/0: no such CLT feature \(3 layers × 12\)"):
        edit_hooks(model, clt, [Edit(3, 0)])
    with pytest.raises(GlassError, match="position 40: the prompt has 9 tokens"):
        intervene(model, clt, tokens, [Edit(0, 0, pos=40)])
