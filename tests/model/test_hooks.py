"""Hooks: every named activation is reachable, reading never changes logits, replacing does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from glassgpt.errors import ConfigError
from glassgpt.model import reference

from .helpers import numpy_weights, random_model, random_tokens, tiny_config

VARIANTS = [
    {},
    {"positional": "rope", "norm": "rmsnorm", "mlp": "swiglu", "tie_embeddings": False},
    {"positional": "sinusoidal", "norm_placement": "post", "bias": False},
]


def _cache(model, tokens, names=None):
    cache: dict[str, torch.Tensor] = {}

    def keep(t: torch.Tensor, name: str) -> torch.Tensor:
        cache[name] = t.detach().clone()
        return t

    with model.hooks({n: keep for n in (names or model.hook_names())}):
        logits = model(tokens)
    return logits, cache


@pytest.mark.parametrize("overrides", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_identity_hooks_leave_logits_bit_identical(overrides: dict, dtype: torch.dtype) -> None:
    cfg = tiny_config(**overrides)
    model = random_model(cfg, seed=1, dtype=dtype)
    tokens = random_tokens(cfg, batch=2, length=7)
    with torch.no_grad():
        plain = model(tokens)
        hooked, cache = _cache(model, tokens)
        with model.hooks(dict.fromkeys(model.hook_names(), lambda t, name: None)):
            keep_none = model(tokens)
        assert torch.equal(model(tokens), plain)  # hooks detached after the block
    assert torch.equal(hooked, plain) and torch.equal(keep_none, plain)
    assert set(cache) == set(model.hook_names())


def test_hook_shapes_and_values() -> None:
    cfg = tiny_config(d_head=3, mlp="geglu")
    B, T, H, dh = 2, 5, cfg.n_heads, 3
    model = random_model(cfg, seed=2)
    tokens = random_tokens(cfg, batch=B, length=T)
    with torch.no_grad():
        logits, c = _cache(model, tokens)
    D, m = cfg.d_model, cfg.d_mlp
    shapes = {
        "embed": (B, T, D),
        "pos_embed": (B, T, D),
        "blocks.0.ln1.scale": (B, T, 1),
        "blocks.0.attn.q": (B, T, H, dh),
        "blocks.0.attn.attn_scores": (B, H, T, T),
        "blocks.0.attn.pattern": (B, H, T, T),
        "blocks.0.attn.z": (B, T, H, dh),
        "blocks.0.attn.result": (B, T, H, D),
        "blocks.0.mlp.pre": (B, T, m),
        "blocks.0.mlp.pre_gate": (B, T, m),
        "blocks.0.mlp.post": (B, T, m),
        "blocks.1.resid_post": (B, T, D),
        "ln_final.scale": (B, T, 1),
    }
    for name, shape in shapes.items():
        assert tuple(c[name].shape) == shape, name
    # The activations satisfy the equations they are named after.
    x = c["blocks.0.resid_pre"]
    torch.testing.assert_close(x, c["embed"] + c["pos_embed"])
    var = x.var(-1, unbiased=False, keepdim=True)
    torch.testing.assert_close(c["blocks.0.ln1.scale"], 1 / torch.sqrt(var + cfg.norm_eps))
    scores = c["blocks.0.attn.attn_scores"]
    assert torch.isinf(scores[..., 0, 1:]).all() and torch.isfinite(scores[..., 1, :2]).all()
    pattern = c["blocks.0.attn.pattern"]
    torch.testing.assert_close(pattern, torch.softmax(scores, -1))
    torch.testing.assert_close(pattern.sum(-1), torch.ones(B, H, T, dtype=pattern.dtype))
    z = torch.einsum("bhqk,bkhd->bqhd", pattern, c["blocks.0.attn.v"])
    torch.testing.assert_close(c["blocks.0.attn.z"], z)
    attn = c["blocks.0.attn.result"].sum(2) + model.blocks[0].attn.b_O
    torch.testing.assert_close(c["blocks.0.attn_out"], attn)
    torch.testing.assert_close(c["blocks.0.resid_mid"], x + attn)
    torch.testing.assert_close(
        c["blocks.0.mlp.post"],
        torch.nn.functional.gelu(c["blocks.0.mlp.pre_gate"]) * c["blocks.0.mlp.pre"],
    )
    torch.testing.assert_close(logits, c["ln_final.out"] @ model.W_U + model.unembed.b_U)


@pytest.mark.parametrize(
    "name",
    [
        "blocks.0.attn.pattern",
        "blocks.0.attn.attn_scores",
        "blocks.1.ln1.scale",
        "blocks.0.attn.result",
        "blocks.1.attn.q",
        "blocks.0.mlp.post",
        "ln_final.scale",
        "pos_embed",
    ],
)
def test_replacing_hook_changes_logits(name: str) -> None:
    cfg = tiny_config()
    model = random_model(cfg, seed=3)
    tokens = random_tokens(cfg, batch=1, length=6)
    with torch.no_grad():
        plain = model(tokens)
        with model.hooks(
            {name: lambda t, n: t * 0.5 if n != "blocks.0.attn.pattern" else _uniform(t)}
        ):
            changed = model(tokens)
    assert not torch.allclose(plain, changed)


def _uniform(pattern: torch.Tensor) -> torch.Tensor:
    """The causal uniform pattern: position i attends equally to 0..i."""
    T = pattern.shape[-1]
    mask = torch.ones(T, T, dtype=pattern.dtype).tril()
    return (mask / mask.sum(-1, keepdim=True)).expand_as(pattern)


def test_replaced_pattern_flows_downstream_exactly() -> None:
    """With blocks.0's pattern replaced, z is exactly pattern' v, checked against NumPy."""
    cfg = tiny_config(n_layers=1)
    model = random_model(cfg, seed=4)
    tokens = random_tokens(cfg, batch=1, length=5)
    with torch.no_grad(), model.hooks({"blocks.0.attn.pattern": lambda t, n: _uniform(t)}):
        logits, c = _cache(model, tokens, ["blocks.0.attn.v", "blocks.0.attn.z"])
    expected = torch.einsum(
        "bhqk,bkhd->bqhd",
        _uniform(torch.zeros(1, 2, 5, 5, dtype=torch.float64)),
        c["blocks.0.attn.v"],
    )
    torch.testing.assert_close(c["blocks.0.attn.z"], expected, rtol=0, atol=1e-12)
    # Zeroing the MLP output of a one-layer model leaves embed → attention → unembed.
    w = numpy_weights(model)
    with torch.no_grad(), model.hooks({"blocks.0.mlp_out": lambda t, n: torch.zeros_like(t)}):
        no_mlp = model(tokens)[0].numpy()
    x = reference.one_hot(tokens[0].numpy(), cfg.n_vocab) @ w["embed.W_E"] + w["pos_embed.W_P"][:5]
    x = x + reference.attention(cfg, w, "blocks.0.attn", reference.norm(cfg, w, "blocks.0.ln1", x))
    x = reference.norm(cfg, w, "ln_final", x)
    np.testing.assert_allclose(no_mlp, x @ w["embed.W_E"].T + w["unembed.b_U"], atol=1e-9, rtol=0)
    assert logits.shape == (1, 5, cfg.n_vocab)


def test_hook_names_depend_on_config() -> None:
    rope = random_model(tiny_config(positional="rope", norm_placement="post"))
    names = rope.hook_names()
    assert "pos_embed" not in names and "ln_final.out" not in names
    assert len(names) == len(set(names))
    learned = random_model(tiny_config(mlp="swiglu")).hook_names()
    assert {"pos_embed", "ln_final.scale", "blocks.1.mlp.pre_gate"} <= set(learned)


def test_unknown_or_bad_hooks_raise() -> None:
    model = random_model(tiny_config(positional="rope"))
    with (
        pytest.raises(ConfigError, match="'pos_embed'"),
        model.hooks({"pos_embed": lambda t, n: t}),
    ):
        pass
    with (
        pytest.raises(ConfigError, match=r"blocks\.9\.attn\.q"),
        model.hooks({"blocks.9.attn.q": lambda t, n: t}),
    ):
        pass
    with pytest.raises(ConfigError, match="not callable"), model.hooks({"embed": 3}):  # type: ignore[dict-item]
        pass
    with model.hooks({"embed": lambda t, n: t}):
        with (
            pytest.raises(ConfigError, match="already hooked"),
            model.hooks({"embed": lambda t, n: t}),
        ):
            pass
        assert "embed" in model._hook_fns
    assert not model._hook_fns


def test_hooks_are_detached_after_an_exception() -> None:
    model = random_model(tiny_config())
    with pytest.raises(RuntimeError), model.hooks({"embed": lambda t, n: t}):
        raise RuntimeError("boom")
    assert not model._hook_fns


def test_hooks_see_gradients() -> None:
    """A hook can keep the activation in the graph and read its gradient."""
    cfg = tiny_config()
    model = random_model(cfg)
    tokens = random_tokens(cfg, batch=1, length=4)
    kept = {}

    def keep(t: torch.Tensor, name: str) -> None:
        t.retain_grad()
        kept[name] = t

    with model.hooks({"blocks.1.resid_mid": keep}):
        model(tokens).sum().backward()
    assert kept["blocks.1.resid_mid"].grad is not None
    assert kept["blocks.1.resid_mid"].grad.abs().sum() > 0


@pytest.mark.parametrize("overrides", VARIANTS)
def test_hook_names_are_listed_in_the_order_they_run(overrides: dict) -> None:
    model = random_model(tiny_config(**overrides))
    fired: list[str] = []
    with (
        torch.no_grad(),
        model.hooks(dict.fromkeys(model.hook_names(), lambda t, n: fired.append(n))),
    ):
        model(random_tokens(model.config, batch=1, length=3))
    assert fired == model.hook_names()
