"""The families against transformers' own modules: tiny Llama (grouped-query attention,
llama3 rope scaling) and GPT-NeoX (parallel residual, partial rotary) models built from their
config classes with random weights, mapped by hand onto glassgpt's names, in float64.

transformers computes some steps in float32 whatever the model's dtype: the rotary angles
(``inv_freq`` and ``position · inv_freq``), Llama's RMSNorm, and the eager attention's
softmax. So the rope frequencies are compared with its own rope functions at float32
precision; its rotary module then gets the float64 angles of those same frequencies, its
RMSNorms their own formula in float64, and its attention is PyTorch's SDPA (float64), so that
everything else (the attention, the rotation by ``rotate_half``, the groups, the norms and
the residual) is compared to 1e-10.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from glassgpt.model import GPT, GPTConfig
from glassgpt.model.layers import rope_frequencies

transformers = pytest.importorskip("transformers")
rope_utils = pytest.importorskip("transformers.modeling_rope_utils")


def rotate_half_order(d_head: int, r: int) -> torch.Tensor:
    """π: glassgpt's dimension 2i is transformers' i, 2i+1 its i + r/2 (2i < r; the rest kept).

    >>> rotate_half_order(6, 4).tolist()
    [0, 2, 1, 3, 4, 5]
    """
    pairs = torch.stack([torch.arange(r // 2), torch.arange(r // 2) + r // 2], 1).flatten()
    return torch.cat([pairs, torch.arange(r, d_head)])


def float64_rotary(rotary: Any, inv_freq: torch.Tensor, factor: float) -> None:
    """Make transformers' rotary module compute cos, sin in float64 from ``inv_freq``."""

    def forward(x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].double() * inv_freq  # [B, T, r/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * factor).to(x.dtype), (emb.sin() * factor).to(x.dtype)

    rotary.forward = forward


def float64_rms_norms(model: Any) -> None:
    """Make each of transformers' Llama and Qwen RMSNorms w ⊙ x/√(mean(x²) + ε) in the input's dtype
    (its own forward rounds x to float32 first)."""
    for module in model.modules():
        if type(module).__name__ in ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"):

            def forward(x: torch.Tensor, m: Any = module) -> torch.Tensor:
                return m.weight * (
                    x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.variance_epsilon)
                )

            module.forward = forward


def float64_gemma_norms(model: Any) -> None:
    """Make each of transformers' Gemma RMSNorms x/√(mean(x²) + ε) ⊙ (1 + w) in the input's
    dtype (its own forward rounds x to float32 first)."""
    for module in model.modules():
        if type(module).__name__ in ("Gemma2RMSNorm", "Gemma3RMSNorm"):

            def forward(x: torch.Tensor, m: Any = module) -> torch.Tensor:
                y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m.eps)
                return y * (1.0 + m.weight)

            module.forward = forward


def heads(W: torch.Tensor, n: int, order: torch.Tensor | None = None) -> torch.Tensor:
    """An HF projection weight [n·d_head, d_model] → glassgpt's [n, d_model, d_head]."""
    out = W.reshape(n, -1, W.shape[1]).transpose(1, 2)
    return out if order is None else out[..., order]


def randomise(hf: Any, centre: float) -> Any:
    """transformers' model in float64, eval mode, every weight random: N(0, 0.3²), the 1-D ones
    (norm gains) around ``centre``."""
    hf = hf.double().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (centre if p.ndim == 1 else 0.0))
    return hf


_NORMS = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}
_SANDWICH = {
    "ln1": "input_layernorm", "ln1_post": "post_attention_layernorm",
    "ln2": "pre_feedforward_layernorm", "ln2_post": "post_feedforward_layernorm",
}  # fmt: skip


