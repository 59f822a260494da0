"""Inference copies: bf16 weights and compute, packed kernels, and the perplexity they cost."""

from __future__ import annotations

import pytest
import torch

from glassgpt import kernels
from glassgpt.errors import ConfigError, GlassError
from glassgpt.kernels import dense, extensions
from glassgpt.kernels.dense import out_in_view
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.precision import attach_kernels, cast, parse_dtype, perplexity
from glassgpt.sample import generate
from glassgpt.sample.quality import decoded_perplexity


def model_of(**kw: object) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=101, n_ctx=32, d_model=64, n_layers=2, n_heads=4, **kw)
    return GPT(cfg).eval()


def logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(tokens).float()


TOKENS = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("mlp", ["gelu_tanh", "swiglu"])
@pytest.mark.parametrize("tie", [True, False])
def test_bf16_copy_is_close_and_leaves_the_original(mlp: str, tie: bool) -> None:
    model = model_of(mlp=mlp, tie_embeddings=tie)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bf = cast(model, "bf16")
    assert next(bf.parameters()).dtype == torch.bfloat16
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    ref, got = logits(model, TOKENS), logits(bf, TOKENS)
    scale = ref.abs().max().item()
    assert (got - ref).abs().max().item() <= 0.05 * scale  # bf16: 8-bit mantissa
    plain = logits(cast(model, "bf16", pack=False), TOKENS)
    assert (got - plain).abs().max().item() <= 0.02 * scale  # kernels: same products


@pytest.mark.parametrize("tie", [True, False])
def test_float32_copy_with_kernels_equals_the_model(tie: bool) -> None:
    model = model_of(tie_embeddings=tie)
    fast = cast(model, torch.float32)
    assert attach_kernels(fast) >= 1
    torch.testing.assert_close(logits(fast, TOKENS), logits(model, TOKENS), rtol=1e-5, atol=1e-5)
    assert generate(fast, [1, 2, 3], max_new_tokens=8, temperature=0) == generate(
        model, [1, 2, 3], max_new_tokens=8, temperature=0
    )


@pytest.mark.parametrize("mlp", ["gelu_tanh", "swiglu"])
def test_float32_decoding_steps_on_the_small_batch_kernel_equal_the_model(mlp: str) -> None:
    if not kernels.has_small_batch_kernel():
        pytest.skip("glassgpt's small-batch kernel is not built (no C compiler at install)")
    from glassgpt.sample.cache import KVCache

    model = model_of(mlp=mlp, tie_embeddings=True)
    fast = cast(model, "float32")
    per_block = 5 if mlp == "swiglu" else 4  # W_QKV, W_O, W_in, (W_gate,) W_out
    assert attach_kernels(fast) == 1 + per_block * model.config.n_layers
    tokens = TOKENS[:, :12].repeat(2, 1)[:3]  # a batch of 3: every step is 3 rows of x
    cache = KVCache.for_model(fast, batch_size=3, last_only=True)
    with torch.inference_mode():
        fast(tokens[:, :4], cache=cache)  # prefill, 12 rows: F.linear
        for t in range(4, 12):  # one token a step: the kernel
            step = fast(tokens[:, t : t + 1], cache=cache)[:, -1]
            whole = model(tokens[:, : t + 1])[:, -1]
            torch.testing.assert_close(step, whole, rtol=1e-5, atol=2e-5)


def _spy(monkeypatch, names: dict[int, str], calls: list[str]) -> None:
    """Record the name of every weight whose product runs on its packed copy."""
    real = dense._packed

    def packed(x: torch.Tensor, W: torch.Tensor, transposed: bool):
        fn = real(x, W, transposed)
        if fn is None:
            return None
        return lambda x, W_, b: (calls.append(names.get(id(W), "?")), fn(x, W_, b))[1]

    monkeypatch.setattr(dense, "_packed", packed)


def test_kernels_are_used_and_dropped_when_a_weight_changes(monkeypatch) -> None:
    model = cast(model_of(), "bf16")
    W = model.blocks[0].mlp.W_in
    if not kernels.is_packed(W):
        pytest.skip("this CPU has no oneDNN bf16 packed kernels (they need AVX-512 BW/VL/DQ)")
    calls: list[str] = []
    _spy(monkeypatch, {id(W): "W_in"}, calls)
    logits(model, TOKENS)
    assert calls.count("W_in") == 1
    with torch.no_grad():
        W.mul_(0.5)  # in place: the packed copy is now stale and must not be used
    got = logits(model, TOKENS)
    assert calls.count("W_in") == 1 and not kernels.is_packed(W)
    fresh = cast(model_of(), "bf16", pack=False)
    with torch.no_grad():
        fresh.blocks[0].mlp.W_in.mul_(0.5)
    scale = got.abs().max().item()
    assert (got - logits(fresh, TOKENS)).abs().max().item() <= 0.02 * scale
    n = len(calls)
    with torch.enable_grad():  # training never uses a packed copy
        model(TOKENS)
    assert len(calls) == n


