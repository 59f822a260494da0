"""Accounting against independent oracles: GPT's own state_dict, transformers' GPT-2 parameter
count, torch's FLOP counter, AdamW's real state, and the tensors autograd saves."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from glassgpt.errors import ConfigError
from glassgpt.kernels import saved  # what each kernel keeps: patched as on another machine
from glassgpt.model.accounting import (
    count_parameters,
    flops_per_token,
    parameter_shapes,
    parameter_table,
)
from glassgpt.model.config import MLPS, NORMS, PLACEMENTS, POSITIONALS, GPTConfig
from glassgpt.model.memory import activation_bytes, estimate_training_memory, itemsize, weight_bytes

transformers = pytest.importorskip("transformers")

TINY = {"n_vocab": 37, "n_ctx": 16, "d_model": 24, "n_layers": 2, "n_heads": 3}
VARIANTS = list(
    itertools.product(POSITIONALS, NORMS, PLACEMENTS, MLPS, (True, False), (True, False))
)


def _config(positional, norm, placement, mlp, tie, bias, **kw) -> GPTConfig:
    return GPTConfig(
        **{**TINY, **kw},
        positional=positional,
        norm=norm,
        norm_placement=placement,
        mlp=mlp,
        tie_embeddings=tie,
        bias=bias,
    )


def _hf(n_vocab=37, n_ctx=16, d_model=24, n_layers=2, n_heads=3, n_inner=None, attn="eager"):
    cfg = transformers.GPT2Config(
        vocab_size=n_vocab,
        n_positions=n_ctx,
        n_embd=d_model,
        n_layer=n_layers,
        n_head=n_heads,
        n_inner=n_inner,
        bos_token_id=None,
        eos_token_id=None,
    )
    cfg._attn_implementation = attn
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v)))
def test_parameter_shapes_are_the_state_dict_of_gpt(variant) -> None:
    from glassgpt.model import GPT

    config = _config(*variant)
    model = GPT(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert parameter_shapes(config) == expected
    assert count_parameters(config) == sum(p.numel() for p in model.parameters())
    assert sum(r.total for r in parameter_table(config)) == count_parameters(config)


@pytest.mark.parametrize(
    "shape",
    [dict(), dict(n_vocab=50, d_model=32, n_layers=3, n_heads=4, n_inner=40)],
    ids=["tiny", "n_inner"],
)
def test_parameter_count_matches_transformers_gpt2(shape) -> None:
    hf = _hf(**shape)
    n_inner = shape.pop("n_inner", None)
    config = GPTConfig(**{**TINY, **shape}, d_mlp=n_inner, unembed_bias=False)
    # GPT-2 has no unembedding bias; with one, b_U (n_vocab numbers) is the only difference.
    hf_count = sum(p.numel() for p in hf.parameters())
    assert count_parameters(config) == hf_count
    assert count_parameters(config.replace(unembed_bias=True)) - config.n_vocab == hf_count
    assert count_parameters(config.replace(bias=False)) < hf_count


@pytest.mark.parametrize(
    ("preset", "n_embd", "n_layer", "n_head"),
    [
        ("gpt2", 768, 12, 12),
        ("gpt2-medium", 1024, 24, 16),
        ("gpt2-large", 1280, 36, 20),
        ("gpt2-xl", 1600, 48, 25),
    ],
)
def test_gpt2_presets_have_transformers_parameter_count(preset, n_embd, n_layer, n_head) -> None:
    # Built on the meta device: shapes only, no memory (gpt2-xl has 1.5 billion parameters).
    hf_config = transformers.GPT2Config(n_embd=n_embd, n_layer=n_layer, n_head=n_head)
    with torch.device("meta"):
        hf = transformers.GPT2LMHeadModel(hf_config)
    hf_count = sum(p.numel() for p in hf.parameters())  # tied lm_head counted once
    config = GPTConfig.preset(preset)
    assert count_parameters(config) == hf_count
    with torch.device("meta"):
        from glassgpt.model import GPT

        ours = GPT(config)
    assert sum(p.numel() for p in ours.parameters()) == hf_count


def test_non_embedding_count_drops_exactly_the_embedding_matrices() -> None:
    c = GPTConfig(**TINY, tie_embeddings=False, unembed_bias=True)
    V, d, T = c.n_vocab, c.d_model, c.n_ctx
    assert (
        count_parameters(c) - count_parameters(c, non_embedding=True) == V * d + T * d + d * V + V
    )


@pytest.mark.parametrize("seq_len", [16, 7])
def test_forward_flops_match_torch_flop_counter(seq_len: int) -> None:
    # transformers' eager attention does q kᵀ and pattern·v as dense bmm, as our count assumes.
    hf = _hf(d_model=48, n_heads=4, n_inner=80)
    config = GPTConfig(**{**TINY, "d_model": 48, "n_heads": 4}, d_mlp=80)
    tokens = torch.randint(0, config.n_vocab, (2, seq_len))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        hf(tokens)
    assert counter.get_total_flops() == 2 * seq_len * flops_per_token(config, seq_len).forward


def test_training_flops_are_three_forwards_per_torch_flop_counter() -> None:
    hf = _hf().train()
    config = GPTConfig(**TINY)
    tokens = torch.randint(0, config.n_vocab, (2, config.n_ctx))
    with FlopCounterMode(display=False) as counter:
        hf(tokens, labels=tokens).loss.backward()
    assert counter.get_total_flops() == 2 * config.n_ctx * flops_per_token(config).training


def test_gated_mlp_costs_three_matrices() -> None:
    base = GPTConfig(**TINY)
    gated = base.replace(mlp="swiglu")
    assert flops_per_token(gated).mlp * 2 == flops_per_token(base).mlp * 3


def test_optimizer_estimate_is_adamw_state() -> None:
    hf = _hf()
    config = GPTConfig(**TINY, bias=False)  # hf has biases; compare with its own numel
    n = sum(p.numel() for p in hf.parameters())
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-3)
    tokens = torch.randint(0, 37, (1, 8))
    hf(tokens, labels=tokens).loss.backward()
    opt.step()
    state_bytes = sum(
        t.numel() * t.element_size()
        for s in opt.state.values()
        for t in s.values()
        if t.dim() > 0  # 'step' is a scalar counter
    )
    per_param = estimate_training_memory(config, 1, 8).optimizer / count_parameters(config)
    assert state_bytes == per_param * n


def test_memory_components_scale_as_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    c = GPTConfig(**TINY)
    n = count_parameters(c)
    m32 = estimate_training_memory(c, 4, 16, "float32")
    assert (m32.weights, m32.gradients, m32.optimizer) == (4 * n, 4 * n, 8 * n)
    m16 = estimate_training_memory(c, 4, 16, "bfloat16", param_dtype="bfloat16")
    assert (m16.weights, m16.optimizer) == (2 * n, 8 * n + 4 * n)  # moments + float32 master
    assert m32.total == sum(
        m32.as_dict()[k] for k in ("weights", "gradients", "optimizer", "activations")
    )
    # activations are affine in B and (for the SDPA path) in T; bf16 halves most of them
    a = activation_bytes
    assert a(c, 12, 16) - a(c, 8, 16) == a(c, 8, 16) - a(c, 4, 16) > 0
    wide = GPTConfig(**{**TINY, "d_model": 128, "n_heads": 2})  # d_head 64: the fused kernel
    assert a(wide, 4, 16) - a(wide, 4, 12) == a(wide, 4, 12) - a(wide, 4, 8) > 0
    e = lambda T: a(c, 4, T, attn_impl="explicit")  # noqa: E731  the pattern is T² per row
    assert e(16) - 2 * e(12) + e(8) > 0
    # d_head 8 under bf16 on a CPU with bf16 arithmetic: the explicit product (T² per row) up
    # to 128 keys, then the float32 fused kernel; float32 always the fused kernel
    monkeypatch.setattr(saved, "native_bf16", lambda: True)
    b = lambda T: a(c, 4, T, "bfloat16")  # noqa: E731
    assert b(16) - 2 * b(12) + b(8) > 0
    assert b(256) - 2 * b(200) + b(144) == 0
    assert a(c, 4, 16) - a(c, 4, 12) == a(c, 4, 12) - a(c, 4, 8)
    assert activation_bytes(wide, 64, 16, "bf16") < 0.75 * activation_bytes(wide, 64, 16)
    # without bf16 arithmetic every bf16 attention takes float32 copies: affine in T again
    monkeypatch.setattr(saved, "native_bf16", lambda: False)
    assert b(16) - 2 * b(12) + b(8) == 0
    # glassgpt's float32 causal kernel keeps P up to 4 d_head keys (as the explicit path keeps
    # the pattern, rows rounded up to 16 keys), the row log-sum-exps beyond
    monkeypatch.setattr(saved, "compiled_causal", lambda: True)
    assert activation_bytes(wide, 4, 16, attn_impl="explicit") == activation_bytes(wide, 4, 16)
    assert activation_bytes(wide, 4, 300, attn_impl="explicit") > activation_bytes(wide, 4, 300)
    p = lambda T: a(wide, 4, T)  # noqa: E731  T² per row up to 256 keys, then affine
    assert p(256) - 2 * p(192) + p(128) > 0 and p(400) - 2 * p(350) + p(300) == 0
    monkeypatch.setattr(saved, "compiled_causal", lambda: False)
    assert p(256) - 2 * p(192) + p(128) == 0
    assert weight_bytes(c, torch.bfloat16) == 2 * n


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: itemsize("int8"), "dtype"),
        (lambda: flops_per_token(GPTConfig(**TINY), 0), "seq_len"),
        (lambda: activation_bytes(GPTConfig(**TINY), 0, 4), "batch_size"),
        (lambda: activation_bytes(GPTConfig(**TINY), 1, 4, attn_impl="flash"), "attn_impl"),
    ],
)
def test_bad_arguments_name_the_field(call, field) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.field == field


def _saved_bytes(config: GPTConfig, batch: int, seq: int, autocast: bool, explicit: bool) -> int:
    """Bytes of the distinct storages autograd saves in GPT's forward + loss (and the logits)."""
    from glassgpt.model import GPT

    torch.manual_seed(0)
    model = GPT(config).train()
    if explicit:
        model.attn_impl = "explicit"
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    tokens = torch.randint(0, config.n_vocab, (batch, seq))
    targets = torch.randint(0, config.n_vocab, (batch, seq))
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
    ):
        logits, _ = model(tokens, targets=targets)
    seen[logits.untyped_storage().data_ptr()] = logits.untyped_storage().nbytes()
    return sum(seen.values())