def llama_shaped_state(hf: Any, H: int, G: int, dh: int) -> dict[str, torch.Tensor]:
    """glassgpt's state dict from a Llama-shaped transformers model (Llama, Qwen, Gemma):
    q, k (and their biases and q/k-norm weights) permuted into glassgpt's rotary pairs."""
    order = rotate_half_order(dh, dh)
    D = hf.config.hidden_size
    state = {"embed.W_E": hf.model.embed_tokens.weight, "ln_final.w": hf.model.norm.weight}
    if not hf.config.tie_word_embeddings:
        state["unembed.W_U"] = hf.lm_head.weight.T
    for i, layer in enumerate(hf.model.layers):
        p, a, m = f"blocks.{i}.", layer.self_attn, layer.mlp
        norms = _SANDWICH if hasattr(layer, "pre_feedforward_layernorm") else _NORMS
        state |= {p + f"{ours}.w": getattr(layer, theirs).weight for ours, theirs in norms.items()}
        state |= {
            p + "attn.W_Q": heads(a.q_proj.weight, H, order),
            p + "attn.W_K": heads(a.k_proj.weight, G, order),
            p + "attn.W_V": heads(a.v_proj.weight, G),
            p + "attn.W_O": a.o_proj.weight.T.reshape(H, dh, D),
            p + "mlp.W_gate": m.gate_proj.weight.T, p + "mlp.W_in": m.up_proj.weight.T,
            p + "mlp.W_out": m.down_proj.weight.T,
        }  # fmt: skip
        if a.q_proj.bias is not None:
            state |= {
                p + "attn.b_Q": a.q_proj.bias.reshape(H, dh)[:, order],
                p + "attn.b_K": a.k_proj.bias.reshape(G, dh)[:, order],
                p + "attn.b_V": a.v_proj.bias.reshape(G, dh),
            }
        if hasattr(a, "q_norm"):
            state |= {p + "attn.q_norm.w": a.q_norm.weight[order],
                      p + "attn.k_norm.w": a.k_norm.weight[order]}  # fmt: skip
    return state


def assert_same_logits(model: GPT, hf: Any, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """Load ``state`` into ``model``; both models' logits on a random batch agree to 1e-10."""
    model.load_state_dict({k: v.detach().clone() for k, v in state.items()})
    cfg = model.config
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.n_vocab, (2, cfg.n_ctx), generator=gen)
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    assert theirs.abs().max() > 0.1
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=0, atol=1e-10)
    return theirs


def test_llama_with_groups_and_llama3_scaling_equals_transformers() -> None:
    D, H, G, dh, L, V, F, T = 32, 4, 2, 8, 2, 29, 48, 12
    rope = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8}  # fmt: skip
    hf_config = transformers.LlamaConfig(
        vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L,
        num_attention_heads=H, num_key_value_heads=G, head_dim=dh, max_position_embeddings=T,
        rms_norm_eps=1e-6, rope_parameters=rope, tie_word_embeddings=False,
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    hf = randomise(transformers.LlamaForCausalLM(hf_config), 1.0)
    cfg = GPTConfig(
        n_vocab=V, n_ctx=T, d_model=D, n_layers=L, n_heads=H, n_kv_heads=G, d_head=dh,
        d_mlp=F, positional="rope", rope_base=500.0, rope_scaling="llama3", rope_factor=8.0,
        rope_original_ctx=8, norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", bias=False,
        tie_embeddings=False,
    )  # fmt: skip
    model = GPT(cfg).double().eval()
    inv, factor = model.rotary.frequencies()
    hf_inv, hf_factor = rope_utils.ROPE_INIT_FUNCTIONS["llama3"](hf_config)
    np.testing.assert_allclose(inv.numpy(), hf_inv.double().numpy(), rtol=1e-6)
    assert factor == hf_factor
    assert not np.allclose(inv.numpy(), rope_frequencies(dh, 500.0)[0].numpy())  # scaled
    float64_rotary(hf.model.rotary_emb, inv, factor)
    float64_rms_norms(hf)
    assert_same_logits(model, hf, llama_shaped_state(hf, H, G, dh))


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_with_qkv_biases_or_qk_norms_equals_transformers(family: str) -> None:
    D, H, G, dh, L, V, F, T = 32, 4, 1, 8, 2, 29, 48, 12
    kind = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[family]
    hf_config = kind(
        vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L,
        num_attention_heads=H, num_key_value_heads=G, head_dim=dh, max_position_embeddings=T,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 100.0},
        tie_word_embeddings=True, attn_implementation="sdpa",
    )  # fmt: skip
    causal_lm = {"qwen2": transformers.Qwen2ForCausalLM, "qwen3": transformers.Qwen3ForCausalLM}
    torch.manual_seed(0)
    hf = randomise(causal_lm[family](hf_config), 1.0)
    cfg = GPTConfig(
        n_vocab=V, n_ctx=T, d_model=D, n_layers=L, n_heads=H, n_kv_heads=G, d_head=dh, d_mlp=F,
        positional="rope", rope_base=100.0, norm="rmsnorm", norm_eps=1e-6, mlp="swiglu",
        bias=False, qkv_bias=family == "qwen2", qk_norm=family == "qwen3",
    )  # fmt: skip
    model = GPT(cfg).double().eval()
    float64_rotary(hf.model.rotary_emb, *model.rotary.frequencies())
    float64_rms_norms(hf)
    assert_same_logits(model, hf, llama_shaped_state(hf, H, G, dh))