def test_parse_dtype() -> None:
    assert parse_dtype("bf16") is torch.bfloat16 and parse_dtype("float32") is torch.float32
    with pytest.raises(ConfigError, match=r"^dtype: unknown dtype 'int3'"):
        parse_dtype("int3")


@pytest.fixture(scope="module")
def trained_char(shakespeare_text: str) -> tuple[GPT, torch.Tensor]:
    """A small char model trained briefly on tinyshakespeare, and 8,000 held-out ids."""
    from glassgpt.tokenizer import CharTokenizer

    tok = CharTokenizer.train([shakespeare_text])
    ids = torch.tensor(tok.encode(shakespeare_text), dtype=torch.long)
    split = int(0.9 * len(ids))
    train, val = ids[:split], ids[split : split + 8_000]
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=tok.n_vocab, n_ctx=64, d_model=64, n_layers=2, n_heads=4))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        starts = torch.randint(0, len(train) - 65, (12,), generator=g)
        x = torch.stack([train[s : s + 64] for s in starts])
        y = torch.stack([train[s + 1 : s + 65] for s in starts])
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), val


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bf16", "int8", "int4"])
def test_perplexity_on_tinyshakespeare_is_within_one_percent(trained_char, dtype: str) -> None:
    """bf16 weights and compute, int8 weights, or int4 weights (groups of 32, an int8
    unembedding) change the validation perplexity of a small trained char model by well under
    1% (float32 is the reference)."""
    model, val = trained_char
    p32 = perplexity(model, val)
    p_low = perplexity(cast(model, dtype), val)
    assert p32 < 25.0  # trained: far below the 65-way uniform
    assert abs(p_low - p32) / p32 < 0.01, (p32, p_low)


@pytest.mark.slow
def test_int4_decoding_perplexity_is_within_budget(trained_char) -> None:
    """Decoding on the int4 kernels, which round x to int8 per group of 32 (the default
    family), costs the held-out perplexity under 1% of float32's, and the rounding of x adds
    under 0.2% to what the float kernels (x unrounded) give."""
    from glassgpt.kernels import int4

    ext = int4.compiled()
    if ext is None:
        pytest.skip("the _int4 extension is not built")
    model, val = trained_char
    val = val[: 16 * 64 + 1]  # 16 windows: 128 steps of 8 rows a perplexity
    p32 = decoded_perplexity(model, val)
    assert abs(p32 - perplexity(model, val)) / p32 < 1e-4  # the helper is the perplexity
    q4 = cast(model, "int4")
    assert not ext.kernel().startswith("float")
    p4 = decoded_perplexity(q4, val)
    try:
        ext.use(next(k for k in ext.kernels() if k.startswith("float")))
        p4_float = decoded_perplexity(q4, val)
    finally:
        ext.use(None)
    print(
        f"held-out perplexity, decoded: float32 {p32:.4f}, int4 {p4:.4f}, int4 float x {p4_float:.4f}"
    )
    assert abs(p4 - p32) / p32 < 0.01, (p32, p4)
    assert abs(p4 - p4_float) / p4_float < 0.002, (p4_float, p4)
    assert p4 != p4_float  # the rounding of x is there