MEMORY_CASES = [
    ("learned", "layernorm", "pre", "gelu_tanh", True, True, 0.0),
    ("rope", "rmsnorm", "pre", "swiglu", False, False, 0.0),
    ("sinusoidal", "layernorm", "post", "gated", True, True, 0.0),
    ("none", "layernorm", "post", "relu", False, True, 0.0),
    ("learned", "layernorm", "pre", "gelu", True, True, 0.1),
    ("rope", "rmsnorm", "pre", "geglu", True, False, 0.1),
]


@pytest.mark.parametrize("case", MEMORY_CASES, ids=lambda v: "-".join(map(str, v)))
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("explicit", [False, True], ids=["sdpa", "explicit"])
def test_activation_estimate_is_what_autograd_saves(case, autocast, explicit) -> None:
    *variant, dropout = case
    config = _config(*variant, n_vocab=101, d_model=64, n_heads=4, n_ctx=32, dropout=dropout)
    measured = _saved_bytes(config, 4, 32, autocast, explicit)
    dtype = "bfloat16" if autocast else "float32"
    impl = "explicit" if explicit else "sdpa"
    estimate = activation_bytes(config, 4, 32, dtype, attn_impl=impl)
    assert math.isclose(estimate, measured, rel_tol=0.05), (estimate, measured)