def test_yarn_and_linear_frequencies_equal_transformers() -> None:
    for rope, ours in (
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
          "beta_fast": 32.0, "beta_slow": 1.0},
         {"rope_scaling": "yarn", "rope_factor": 4.0, "rope_original_ctx": 64}),
        ({"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096,
          "beta_fast": 16.0, "beta_slow": 2.0},
         {"rope_scaling": "yarn", "rope_factor": 16.0, "rope_original_ctx": 4096,
          "rope_beta_fast": 16.0, "rope_beta_slow": 2.0}),
        ({"rope_type": "linear", "factor": 3.0}, {"rope_scaling": "linear", "rope_factor": 3.0}),
    ):  # fmt: skip
        hf_config = transformers.LlamaConfig(
            hidden_size=256, num_attention_heads=2, max_position_embeddings=256,
            rope_parameters={**rope, "rope_theta": 10000.0},
        )  # fmt: skip
        theirs, their_factor = rope_utils.ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_config)
        cfg = GPTConfig(n_ctx=256, d_model=256, n_heads=2, positional="rope", **ours)
        inv, factor = GPT(cfg).rotary.frequencies()
        np.testing.assert_allclose(inv.numpy(), theirs.double().numpy(), rtol=1e-6)
        assert factor == pytest.approx(their_factor, rel=1e-12)
        assert not np.allclose(inv.numpy(), rope_frequencies(128, 10000.0)[0].numpy())


