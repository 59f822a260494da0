"""Tiny random transformers models of each family, and transformers made float64 throughout.

transformers computes some steps in float32 whatever the model's dtype: the rotary angles
(``inv_freq`` and ``position · inv_freq``), the RMSNorms (x is rounded to float32 first) and
the eager attention's softmax. :func:`float64_everywhere` gives those steps their float64
formulas (the rotary frequencies and Gemma's √d after checking theirs equal glassgpt's to
float32 precision),
so that everything else — the attention, ``rotate_half``, the groups, windows, caps, norms and
residuals — can be compared to 1e-10.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from glassgpt.model import GPT

transformers = pytest.importorskip("transformers")

V, T = 41, 12  # vocabulary, context (longer than every window below)
NO_SPECIAL = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


@dataclass(frozen=True)
class Case:
    """One tiny model: its transformers config class and kwargs; norm gains around ``centre``
    (1 for w, 0 for Gemma's 1 + w)."""

    config: str
    model: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    centre: float = 1.0
    attn: str = "sdpa"


def _llama(D: int = 32, H: int = 4, G: int = 2, dh: int = 8, L: int = 2, **kw: Any) -> dict:
    return {"vocab_size": V, "hidden_size": D, "intermediate_size": 48, "num_hidden_layers": L,
            "num_attention_heads": H, "num_key_value_heads": G, "head_dim": dh,
            "max_position_embeddings": T, "rms_norm_eps": 1e-6, **NO_SPECIAL, **kw}  # fmt: skip


def _rope(kind: str = "default", theta: float = 100.0, **kw: Any) -> dict:
    return {"rope_type": kind, "rope_theta": theta, **kw}


CASES = {
    "llama-gqa2-llama3-untied": Case("LlamaConfig", "LlamaForCausalLM", _llama(
        rope_parameters=_rope("llama3", 500.0, factor=8.0, low_freq_factor=1.0,
                              high_freq_factor=4.0, original_max_position_embeddings=8),
        tie_word_embeddings=False)),
    "llama-gqa3-yarn-tied": Case("LlamaConfig", "LlamaForCausalLM", _llama(
        D=48, H=6, G=2, rope_parameters=_rope("yarn", factor=2.0, original_max_position_embeddings=6),
        tie_word_embeddings=True)),
    "llama-mha-linear-wide-heads": Case("LlamaConfig", "LlamaForCausalLM", _llama(
        H=2, G=2, dh=12, rope_parameters=_rope("linear", factor=2.0), tie_word_embeddings=False)),
    "mistral-gqa4-window3": Case("MistralConfig", "MistralForCausalLM", _llama(
        G=1, sliding_window=3, rope_parameters=_rope(), tie_word_embeddings=False)),
    "qwen2-gqa2-tied": Case("Qwen2Config", "Qwen2ForCausalLM", _llama(
        rope_parameters=_rope(), tie_word_embeddings=True)),
    "qwen2-window4-upper-layers": Case("Qwen2Config", "Qwen2ForCausalLM", _llama(
        L=3, use_sliding_window=True, sliding_window=4, max_window_layers=1,
        rope_parameters=_rope(), tie_word_embeddings=False)),
    "qwen3-gqa2-untied": Case("Qwen3Config", "Qwen3ForCausalLM", _llama(
        rope_parameters=_rope(), tie_word_embeddings=False)),
    "qwen3-mha-yarn-tied": Case("Qwen3Config", "Qwen3ForCausalLM", _llama(
        G=4, rope_parameters=_rope("yarn", factor=1.5, original_max_position_embeddings=8),
        tie_word_embeddings=True)),
    "gemma2-softcaps-window3": Case("Gemma2Config", "Gemma2ForCausalLM", _llama(
        query_pre_attn_scalar=12, sliding_window=3, final_logit_softcapping=2.5,
        attn_logit_softcapping=1.5, rope_parameters=_rope()), centre=0.0, attn="eager"),
    "gemma2-untied-uncapped": Case("Gemma2Config", "Gemma2ForCausalLM", _llama(
        L=3, G=1, query_pre_attn_scalar=8, sliding_window=5, final_logit_softcapping=None,
        attn_logit_softcapping=None, tie_word_embeddings=False, rope_parameters=_rope()),
        centre=0.0, attn="eager"),
    "gemma3-local-base-linear-full": Case("Gemma3TextConfig", "Gemma3ForCausalLM", _llama(
        L=4, query_pre_attn_scalar=12, sliding_window=3,
        layer_types=["sliding_attention", "full_attention"] * 2,
        rope_parameters={"full_attention": _rope("linear", 1000.0, factor=8.0),
                         "sliding_attention": _rope(theta=10.0)}), centre=0.0),
    "gemma3-softcaps-untied-all-sliding": Case("Gemma3TextConfig", "Gemma3ForCausalLM", _llama(
        query_pre_attn_scalar=8, sliding_window=5, final_logit_softcapping=3.0,
        attn_logit_softcapping=2.0, tie_word_embeddings=False,
        rope_parameters={"full_attention": _rope(theta=1000.0),
                         "sliding_attention": _rope(theta=10.0)}), centre=0.0, attn="eager"),
    "neox-parallel-quarter-rotary": Case("GPTNeoXConfig", "GPTNeoXForCausalLM", {
        "vocab_size": V, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": T, "use_parallel_residual": True,
        "rope_parameters": _rope(theta=30.0, partial_rotary_factor=0.25), **NO_SPECIAL}),
    "neox-sequential-half-rotary-tied": Case("GPTNeoXConfig", "GPTNeoXForCausalLM", {
        "vocab_size": V, "hidden_size": 48, "intermediate_size": 40, "num_hidden_layers": 3,
        "num_attention_heads": 3, "max_position_embeddings": T, "use_parallel_residual": False,
        "hidden_act": "gelu_new", "tie_word_embeddings": True, "layer_norm_eps": 1e-6,
        "rope_parameters": _rope(theta=50.0, partial_rotary_factor=0.5), **NO_SPECIAL}),
}  # fmt: skip


def make(case: Case, seed: int = 0) -> Any:
    """The case's transformers model, float32, eval mode, every weight random: N(0, 0.2²),
    the 1-D ones (norm gains, biases) around ``case.centre``."""
    config = getattr(transformers, case.config)(**case.kwargs, attn_implementation=case.attn)
    torch.manual_seed(seed)
    hf = getattr(transformers, case.model)(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (case.centre if p.ndim == 1 else 0.0))
    return hf


def tokens(n: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (n, T), generator=torch.Generator().manual_seed(seed))


def _rotary_forward(angles: dict[str | None, tuple[torch.Tensor, float]]) -> Any:
    def forward(x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None) -> Any:
        inv, factor = angles[layer_type]
        emb = torch.cat([position_ids[..., None].double() * inv] * 2, dim=-1)  # [B, T, r]
        return (emb.cos() * factor).to(x.dtype), (emb.sin() * factor).to(x.dtype)

    return forward


def float64_everywhere(hf: Any, ours: GPT) -> Any:
    """A float64 copy of ``hf`` whose float32 steps are float64 (the module docstring);
    the rotary frequencies are glassgpt's once checked equal to theirs (rtol 1e-6)."""
    hf = copy.deepcopy(hf).double()
    for module in hf.modules():  # Gemma's √d: a float32 buffer, or float64 from from_pretrained
        if isinstance(getattr(module, "embed_scale", None), torch.Tensor):
            assert float(module.embed_scale) == pytest.approx(ours.config.embed_scale, rel=1e-6)
            module.embed_scale.fill_(ours.config.embed_scale)
    full = ours.rotary.frequencies()
    local = ours.rotary_local.frequencies() if ours.rotary_local is not None else full
    for module in hf.modules():
        name = type(module).__name__
        if name.endswith("RotaryEmbedding"):
            angles: dict[str | None, tuple[torch.Tensor, float]] = {}
            for kind, mine in (
                (None, full),
                ("full_attention", full),
                ("sliding_attention", local),
            ):
                prefix = "" if kind is None else f"{kind}_"
                theirs = getattr(module, f"{prefix}inv_freq", None)
                if theirs is None:
                    continue
                np.testing.assert_allclose(mine[0].numpy(), theirs.double().numpy(), rtol=1e-6)
                factor = getattr(module, f"{prefix}attention_scaling")
                assert mine[1] == pytest.approx(factor, rel=1e-12)
                angles[kind] = mine
            module.forward = _rotary_forward(angles)
        elif name.endswith("RMSNorm"):
            gemma = name.startswith("Gemma")

            def rms(x: torch.Tensor, m: Any = module, gemma: bool = gemma) -> torch.Tensor:
                eps = m.eps if gemma else m.variance_epsilon
                y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
                return y * (1.0 + m.weight) if gemma else m.weight * y

            module.forward = rms
    return hf


@contextmanager
def float64_softmax() -> Iterator[None]:
    """The eager attention's softmax (theirs: ``dtype=torch.float32``) in float64."""
    softmax = torch.nn.functional.softmax

    def patched(x: torch.Tensor, dim: int | None = None, dtype: Any = None, **kw: Any) -> Any:
        return softmax(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype, **kw)

    torch.nn.functional.softmax = patched
    try:
        yield
    finally:
        torch.nn.functional.softmax = softmax