@pytest.mark.parametrize("variant", VARIANTS[::24], ids=lambda v: "-".join(map(str, v)))
def test_attention_only_accounting(variant) -> None:
    from glassgpt.model import GPT

    config = _config(*variant, attn_only=True)
    model = GPT(config).eval()
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert parameter_shapes(config) == expected
    assert count_parameters(config) == sum(p.numel() for p in model.parameters())
    # FLOPs: our own explicit-path model under torch's counter (matmuls only, as counted).
    model.attn_impl = "explicit"
    tokens = torch.randint(0, config.n_vocab, (2, 8))
    with FlopCounterMode(display=False) as counter:  # (its module tracker needs grad mode)
        model(tokens)
    assert flops_per_token(config, 8).mlp == 0
    assert counter.get_total_flops() == 2 * 8 * flops_per_token(config, 8).forward
    measured = _saved_bytes(config, 4, 16, False, False)
    assert math.isclose(activation_bytes(config, 4, 16), measured, rel_tol=0.05)


@pytest.mark.parametrize("seq", [128, 160])  # either side of the explicit bf16 product's limit
def test_bf16_small_head_estimate_past_the_explicit_limit(seq) -> None:
    config = _config(*MEMORY_CASES[0][:-1], n_vocab=101, d_model=64, n_heads=4, n_ctx=seq)
    measured = _saved_bytes(config, 2, seq, True, False)
    estimate = activation_bytes(config, 2, seq, "bfloat16")
    assert math.isclose(estimate, measured, rel_tol=0.02), (estimate, measured)
