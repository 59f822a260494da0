"""Replayed decoding steps of the decoder-only families' fields (glassgpt.sample.replay):
RoPE (full, partial, scaled), RMSNorm, SwiGLU and GeGLU, grouped-query attention, QK-norm,
the parallel residual, q/k/v biases, sliding windows (the sliding layers' own RoPE base) and
Gemma's embedding scale, gains, sandwich norms, soft caps and attention scale. The replay makes
the eager step's compiled calls on its buffers, so its logits equal the eager step's bit for
bit, step after step as the position (the cache column, the RoPE row) moves, on float32 and
int8 weights (bf16 weights decode eagerly, as before). What stays eager says so on stderr, naming the field."""

from __future__ import annotations

import pytest
import torch

from glassgpt.kernels import rowwise
from glassgpt.model import GPT, GPTConfig, reference
from glassgpt.model.layers import Rotary
from glassgpt.sample.cache import KVCache
from glassgpt.sample.engine import _SAID, Decoder, choose
from glassgpt.sample.replay import ReplayedStep, angle_tables
from glassgpt.serve.slots import SlotCache

from .test_replay import model_of, prefilled, replay_against_eager

pytestmark = pytest.mark.skipif(not rowwise.built(), reason="glassgpt's kernels are not built")

LLAMA = {"positional": "rope", "norm": "rmsnorm", "bias": False, "mlp": "swiglu",
         "tie_embeddings": True}  # fmt: skip
FAMILIES = {
    "llama-rope": LLAMA,
    "llama-gqa-2to1": {**LLAMA, "n_kv_heads": 2},
    "llama-gqa-4to1-untied": {**LLAMA, "n_kv_heads": 1, "tie_embeddings": False},
    "llama3-scaling": {**LLAMA, "n_kv_heads": 2, "rope_scaling": "llama3", "rope_factor": 8.0,
                       "rope_original_ctx": 16},
    "linear-scaling": {**LLAMA, "rope_scaling": "linear", "rope_factor": 2.0},
    "yarn": {**LLAMA, "rope_scaling": "yarn", "rope_factor": 4.0, "rope_original_ctx": 16},
    "qwen3-qknorm": {**LLAMA, "n_kv_heads": 2, "qk_norm": True, "rope_base": 1e6},
    "qwen2-qkv-bias": {**LLAMA, "n_kv_heads": 2, "qkv_bias": True},
    "neox-partial-parallel": {"positional": "rope", "rotary_fraction": 0.25,
                              "parallel_residual": True, "mlp": "gelu"},
    "gemma-gains-sandwich": {**LLAMA, "mlp": "geglu", "norm_offset": 1.0, "sandwich_norm": True,
                             "n_kv_heads": 1, "d_head": 16, "embed_scale": 32**0.5},
    "mistral-window": {**LLAMA, "n_kv_heads": 2, "sliding_window": 4},
    "gemma2-softcaps-window": {**LLAMA, "mlp": "geglu", "norm_offset": 1.0, "sandwich_norm": True,
                               "embed_scale": 32**0.5, "attn_softcap": 5.0, "final_softcap": 3.0,
                               "attn_scale": 0.3, "sliding_window": 3,
                               "layer_types": ("sliding", "full"), "n_kv_heads": 2},
    "gemma3-local-base": {**LLAMA, "mlp": "geglu", "norm_offset": 1.0, "sandwich_norm": True,
                          "qk_norm": True, "attn_scale": 0.25, "sliding_window": 4,
                          "layer_types": ("sliding", "full"), "rope_local_base": 100.0,
                          "n_kv_heads": 1},
}  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_familys_replayed_steps_equal_its_eager_steps_bit_for_bit(name: str, dtype: str) -> None:
    model = model_of(dtype, **FAMILIES[name])
    assert choose(model).kind == "replayed"
    replay_against_eager(model, steps=30)


def test_a_batch_of_grouped_rope_rows_replays_bit_for_bit() -> None:
    replay_against_eager(model_of(**FAMILIES["qwen3-qknorm"]), batch=3, steps=10)


@pytest.mark.parametrize(
    "name", ["llama3-scaling", "qwen3-qknorm", "mistral-window", "gemma2-softcaps-window",
             "gemma3-local-base", "neox-partial-parallel"],
)  # fmt: skip
def test_the_replayed_family_step_is_the_function_the_reference_computes(name: str) -> None:
    """Not only equal to the eager step: both are the GPT function (the NumPy float64 oracle),
    to float32 rounding, with the RoPE angles read from the tables at each position, past the
    sliding windows' length."""
    model = model_of(**FAMILIES[name])
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.config.n_vocab, (1, 20), generator=g)
    weights = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    decoder = Decoder.start(model, batch_size=1, capacity=32)
    with torch.inference_mode():
        model(ids[:, :4], cache=decoder.cache)
    for t in range(4, 20):
        got = decoder.step(ids[:, t : t + 1]).clone()
        want = reference.forward(model.config, weights, ids[0, : t + 1].numpy())[-1]
        assert torch.allclose(got[0, 0].double(), torch.from_numpy(want), atol=2e-4), t
    assert decoder.kind == "replayed"


