"""Behaviour of GPT: causality, gradients, the two attention paths, training, init, errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from glassgpt.errors import ConfigError, GlassError
from glassgpt.model import GPT, GPTConfig, TokenError

from .helpers import random_model, random_tokens, tiny_config


@given(
    positional=st.sampled_from(["learned", "sinusoidal", "rope", "none"]),
    placement=st.sampled_from(["pre", "post"]),
    t=st.integers(0, 7),
    seed=st.integers(0, 2**16),
)
def test_causality(positional: str, placement: str, t: int, seed: int) -> None:
    """Changing tokens after position t leaves the logits at positions ≤ t unchanged."""
    cfg = tiny_config(positional=positional, norm_placement=placement)
    model = random_model(cfg, seed=seed % 7)
    tokens = random_tokens(cfg, batch=2, length=cfg.n_ctx, seed=seed)
    changed = tokens.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 1 + seed % 5) % cfg.n_vocab
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])
    if t + 1 < cfg.n_ctx:
        assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"positional": "rope", "norm": "rmsnorm", "mlp": "swiglu", "tie_embeddings": False},
        {"norm_placement": "post", "mlp": "gelu", "bias": False, "positional": "sinusoidal"},
        {"mlp": "gated", "mlp_gate": "tanh", "mlp_value": "sigmoid", "attn_impl": "explicit"},
    ],
)
def test_gradcheck(overrides: dict) -> None:
    overrides = dict(overrides)
    attn_impl = overrides.pop("attn_impl", "auto")
    cfg = tiny_config(n_vocab=7, d_model=4, n_heads=2, d_mlp=6, n_layers=1, **overrides)
    model = random_model(cfg, seed=1)
    model.attn_impl = attn_impl
    tokens = random_tokens(cfg, batch=1, length=4)
    targets = random_tokens(cfg, batch=1, length=4, seed=2)
    names = [n for n, _ in model.named_parameters()]
    params = [p.detach().clone().requires_grad_(True) for p in model.parameters()]

    def loss_of(*ps: torch.Tensor) -> torch.Tensor:
        out = torch.func.functional_call(model, dict(zip(names, ps)), (tokens, targets))
        return out[1]

    assert torch.autograd.gradcheck(loss_of, params, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_fused_attention_equals_explicit(positional: str) -> None:
    cfg = tiny_config(positional=positional)
    model = random_model(cfg, seed=4)
    tokens = random_tokens(cfg, batch=3, length=7)
    targets = random_tokens(cfg, batch=3, length=7, seed=8)
    logits_fast, loss_fast = model(tokens, targets)
    loss_fast.backward()
    grads_fast = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.attn_impl = "explicit"
    logits_slow, loss_slow = model(tokens, targets)
    loss_slow.backward()
    torch.testing.assert_close(logits_fast, logits_slow, rtol=0, atol=1e-12)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads_fast[n], rtol=0, atol=1e-10)
    # And in float32, to float32 rounding.
    model32 = random_model(cfg, seed=4, dtype=torch.float32)
    with torch.no_grad():
        fast = model32(tokens)
        model32.attn_impl = "explicit"
        torch.testing.assert_close(model32(tokens), fast, rtol=0, atol=1e-5)


def test_attn_impl_rejects_unknown_values() -> None:
    model = GPT(tiny_config())
    with pytest.raises(ConfigError, match="attn_impl"):
        model.attn_impl = "flash"


def test_overfit_one_batch() -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=16, n_ctx=16, d_model=32, n_layers=2, n_heads=4)
    model = GPT(cfg)
    tokens = torch.randint(0, 16, (4, 16))
    targets = torch.roll(tokens, -1, dims=1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    initial = None
    for _ in range(300):
        _, loss = model(tokens, targets)
        initial = loss.item() if initial is None else initial
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert abs(initial - math.log(16)) < 0.2  # GPT-2 init starts near uniform
    assert loss.item() < 0.05


def test_init_statistics() -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=500, n_ctx=64, d_model=64, n_layers=8, n_heads=4, bias=True)
    model = GPT(cfg)
    sd = model.state_dict()
    resid = cfg.init_std / math.sqrt(2 * cfg.n_layers)
    for name, t in sd.items():
        if name.endswith(("W_O", "W_out")):
            assert abs(t.std().item() / resid - 1) < 0.05, name
        elif name.rsplit(".", 1)[-1].startswith("W_"):
            assert abs(t.std().item() / cfg.init_std - 1) < 0.05, name
        elif name.endswith(".w"):
            assert torch.equal(t, torch.ones_like(t)), name
        else:
            assert torch.equal(t, torch.zeros_like(t)), name
        if t.numel() > 1000:
            assert abs(t.mean().item()) < 0.1 * t.std().item(), name


def test_state_dict_keys_and_shapes() -> None:
    cfg = tiny_config(tie_embeddings=False, mlp="swiglu", d_head=3)
    sd = GPT(cfg).state_dict()
    H, D, dh, m = cfg.n_heads, cfg.d_model, 3, cfg.d_mlp
    expected = {
        "embed.W_E": (cfg.n_vocab, D),
        "pos_embed.W_P": (cfg.n_ctx, D),
        "blocks.1.ln1.w": (D,),
        "blocks.1.ln1.b": (D,),
        "blocks.1.attn.W_Q": (H, D, dh),
        "blocks.1.attn.b_K": (H, dh),
        "blocks.1.attn.W_O": (H, dh, D),
        "blocks.1.attn.b_O": (D,),
        "blocks.1.mlp.W_in": (D, m),
        "blocks.1.mlp.W_gate": (D, m),
        "blocks.1.mlp.b_gate": (m,),
        "blocks.1.mlp.W_out": (m, D),
        "ln_final.w": (D,),
        "unembed.W_U": (D, cfg.n_vocab),
        "unembed.b_U": (cfg.n_vocab,),
    }
    for key, shape in expected.items():
        assert tuple(sd[key].shape) == shape, key
    assert len(sd) == 2 + cfg.n_layers * 18 + 2 + 2  # 18 = ln1 2 + attn 8 + ln2 2 + mlp 6


@pytest.mark.parametrize(
    ("overrides", "absent"),
    [
        ({"positional": "sinusoidal"}, "pos_embed.W_P"),
        ({"positional": "rope"}, "pos_embed.W_P"),
        ({"norm": "rmsnorm"}, "blocks.0.ln1.b"),
        ({"norm_placement": "post"}, "ln_final.w"),
        ({"tie_embeddings": True}, "unembed.W_U"),
        ({"bias": False}, "blocks.0.attn.b_Q"),
        ({"bias": False}, "unembed.b_U"),
        ({"mlp": "gelu"}, "blocks.0.mlp.W_gate"),
    ],
)
def test_state_dict_has_no_key_for_absent_terms(overrides: dict, absent: str) -> None:
    sd = GPT(tiny_config(**overrides)).state_dict()
    assert absent not in sd
    assert all(k.rsplit(".", 1)[-1][:2] in ("W_", "b_") or k.endswith((".w", ".b")) for k in sd)


def test_moving_dtype_keeps_tables_exact() -> None:
    cfg = tiny_config(positional="sinusoidal")
    model = GPT(cfg).double()
    p = torch.arange(cfg.n_ctx, dtype=torch.float64)
    PE = model.pos_embed(cfg.n_ctx, dtype=torch.float64)
    torch.testing.assert_close(PE[:, 0], torch.sin(p), rtol=0, atol=1e-15)
    rope = GPT(tiny_config(positional="rope")).float().double()
    cos, _ = rope.rotary(cfg.n_ctx, dtype=torch.float64)
    torch.testing.assert_close(cos[:, 0], torch.cos(p), rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    ("tokens", "match"),
    [
        (torch.tensor([[1, 2, 13]]), "id 13 is out of range"),
        (torch.tensor([[1, -2]]), "id -2 is out of range"),
        (torch.zeros(1, 9, dtype=torch.long), "exceeds n_ctx=8"),
        (torch.zeros(3, dtype=torch.long), "shape"),
        (torch.zeros(1, 0, dtype=torch.long), "shape"),
        (torch.zeros(1, 3), "integer"),
        ([[1, 2]], "torch.Tensor"),
    ],
)
def test_bad_tokens_raise_glass_error(tokens: object, match: str) -> None:
    model = GPT(tiny_config())
    with pytest.raises(TokenError, match=match) as e:
        model(tokens)
    assert isinstance(e.value, GlassError) and isinstance(e.value, ValueError)


def test_bad_targets_raise_glass_error() -> None:
    model = GPT(tiny_config())
    tokens = torch.tensor([[1, 2, 3]])
    with pytest.raises(TokenError, match="targets: id 13"):
        model(tokens, torch.tensor([[1, 2, 13]]))
    with pytest.raises(TokenError, match="shape"):
        model(tokens, torch.tensor([[1, 2]]))


def test_dropout_only_in_train_mode() -> None:
    torch.manual_seed(0)
    model = GPT(tiny_config(dropout=0.5))
    tokens = random_tokens(model.config, batch=2, length=6)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(tokens), model(tokens))
    model.train()
    with torch.no_grad():
        assert not torch.allclose(model(tokens), model(tokens))


def test_logits_follow_every_weight_change() -> None:
    """No stale copy of a weight anywhere (W_Q, W_K, W_V are views of W_QKV): after an
    optimizer step, a state_dict load and an in-place change, in inference mode and after a
    dtype change, the logits equal those of a fresh model given the same weights."""
    cfg = tiny_config()
    model = random_model(cfg, seed=1)
    tokens = random_tokens(cfg, batch=2, length=5)

    def fresh() -> torch.Tensor:  # logits of a new model loaded with model's weights
        other = GPT(cfg).to(next(model.parameters()).dtype).eval()
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            return other(tokens)

    with torch.no_grad():
        before = model(tokens)
        assert torch.equal(model(tokens), before)
        assert torch.equal(fresh(), before)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _, loss = model(tokens, tokens)
    loss.backward()
    opt.step()
    with torch.no_grad():
        after_step = model(tokens)
    assert not torch.allclose(after_step, before)
    assert torch.equal(after_step, fresh())
    other = random_model(cfg, seed=2)
    model.load_state_dict(other.state_dict())
    with torch.no_grad():
        assert torch.equal(model(tokens), other(tokens))
        model.blocks[1].attn.b_V.mul_(2.0)
        assert torch.equal(model(tokens), fresh())
    with torch.inference_mode():
        inferred = model(tokens)
    assert torch.equal(inferred, fresh())
    model.float()
    with torch.no_grad():
        assert model(tokens).dtype == torch.float32
        assert torch.equal(model(tokens), fresh())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert model(tokens).dtype == torch.bfloat16
        assert torch.equal(model(tokens), fresh())


@pytest.mark.parametrize("mlp", ["gelu_tanh", "swiglu"])
def test_whole_model_pickles_and_copies(mlp: str) -> None:
    import copy
    import pickle

    model = random_model(tiny_config(mlp=mlp, positional="rope"))
    tokens = random_tokens(model.config, batch=1, length=5)
    with torch.no_grad():
        expected = model(tokens)
        for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
            assert torch.equal(clone(tokens), expected)
            seen: list[str] = []
            with clone.hooks({"embed": lambda t, n, seen=seen: seen.append(n)}):
                clone(tokens)
            assert seen == ["embed"] and not model._hook_fns  # hooks stay per model