def test_every_bf16_projection_runs_on_its_packed_kernel(monkeypatch) -> None:
    """Prefill and decoding steps of a bf16 model run on its decoding copy, whose
    projections are the model's own bf16 weights on their packed products (the tied
    unembedding: the copy's float32 W_E, aliased to the bf16 W_E's panels)."""
    from glassgpt.model import precision
    from glassgpt.sample import engine

    monkeypatch.setattr(precision, "BF16_MIN_WEIGHTS", 0)  # (a tiny model: bf16 all the same)
    model = cast(model_of(), "bf16")
    if attach_kernels(model) == 0:
        pytest.skip("no bf16 packed kernels on this machine")
    twin, what = precision.decoding_copy(model)
    assert what == "bf16 weights with float32 activations"
    assert twin.blocks[0].attn.W_QKV is model.blocks[0].attn.W_QKV  # shared, not copied
    assert twin.embed.W_E.dtype == torch.float32
    calls: list[str] = []
    names = {id(p): name for name, p in model.named_parameters()}
    monkeypatch.setattr(engine, "decoding_copy", lambda m: (twin, what))
    names[id(twin.embed.W_E)] = "embed.W_E"
    _spy(monkeypatch, names, calls)
    generate(model, [1, 2, 3], max_new_tokens=3, temperature=0)
    per_step = {"embed.W_E"} | {
        f"blocks.{i}.{m}"
        for i in range(2)
        for m in ("attn.W_QKV", "attn.W_O", "mlp.W_in", "mlp.W_out")
    }
    assert set(calls) == per_step
    # the prefill and the recorded step; the next one replays the recorded kernel calls
    assert len(calls) == 2 * len(per_step)


@pytest.mark.parametrize("mlp", ["gelu_tanh", "swiglu"])
@pytest.mark.parametrize("tie", [True, False])
def test_int8_copy_is_the_model_with_quantized_weights(mlp: str, tie: bool) -> None:
    """The int8 copy computes the GPT function with W̃ = q·s: equal (to the kernel's rounding of
    x to 16 bits) to a float32 model holding W̃, within a few percent of the float32 model's logits, and every
    projection (the unembedding too) runs on its int8 product."""
    from glassgpt.kernels import int8

    model = model_of(mlp=mlp, tie_embeddings=tie)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q8 = cast(model, "int8")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert next(q8.parameters()).dtype == torch.float32
    names = [
        n for n, p in q8.named_parameters() if kernels.is_packed(p, transposed=n == "embed.W_E")
    ]
    want = {f"blocks.{i}.{m}" for i in range(2) for m in ("attn.W_QKV", "attn.W_O", "mlp.W_in",
            "mlp.W_out", *(("mlp.W_gate",) if mlp == "swiglu" else ()))}  # fmt: skip
    assert set(names) == want | {"embed.W_E" if tie else "unembed.W_U"}
    orig, params = dict(model.named_parameters()), dict(q8.named_parameters())
    for name in names:  # each quantized weight is q·s of the original's, per output channel
        t = name == "embed.W_E"
        q, s = int8.quantize(out_in_view(orig[name], transposed=t))
        assert torch.equal(out_in_view(params[name], transposed=t), int8.dequantize(q, s))
    tilde = cast(q8, "float32")  # a plain float32 model holding W̃ (float32 kernels)
    ref, got, eager = (
        logits(model, TOKENS[:1, :5]),
        logits(q8, TOKENS[:1, :5]),
        logits(tilde, TOKENS[:1, :5]),
    )
    # to 1e-4 of their scale: the kernel rounds each row of x to 16 bits (2^-16 of its largest)
    torch.testing.assert_close(got, eager, rtol=0, atol=1e-4 * eager.abs().max().item())
    scale = ref.abs().max().item()
    assert (got - ref).abs().max().item() <= 0.05 * scale  # 8-bit weights, per-channel scales
    assert generate(q8, [1, 2, 3], max_new_tokens=8, temperature=0) == generate(
        tilde, [1, 2, 3], max_new_tokens=8, temperature=0
    )


def test_int8_runs_on_a_cpu_only() -> None:
    model = model_of()
    assert parse_dtype("int8") is torch.int8
    if not torch.cuda.is_available():
        pytest.skip("no GPU here")
    with pytest.raises(GlassError, match="int8 weights run on a CPU only"):
        cast(model.cuda(), "int8")


def test_int8_without_the_extension_is_the_same_function(monkeypatch) -> None:
    """With the compiled kernel hidden, the int8 copy computes x W̃ + b in float32 (a warning
    says so once) and gives the kernel's logits to 1e-4 of their scale (the kernel rounds
    each row of x to 16 bits)."""
    from glassgpt.kernels import int8

    model = model_of()
    with_ext = logits(cast(model, "int8"), TOKENS[:1, :4])
    monkeypatch.setattr(int8, "compiled", lambda: None)
    monkeypatch.setattr(extensions, "_warned", set())
    with pytest.warns(RuntimeWarning, match="int8 kernel glassgpt.kernels._int8 is not built"):
        without = logits(cast(model, "int8"), TOKENS[:1, :4])
    torch.testing.assert_close(without, with_ext, rtol=0, atol=1e-4 * with_ext.abs().max().item())