def test_a_field_the_replay_does_not_cover_is_named_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """x₀ = s · W_E[t] + P[n] (a scaled embedding beside learned positions) is not one
    recorded call: eager, and said."""
    _SAID.clear()
    field = "embed_scale"
    model: GPT = model_of(**{**LLAMA, "embed_scale": 2.0, "positional": "learned"})
    choice = choose(model)
    assert choice.kind == "eager" and field in choice.why
    err = capsys.readouterr().err
    assert "decoding eagerly" in err and field in err
    cache = prefilled(model, torch.tensor([[1, 2, 3]]))
    step, _ = ReplayedStep.record(model, cache, torch.tensor([[4]]))
    assert step is None and field in (ReplayedStep.why_not or "")


@pytest.mark.parametrize(
    ("d_head", "fraction", "scaling"),
    [(64, 1.0, "none"), (128, 1.0, "none"), (64, 0.25, "none"), (10, 1.0, "none"),
     (6, 1.0, "none"), (64, 1.0, "llama3"), (32, 1.0, "yarn"), (16, 1.0, "linear")],
)  # fmt: skip
def test_the_angle_tables_rows_are_the_eager_steps_bits(
    d_head: int, fraction: float, scaling: str
) -> None:
    """The replay's RoPE table, computed in one call, against the eager step's rows
    ``rotary(1, p)`` at every position: equal bits (odd r/2 included)."""
    config = GPTConfig(n_vocab=10, n_ctx=600, d_model=2 * d_head, n_heads=2, positional="rope",
                       rotary_fraction=fraction, rope_scaling=scaling, rope_factor=8.0,
                       rope_original_ctx=64, rope_base=1e6)  # type: ignore[arg-type]  # fmt: skip
    rotary = Rotary(config)
    cos, sin = angle_tables(rotary, 600)
    for p in range(600):
        c, s = rotary(1, p, dtype=torch.float32)
        assert torch.equal(cos[p : p + 1], c) and torch.equal(sin[p : p + 1], s), p


@pytest.mark.parametrize("name", ["qwen3-qknorm", "gemma3-local-base", "gemma2-softcaps-window"])
def test_replayed_slot_steps_of_a_family_equal_eager_ones_and_whole_sequences(name: str) -> None:
    """A server's slots (each row at its own length: its own RoPE row and window): the
    replayed step equals the eager one bit for bit, and each row the whole sequence's
    forward to float32 rounding."""
    model = model_of(**FAMILIES[name])
    g = torch.Generator().manual_seed(2)
    V = model.config.n_vocab
    seqs = [torch.randint(0, V, (n,), generator=g).tolist() for n in (3, 11, 1)]
    mine, theirs = SlotCache.for_model(model, slots=4), SlotCache.for_model(model, slots=4)
    with torch.inference_mode():
        for cache in (mine, theirs):
            for b, s in enumerate(seqs):
                pre = KVCache.for_model(model, 1, len(s))
                model(torch.tensor([s]), cache=pre)
                cache.load(b, pre)
        step = None
        for _ in range(8):
            new = torch.randint(0, V, (3, 1), generator=g)
            if step is None:
                step, got = ReplayedStep.record(model, mine, new)
                assert step is not None, ReplayedStep.why_not
            else:
                got = step(new)
            assert torch.equal(got, model(new, cache=theirs))
            for b, t in enumerate(new[:, 0].tolist()):
                seqs[b].append(t)
                whole = model(torch.tensor([seqs[b]]))[0, -1]
                torch.testing.assert_close(got[b, -1], whole, atol=2e-5, rtol=1e-4)
    assert mine.lengths[:3].tolist() == [len(s) for s in seqs]


@pytest.mark.parametrize("name", ["qwen3-qknorm", "gemma2-softcaps-window"])
def test_a_bf16_family_model_decodes_replayed_what_its_forward_gives(name: str) -> None:
    """bf16 weights are not replayed as they are (the model computes in bf16), but on their
    decoding copy (float32 activations over the same bf16 weights: this tiny one, float32),
    whose replayed steps give the bf16 forward's logits to bf16's rounding."""
    model = model_of("bf16", **FAMILIES[name])
    assert choose(model).why == "the model is not float32 on a CPU"
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    decoder = Decoder.start(model, batch_size=1, capacity=16)
    assert decoder.kind == "replayed" and decoder.model is not model
    with torch.inference_mode():
        decoder.model(ids[:, :2], cache=decoder.cache)  # the prompt: on the decoding copy
        for t in range(2, 5):
            got = decoder.step(ids[:, t : t + 1]).float()
            whole = model(ids[:, : t + 1])[:, -1:].float()
            torch.testing.assert_close(got, whole, atol=0.03, rtol=0.03)
