"""--dtype int4: the copy is the GPT function with W̃ = q·d in its block projections (int8
unembedding), decoded by the replay engine bit for bit, from the CLI and the API, and within a
stated perplexity budget of float32 on held-out Shakespeare."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.sample.test_replay import prefilled, replay_against_eager

from glassgpt.cli import main
from glassgpt.errors import GlassError
from glassgpt.kernels import dense, extensions, int4, int8, rowwise
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.precision import cast, parse_dtype, quantize_int4
from glassgpt.sample import generate
from glassgpt.sample.replay import ReplayedStep
from glassgpt.tokenizer import CharTokenizer

PROJECTIONS = ("attn.W_QKV", "attn.W_O", "mlp.W_in", "mlp.W_out")


@pytest.fixture
def float_kernel():
    """The int4 kernels' float family, whose product is x W̃ + b to float32 rounding (the
    default family rounds x to int8 per group: tests/kernels/test_int4.py)."""
    ext = int4.compiled()
    if ext is None:
        yield
        return
    for name in ext.kernels():
        if name.startswith("float"):
            try:
                ext.use(name)
                break
            except ValueError:
                pass
    yield
    ext.use(None)


def model_of(**kw: object) -> GPT:
    torch.manual_seed(0)
    cfg = {"n_vocab": 61, "n_ctx": 40, "d_model": 64, "n_layers": 2, "n_heads": 4, **kw}
    model = GPT(GPTConfig(**cfg))  # type: ignore[arg-type]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.1)
    return model.eval()


@pytest.mark.parametrize("mlp", ["gelu_tanh", "swiglu"])
@pytest.mark.parametrize("tie", [True, False])
def test_int4_copy_is_the_model_with_quantized_weights(mlp: str, tie: bool, float_kernel) -> None:
    """Each block projection is exactly W̃ = q·d (int4), the unembedding W̃ = q·s (int8); the
    copy's logits equal a float32 model holding those weights (to float32 rounding)."""
    model = model_of(mlp=mlp, tie_embeddings=tie)
    orig = dict(model.named_parameters())
    q4 = cast(model, "int4")
    params = dict(q4.named_parameters())
    plain = model_of(mlp=mlp, tie_embeddings=tie)
    plain.load_state_dict(q4.state_dict())  # W̃ as plain float32 weights, no kernels
    for name in params:
        if name.split(".", 2)[-1] in PROJECTIONS or name.endswith("mlp.W_gate"):
            q, d = int4.quantize(dense.out_in_view(orig[name]))
            W_t = int4.dequantize(q, d, dense.out_in_view(orig[name]).shape[1])
            assert torch.equal(dense.out_in_view(params[name]), W_t), name
            assert dense.is_packed(params[name]), name
    U = "embed.W_E" if tie else "unembed.W_U"
    q, s = int8.quantize(dense.out_in_view(orig[U], transposed=tie))
    assert torch.equal(dense.out_in_view(params[U], transposed=tie), int8.dequantize(q, s))
    tokens = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        for T in (1, 7):  # the kernels (few rows) and the float32 product (a prompt)
            got, want = q4(tokens[:, :T]), plain(tokens[:, :T])
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_int4_unembedding_is_an_option() -> None:
    model = cast(model_of(tie_embeddings=False), torch.float32)
    assert quantize_int4(model, unembed="int4") == 1 + 2 * 4
    q, d = int4.quantize(dense.out_in_view(model_of(tie_embeddings=False).unembed.W_U))
    assert torch.equal(dense.out_in_view(model.unembed.W_U), int4.dequantize(q, d, 64))


@pytest.mark.skipif(not rowwise.built(), reason="glassgpt's kernels are not built")
def test_int4_steps_replay_bit_for_bit_and_generate_the_same_ids() -> None:
    m = cast(model_of(d_model=32), "int4")
    replay_against_eager(m, batch=2)
    step, _ = ReplayedStep.record(m, prefilled(m, torch.tensor([[1, 2]])), torch.tensor([[3]]))
    assert step is not None, ReplayedStep.why_not
    rows = [[1, 2, 3, 4, 5, 6]]
    opts = {"max_new_tokens": 20, "temperature": 0.0}
    assert generate(m, rows, replay=True, **opts) == generate(m, rows, replay=False, **opts)


def test_a_width_not_a_multiple_of_the_group_is_padded(float_kernel) -> None:
    """d_model 40, d_mlp 72: the last group of each is padded with zero weights."""
    model = model_of(d_model=40, d_mlp=72, n_heads=2)
    q4 = cast(model, "int4")
    plain = model_of(d_model=40, d_mlp=72, n_heads=2)
    plain.load_state_dict(q4.state_dict())
    tokens = torch.tensor([[4, 5, 6]])
    with torch.inference_mode():
        torch.testing.assert_close(q4(tokens), plain(tokens), rtol=1e-4, atol=1e-4)


def test_int4_runs_on_a_cpu_only_and_falls_back_with_a_note(monkeypatch, float_kernel) -> None:
    assert parse_dtype("int4") is torch.quint4x2
    model = model_of()
    if torch.cuda.is_available():
        with pytest.raises(GlassError, match="int4 weights run on a CPU only"):
            cast(model.cuda(), "int4")
    with_ext = cast(model, "int4")
    monkeypatch.setattr(int4, "compiled", lambda: None)
    monkeypatch.setattr(extensions, "_warned", set())
    with pytest.warns(RuntimeWarning, match="int4 kernel glassgpt.kernels._int4 is not built"):
        without = cast(model, "int4")
        with torch.inference_mode():
            got = without(torch.tensor([[1, 2, 3]]))
    with torch.inference_mode():
        torch.testing.assert_close(got, with_ext(torch.tensor([[1, 2, 3]])), rtol=1e-4, atol=1e-4)


def test_sample_and_load_with_dtype_int4(char_run: tuple[Path, GPT, CharTokenizer], capsys) -> None:
    """``glassgpt sample --dtype int4`` and ``glassgpt.load(dtype="int4")``: the greedy ids of
    cast's copy."""
    import glassgpt

    run, model, tok = char_run
    code = main(["sample", "-c", str(run), "-p", "hello", "-m", "20", "-t", "0",
                 "--no-stop-eos", "--dtype", "int4"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    ids = generate(cast(model, "int4"), tok.encode("hello"), max_new_tokens=20, temperature=0)
    assert out == "hello" + tok.decode(ids) + "\n"
    loaded, _ = glassgpt.load(run, dtype="int4")
    assert generate(loaded, tok.encode("hello"), max_new_tokens=20, temperature=0) == ids


def test_serve_int4_serves_the_int4_copy(
    char_run: tuple[Path, GPT, CharTokenizer], monkeypatch
) -> None:
    """``glassgpt serve --dtype int4``: the served model is cast's int4 copy."""
    import sys

    import uvicorn

    run, model, _ = char_run
    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(app))
    monkeypatch.setattr(sys, "setswitchinterval", lambda _: None)
    threads = torch.get_num_threads()
    try:
        assert main(["serve", "--checkpoint", str(run), "--dtype", "int4"]) == 0
    finally:
        torch.set_num_threads(threads)
    got = served[0].state.glassgpt.model
    assert dense.is_packed(got.blocks[0].attn.W_QKV)
    want = generate(cast(model, "int4"), [1, 2, 3], max_new_tokens=10, temperature=0)
    assert generate(got, [1, 2, 3], max_new_tokens=10, temperature=0) == want