def test_gemma2_with_soft_caps_and_alternating_windows_equals_transformers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    D, H, G, dh, L, V, F, T, window = 32, 4, 2, 8, 2, 37, 48, 12, 3
    kinds = ["sliding_attention", "full_attention"]
    hf_config = transformers.Gemma2Config(
        vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L,
        num_attention_heads=H, num_key_value_heads=G, head_dim=dh, query_pre_attn_scalar=12,
        sliding_window=window, layer_types=kinds, max_position_embeddings=T,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0}, rms_norm_eps=1e-6,
        final_logit_softcapping=2.5, attn_logit_softcapping=1.5, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    hf = randomise(transformers.Gemma2ForCausalLM(hf_config), 0.0)
    cfg = GPTConfig(
        n_vocab=V, n_ctx=T, d_model=D, n_layers=L, n_heads=H, n_kv_heads=G, d_head=dh, d_mlp=F,
        positional="rope", rope_base=100.0, sliding_window=window, layer_types=("sliding", "full"),
        sandwich_norm=True, norm="rmsnorm", norm_eps=1e-6, norm_offset=1.0, mlp="gated",
        mlp_gate="gelu_tanh", mlp_value="identity", bias=False, attn_scale=12**-0.5,
        attn_softcap=1.5, final_softcap=2.5,
        embed_scale=float(hf.model.embed_tokens.embed_scale),  # √d rounded to float32, as theirs
    )  # fmt: skip
    model = GPT(cfg).double().eval()
    float64_rotary(hf.model.rotary_emb, *model.rotary.frequencies())
    float64_gemma_norms(hf)
    softmax = torch.nn.functional.softmax

    def float64_softmax(x: torch.Tensor, dim: int, dtype: Any = None) -> torch.Tensor:
        return softmax(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", float64_softmax)  # theirs: float32
    theirs = assert_same_logits(model, hf, llama_shaped_state(hf, H, G, dh))
    assert theirs.abs().max() < 2.5  # the final cap bites


def test_neox_with_parallel_residual_and_partial_rotary_equals_transformers() -> None:
    D, H, L, V, T, frac = 32, 4, 2, 31, 12, 0.25
    dh = D // H
    r = int(dh * frac)
    hf_config = transformers.GPTNeoXConfig(
        vocab_size=V, hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
        intermediate_size=4 * D, max_position_embeddings=T, use_parallel_residual=True,
        rope_parameters={"rope_type": "default", "rope_theta": 30.0, "partial_rotary_factor": frac},
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    hf = randomise(transformers.GPTNeoXForCausalLM(hf_config), 1.0)
    cfg = GPTConfig(
        n_vocab=V, n_ctx=T, d_model=D, n_layers=L, n_heads=H, positional="rope",
        rope_base=30.0, rotary_fraction=frac, parallel_residual=True, mlp="gelu",
        tie_embeddings=False,
    )  # fmt: skip
    model = GPT(cfg).double().eval()
    inv, factor = model.rotary.frequencies()
    hf_inv, _ = hf.gpt_neox.rotary_emb.compute_default_rope_parameters(hf_config)
    assert inv.shape == (r // 2,)
    np.testing.assert_allclose(inv.numpy(), hf_inv.double().numpy(), rtol=1e-6)
    float64_rotary(hf.gpt_neox.rotary_emb, inv, factor)
    order = rotate_half_order(dh, r)
    state: dict[str, torch.Tensor] = {"embed.W_E": hf.gpt_neox.embed_in.weight}
    for i, layer in enumerate(hf.gpt_neox.layers):
        p, a, m = f"blocks.{i}.", layer.attention, layer.mlp
        W = a.query_key_value.weight.reshape(H, 3, dh, D)  # each head's q | k | v rows
        b = a.query_key_value.bias.reshape(H, 3, dh)
        state |= {
            p + "ln1.w": layer.input_layernorm.weight, p + "ln1.b": layer.input_layernorm.bias,
            p + "ln2.w": layer.post_attention_layernorm.weight,
            p + "ln2.b": layer.post_attention_layernorm.bias,
            p + "attn.W_Q": W[:, 0].transpose(1, 2)[..., order],
            p + "attn.W_K": W[:, 1].transpose(1, 2)[..., order],
            p + "attn.W_V": W[:, 2].transpose(1, 2),
            p + "attn.b_Q": b[:, 0][..., order], p + "attn.b_K": b[:, 1][..., order],
            p + "attn.b_V": b[:, 2],
            p + "attn.W_O": a.dense.weight.T.reshape(H, dh, D), p + "attn.b_O": a.dense.bias,
            p + "mlp.W_in": m.dense_h_to_4h.weight.T, p + "mlp.b_in": m.dense_h_to_4h.bias,
            p + "mlp.W_out": m.dense_4h_to_h.weight.T, p + "mlp.b_out": m.dense_4h_to_h.bias,
        }  # fmt: skip
    state |= {
        "ln_final.w": hf.gpt_neox.final_layer_norm.weight,
        "ln_final.b": hf.gpt_neox.final_layer_norm.bias,
        "unembed.W_U": hf.lm_head.weight.T,
    }
    assert_same_logits(model, hf, state)


def test_gemma3_with_qk_norms_sandwiches_and_local_layers_equals_transformers() -> None:
    D, H, G, dh, L, V, F, T, window = 32, 4, 2, 8, 4, 37, 48, 12, 3
    kinds = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    rope = {
        "full_attention": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 8.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
    }
    hf_config = transformers.Gemma3TextConfig(
        vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L,
        num_attention_heads=H, num_key_value_heads=G, head_dim=dh, query_pre_attn_scalar=12,
        sliding_window=window, layer_types=kinds, rope_parameters=rope,
        max_position_embeddings=T, rms_norm_eps=1e-6, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    hf = randomise(transformers.Gemma3ForCausalLM(hf_config), 0.0)
    cfg = GPTConfig(
        n_vocab=V, n_ctx=T, d_model=D, n_layers=L, n_heads=H, n_kv_heads=G, d_head=dh, d_mlp=F,
        positional="rope", rope_base=1000.0, rope_scaling="linear", rope_factor=8.0,
        rope_local_base=10.0, sliding_window=window,
        layer_types=tuple(k.split("_")[0] for k in kinds), qk_norm=True, sandwich_norm=True,
        norm="rmsnorm", norm_eps=1e-6, norm_offset=1.0, mlp="gated", mlp_gate="gelu_tanh",
        mlp_value="identity", bias=False, tie_embeddings=True, attn_scale=12**-0.5,
        embed_scale=float(hf.model.embed_tokens.embed_scale),  # √d rounded to float32, as theirs
    )  # fmt: skip
    model = GPT(cfg).double().eval()
    angles = {"full_attention": model.rotary.frequencies(),
              "sliding_attention": model.rotary_local.frequencies()}  # fmt: skip
    for kind, (inv, _) in angles.items():
        theirs = getattr(hf.model.rotary_emb, f"{kind}_inv_freq")
        np.testing.assert_allclose(inv.numpy(), theirs.double().numpy(), rtol=1e-6)

    def rotary(x: torch.Tensor, position_ids: torch.Tensor, layer_type: str) -> Any:
        inv, factor = angles[layer_type]
        emb = torch.cat([position_ids[..., None].double() * inv] * 2, dim=-1)
        return (emb.cos() * factor).to(x.dtype), (emb.sin() * factor).to(x.dtype)

    hf.model.rotary_emb.forward = rotary
    float64_gemma_norms(hf)
    assert_same_logits(model, hf, llama_shaped_state(hf, H, G, dh))
