"""TransformerLens 4.3's TransformerBridge and glassgpt record the same activations.

The bridge wraps the transformers model itself and keeps TransformerLens's hook names; it is
built here offline, around the tiny random models of ``hf_cases`` (a grouped-query Llama with
llama3 RoPE scaling, a parallel-residual GPT-NeoX with a quarter of each head rotated), by
``build_bridge_from_module`` (what ``boot_transformers(hf_model=...)`` calls once it has the
model and a tokenizer; it reads no file and no network). The transformers model is made
float64 throughout (``float64_everywhere``, and the eager attention's softmax in float64),
glassgpt's import of it is float64, and every hook name the two share is compared to 1e-10.

Where the two lay a value out differently, the test says how:

- q and k: glassgpt rotates the pairs (2i, 2i+1) of each head, transformers the halves
  (i, i + r/2) (``rotate_half``), so the import permutes W_Q, W_K's columns by π
  (``rotate_half_order``) and glassgpt's q, k are TransformerLens's q, k with their last axis
  permuted by π. glassgpt's q and k are after the rotation: the bridge's ``hook_rot_q``/
  ``hook_rot_k`` on Llama; on NeoX, whose attention the bridge hooks differently, its
  ``hook_q``/``hook_k`` are before the rotation and are compared to glassgpt's with the
  rotation undone (the rotated dimensions are the first r; the rest must agree as they are).
- attention scores: the causal entries (the masked ones are −∞ in glassgpt, a large
  negative number or −∞ in the bridge, compared as "masked").
- the norms' ``hook_scale``: glassgpt's s(x) = 1/√(mean(x²) + ε) multiplies x; the bridge's
  is what x is divided by, so they are compared as reciprocals.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.interop.hf_cases import CASES, float64_everywhere, float64_softmax, make, tokens
from tests.model.test_families_hf import rotate_half_order

from glassgpt.inspect.cache import run_with_cache
from glassgpt.interop import from_hf

pytest.importorskip("transformers")
sources = pytest.importorskip("transformer_lens.model_bridge.sources")

MODELS = ["llama-gqa2-llama3-untied", "neox-parallel-quarter-rotary"]


def both(name: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], Any]:
    """(the bridge's cache, glassgpt's cache, glassgpt's model) on the same tokens."""
    hf = make(CASES[name])
    ours = from_hf(hf, dtype=torch.float64)
    hf64 = float64_everywhere(hf, ours)
    bridge = sources.build_bridge_from_module(
        hf64, type(hf).__name__, hf_config=hf64.config, dtype=torch.float64, device="cpu"
    )
    x = tokens()
    with float64_softmax(), torch.no_grad():
        logits_tl, cache_tl = bridge.run_with_cache(x)
    logits, cache = run_with_cache(ours, x)
    theirs = {k: cache_tl[k] for k in cache_tl} | {"logits": logits_tl}
    return theirs, dict(cache) | {"logits": logits}, ours


# TransformerLens's name (per block: after "blocks.{l}.") → glassgpt's, and how to compare
SHARED = {
    "hook_resid_pre": "resid_pre", "hook_resid_mid": "resid_mid", "hook_resid_post": "resid_post",
    "hook_attn_out": "attn_out", "hook_mlp_out": "mlp_out", "ln1.hook_scale": "ln1.scale",
    "ln2.hook_scale": "ln2.scale", "attn.hook_v": "attn.v", "attn.hook_z": "attn.z",
    "attn.hook_attn_scores": "attn.attn_scores", "attn.hook_pattern": "attn.pattern",
    "mlp.hook_post": "mlp.post",
}  # fmt: skip
TOP = {"hook_embed": "embed", "ln_final.hook_scale": "ln_final.scale", "logits": "logits"}


def rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' RoPE of the first r dimensions (r = cos's last size): x cos + rotate_half(x) sin."""
    r = cos.shape[-1]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [1, T, 1, r]: every head
    x_r, rest = x[..., :r], x[..., r:]
    half = torch.cat([-x_r[..., r // 2 :], x_r[..., : r // 2]], dim=-1)
    return torch.cat([x_r * cos + half * sin, rest], dim=-1)


def pairs(name: str) -> list[tuple[str, str, torch.Tensor, torch.Tensor]]:
    """(their name, our name, theirs laid out as ours, ours) for every shared hook name."""
    theirs, ours, model = both(name)
    c = model.config
    gated = c.gated
    mlp = {"mlp.hook_pre": "mlp.pre_gate" if gated else "mlp.pre"}
    if gated:
        mlp["mlp.hook_pre_linear"] = "mlp.pre"
    perm = rotate_half_order(c.d_head, c.rotary_dims)
    out = []
    for tl, gg in TOP.items():
        out.append((tl, gg, theirs[tl], ours[gg]))
    for layer in range(c.n_layers):
        p = f"blocks.{layer}."
        for tl, gg in (SHARED | mlp).items():
            if p + tl in theirs or p + gg in ours:  # a name one of them lacks fails below
                out.append((p + tl, p + gg, theirs.get(p + tl), ours.get(p + gg)))
        for m in "qk":
            if p + f"attn.hook_rot_{m}" in theirs:  # Llama: the bridge hooks q, k rotated too
                t = theirs[p + f"attn.hook_rot_{m}"]
            else:  # NeoX: only before the rotation; rotated by the bridge's own cos, sin
                cos, sin = theirs[p + "attn.hook_cos"], theirs[p + "attn.hook_sin"]
                t = rotated(theirs[p + f"attn.hook_{m}"], cos, sin)
            out.append((p + f"attn.hook_{m}", p + f"attn.{m}", t[..., perm], ours[p + f"attn.{m}"]))
    return out


@pytest.mark.parametrize("name", MODELS)
def test_every_shared_hook_holds_the_same_activation_in_float64(name: str) -> None:
    compared = []
    for tl, gg, t, g in pairs(name):
        assert t is not None and g is not None, (tl, gg, "recorded by one side only")
        if tl.endswith("hook_scale"):
            t = 1.0 / t  # theirs divides x, ours multiplies it
        assert t.shape == g.shape, (tl, tuple(t.shape), tuple(g.shape))
        if tl.endswith("hook_attn_scores"):
            causal = torch.ones(g.shape[-2:], dtype=torch.bool).tril()
            assert bool((g[..., ~causal] == -torch.inf).all())
            assert bool((t[..., ~causal] <= torch.finfo(t.dtype).min).all())  # -inf or their min
            t, g = t[..., causal], g[..., causal]
        torch.testing.assert_close(t, g, rtol=0, atol=1e-10, msg=lambda m, n=tl: f"{n}: {m}")
        compared.append(tl.split(".", 2)[-1] if tl.startswith("blocks.") else tl)
    expected = {*TOP, *SHARED, "mlp.hook_pre", "attn.hook_q", "attn.hook_k"}
    if name.startswith("neox"):
        expected.discard("hook_resid_mid")  # the parallel residual has none, in both
    else:
        expected.add("mlp.hook_pre_linear")
    assert set(compared) == expected
