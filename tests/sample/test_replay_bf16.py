"""bf16 models on a CPU decode replayed: their decoding copy (glassgpt.model.precision.
decoding_copy) runs the model's own bf16 weights under float32 activations, so its steps are
recorded and replayed like a float32 model's. The oracle: a float32 model holding the same
bf16-rounded weights, whose float32 kernels sum in the same order; and a float64 copy."""

from __future__ import annotations

import copy

import pytest
import torch

from glassgpt.kernels import bf16, rowwise
from glassgpt.model import GPT, GPTConfig, precision
from glassgpt.model.precision import cast, decoding_copy
from glassgpt.sample import engine
from glassgpt.sample.generation import generate

pytestmark = pytest.mark.skipif(not rowwise.built(), reason="glassgpt's kernels are not built")

FAMILIES = {
    "gpt2": {},
    "llama": {"mlp": "swiglu", "norm": "rmsnorm", "positional": "rope", "n_kv_heads": 2,
              "bias": False, "tie_embeddings": False},
}  # fmt: skip


def bf16_model(**overrides: object) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(**{"n_vocab": 61, "n_ctx": 40, "d_model": 64, "n_layers": 2, "n_heads": 4,
                       **overrides})  # type: ignore[arg-type]  # fmt: skip
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.1)
    return cast(model, "bf16")


@pytest.fixture
def decoders(monkeypatch: pytest.MonkeyPatch) -> list[engine.Decoder]:
    made: list[engine.Decoder] = []
    real = engine.Decoder.__init__

    def spy(self, *a, **kw):  # type: ignore[no-untyped-def]
        real(self, *a, **kw)
        made.append(self)

    monkeypatch.setattr(engine.Decoder, "__init__", spy)
    return made


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_bf16_decoding_is_replayed_and_equals_float32_of_the_rounded_weights(
    monkeypatch: pytest.MonkeyPatch, decoders: list, family: str, native: bool
) -> None:
    monkeypatch.setattr(bf16, "native", lambda: native)
    monkeypatch.setattr(precision, "BF16_MIN_WEIGHTS", 0)  # (tiny: bf16 all the same)
    model = bf16_model(**FAMILIES[family])
    oracle = cast(model, "float32")  # the same bf16 values, float32 weights and kernels
    prompt = [5, 7, 11, 13, 2]
    ids = generate(model, prompt, max_new_tokens=12, temperature=0)
    assert decoders[-1].kind == "replayed", decoders[-1].why
    assert "bf16 weights with float32 activations" in decoders[-1].why
    twin = decoders[-1].model
    assert ids == generate(oracle, prompt, max_new_tokens=12, temperature=0)
    # the replayed steps' logits against the float32 model's and float64's of the same weights
    assert twin is not model and next(model.parameters()).dtype == torch.bfloat16
    decoder = engine.Decoder.start(model, 1, 40)
    assert decoder.model is twin  # the copy is made once and kept
    seq = prompt + ids
    ref = copy.deepcopy(model).double()  # (a copy: no packed products of its own)
    with torch.inference_mode():
        decoder.model(torch.tensor([seq[:5]]), cache=decoder.cache)
        want32 = oracle(torch.tensor([seq]))[0]
        want64 = ref(torch.tensor([seq]))[0]
        for t in range(5, len(seq)):
            got = decoder.step(torch.tensor([[seq[t]]]))[0, -1]
            torch.testing.assert_close(got, want32[t], rtol=1e-5, atol=1e-5)
            err = (got.double() - want64[t]).abs().max()
            assert err <= 1e-5 * want64[t].abs().max()  # float32 sums of bf16 weights
    assert decoder.kind == "replayed"


def test_the_bf16_weights_are_shared_not_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "BF16_MIN_WEIGHTS", 0)
    for tie in (True, False):
        model = bf16_model(tie_embeddings=tie)
        twin, _ = decoding_copy(model)
        mine = {p.data_ptr() for p in model.parameters()}
        shared = [p for p in twin.parameters() if p.data_ptr() in mine]
        assert {p.dtype for p in shared} == {torch.bfloat16}
        assert {p.dtype for p in twin.parameters() if p.data_ptr() not in mine} == {torch.float32}
        n_proj = 2 * 4 + (0 if tie else 1)  # W_QKV, W_O, W_in, W_out a block; untied W_U
        assert len(shared) == n_proj


def test_a_small_bf16_model_decodes_in_float32_and_says_so_once(
    capsys: pytest.CaptureFixture, decoders: list
) -> None:
    model = bf16_model()
    assert sum(p.numel() for p in model.parameters()) < precision.BF16_MIN_WEIGHTS
    oracle = cast(model, "float32")
    engine._SAID.clear()
    for _ in range(2):
        ids = generate(model, [1, 2, 3], max_new_tokens=6, temperature=0)
        assert ids == generate(oracle, [1, 2, 3], max_new_tokens=6, temperature=0)
    assert decoders[0].kind == "replayed" and "float32" in decoders[0].why
    assert decoders[0].model.embed.W_E.dtype == torch.float32
    err = capsys.readouterr().err
    assert err.count("decoding computes in float32") == 1, err


def test_hooks_or_a_changed_weight_are_seen(
    monkeypatch: pytest.MonkeyPatch, decoders: list
) -> None:
    """A bf16 model with hooks decodes itself, eagerly; a weight changed in place makes a
    new decoding copy (the old one's copied norms would be stale)."""
    monkeypatch.setattr(precision, "BF16_MIN_WEIGHTS", 0)
    model = bf16_model()
    generate(model, [1, 2, 3], max_new_tokens=3, temperature=0)
    first = decoders[-1].model
    with torch.no_grad():
        model.ln_final.w.mul_(2.0)
    ids = generate(model, [1, 2, 3], max_new_tokens=3, temperature=0)
    assert decoders[-1].model is not first
    assert ids == generate(cast(model, "float32"), [1, 2, 3], max_new_tokens=3, temperature=0)
    seen: list[int] = []
    with model.hooks({"blocks.0.attn.q": lambda x, hook: seen.append(1)}):
        generate(model, [1, 2, 3], max_new_tokens=3, temperature=0)
    assert decoders[-1].model is model and decoders[-1].kind == "eager" and seen


def test_a_decoded_bf16_model_is_freed_with_its_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the packed products (their panels made at decoding) nor the decoding copy
    keep a dropped model's weights alive."""
    import gc
    import weakref

    from glassgpt.kernels import dense

    monkeypatch.setattr(precision, "BF16_MIN_WEIGHTS", 0)
    model = bf16_model()
    generate(model, [1, 2, 3], max_new_tokens=4, temperature=0)
    W = weakref.ref(model.blocks[0].attn.W_QKV)
    keys = {id(p) for p in model.parameters()} & set(dense._PACKED)
    assert keys
    del model
    gc.collect()
    assert W() is None and not keys & set(dense._PACKED)


def test_without_the_kernels_a_bf16_model_decodes_itself(decoders: list) -> None:
    """No compiled kernels (an install without a C compiler): no decoding copy is made, the
    bf16 model decodes eagerly, as before."""
    from glassgpt.kernels import hidden

    model = bf16_model()
    engine._COPIES.clear()
    with hidden("_rowwise"):  # (what a recording needs)
        ids = generate(model, [1, 2, 3], max_new_tokens=4, temperature=0)
    assert decoders[-1].model is model and decoders[-1].kind == "eager"
    assert len(ids) == 4 and model not in engine._COPIES
