"""Replayed decoding steps (glassgpt.sample.replay) against the eager steps they were recorded
from: the same kernels on the same buffers, so the logits must be equal bit for bit, step after
step, as the position moves; and what cannot be replayed is refused and decoded eagerly."""

from __future__ import annotations

import pytest
import torch

from glassgpt.kernels import rowwise
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.gpt import TokenError
from glassgpt.model.precision import cast
from glassgpt.sample.cache import CacheFullError, KVCache
from glassgpt.sample.generation import generate
from glassgpt.sample.replay import ReplayedStep

pytestmark = pytest.mark.skipif(not rowwise.built(), reason="glassgpt's kernels are not built")


def model_of(dtype: str = "float32", **overrides: object) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(**{"n_vocab": 61, "n_ctx": 40, "d_model": 32, "n_layers": 2, "n_heads": 4,
                       **overrides})  # type: ignore[arg-type]  # fmt: skip
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.1)  # biases and norm weights away from 0 and 1
    return cast(model, dtype)


def prefilled(model: GPT, prompt: torch.Tensor, capacity: int | None = None) -> KVCache:
    cache = KVCache.for_model(model, prompt.shape[0], capacity, last_only=True)
    with torch.inference_mode():
        model(prompt, cache=cache)
    return cache


def replay_against_eager(model: GPT, batch: int = 1, steps: int = 12) -> None:
    """Record one step, then ``steps`` more replayed beside eager steps on a second cache."""
    g = torch.Generator().manual_seed(1)
    V = model.config.n_vocab
    prompt = torch.randint(0, V, (batch, 5), generator=g)
    mine, theirs = prefilled(model, prompt), prefilled(model, prompt)
    first = torch.randint(0, V, (batch, 1), generator=g)
    step, logits = ReplayedStep.record(model, mine, first)
    assert step is not None, ReplayedStep.why_not
    del logits  # the recording must keep its own buffers alive
    with torch.inference_mode():
        model(first, cache=theirs)
        for _ in range(steps):
            # memory freed since the recording gets reused: a buffer the recording did not
            # keep would now hold these values
            litter = [torch.full((n,), 7.0) for n in (32, 128, 61, 96, 3 * 32) * 4]
            tokens = torch.randint(0, V, (batch, 1), generator=g)
            assert torch.equal(step(tokens), model(tokens, cache=theirs))
            assert all(bool((t == 7.0).all()) for t in litter)
    assert mine.length == theirs.length == 6 + steps
    for a, b in zip(mine.layers, theirs.layers):
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # GPT-2's choices: learned positions, layer norm, biases, tanh GELU, tied W_U
        {"positional": "sinusoidal", "norm": "rmsnorm", "bias": False, "tie_embeddings": False},
        {"positional": "none", "norm_placement": "post", "mlp": "gelu"},
        {"n_heads": 2, "d_mlp": 40},
    ],
    ids=["gpt2", "sinusoidal-rms-nobias-untied", "none-post-erf", "wide-heads"],
)
def test_replayed_steps_equal_eager_steps_bit_for_bit(overrides: dict[str, object]) -> None:
    replay_against_eager(model_of(**overrides))


def test_a_batch_and_int8_weights_replay_bit_for_bit() -> None:
    replay_against_eager(model_of(), batch=3)
    replay_against_eager(model_of("int8"), batch=2)


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (lambda: model_of(embed_scale=2.0), "embed_scale"),  # s · W_E[t] + W_P[n]
        (lambda: model_of(mlp="relu"), "aten.relu"),
        (
            lambda: GPT(GPTConfig(n_vocab=61, n_ctx=40, d_model=32, n_layers=2, n_heads=4)).eval(),
            "aten.",
        ),  # not cast: its products are PyTorch's
    ],
    ids=["scaled-embedding", "relu", "uncast"],
)
def test_what_cannot_be_replayed_is_refused_with_its_reason_and_decoded_eagerly(
    model: object, why: str
) -> None:
    m = model()  # type: ignore[operator]
    prompt = torch.tensor([[3, 1, 4]])
    mine, theirs = prefilled(m, prompt), prefilled(m, prompt)
    step, logits = ReplayedStep.record(m, mine, torch.tensor([[5]]))
    assert step is None and why in str(ReplayedStep.why_not)
    with torch.inference_mode():
        torch.testing.assert_close(logits, m(torch.tensor([[5]]), cache=theirs), rtol=0, atol=0)


def test_hooks_and_padding_are_refused() -> None:
    m = model_of()
    with m.hooks({"blocks.0.resid_pre": lambda t, name: None}):
        step, _ = ReplayedStep.record(m, prefilled(m, torch.tensor([[1, 2]])), torch.tensor([[3]]))
    assert step is None and "hooks" in str(ReplayedStep.why_not)
    padded = KVCache.for_model(m, 2, pad=[1, 0], last_only=True)
    with torch.inference_mode():
        m(torch.tensor([[0, 1], [2, 3]]), cache=padded)
    step, _ = ReplayedStep.record(m, padded, torch.tensor([[4], [5]]))
    assert step is None and "padded" in str(ReplayedStep.why_not)


def test_a_full_cache_and_bad_ids_raise_without_writing() -> None:
    m = model_of()
    cache = prefilled(m, torch.tensor([[1, 2, 3]]), capacity=5)
    step, _ = ReplayedStep.record(m, cache, torch.tensor([[4]]))
    assert step is not None
    with pytest.raises(TokenError, match="out of range"):
        step(torch.tensor([[61]]))
    with pytest.raises(TokenError, match="takes"):
        step(torch.tensor([[1], [2]]))
    with pytest.raises(TokenError, match="integer ids"):
        step(torch.tensor([[1.0]]))
    assert cache.length == 4
    step(torch.tensor([[7]]))
    with pytest.raises(CacheFullError):
        step(torch.tensor([[8]]))


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_generate_gives_the_same_ids_with_and_without_replay(dtype: str) -> None:
    m = model_of(dtype)
    rows = [[1, 2, 3, 4, 5, 6]]
    opts = {"max_new_tokens": 60, "temperature": 0.0}  # past n_ctx = 40: the window slides
    with pytest.warns(UserWarning, match="sliding"):
        replayed = generate(m, rows, replay=True, **opts)
    with pytest.warns(UserWarning, match="sliding"):
        eager = generate(m, rows, replay=False, **opts)
    assert replayed == eager
    sampled = {"max_new_tokens": 20, "temperature": 0.9, "top_k": 20, "seed": 3}
    two = [[1, 2, 3], [4, 5, 6]]  # one length: no padding, so the batch replays too
    assert generate(m, two, replay=True, **sampled) == generate(m, two, replay=False, **sampled)


def test_another_threads_kernel_calls_during_a_recording_are_not_recorded() -> None:
    import threading

    m, other = model_of(), model_of(n_layers=3)
    prompt = torch.tensor([[2, 7, 1, 8]])
    clean, _ = ReplayedStep.record(m, prefilled(m, prompt), torch.tensor([[5]]))
    other_cache = prefilled(other, prompt)

    def eager_elsewhere(_module: object, _args: object) -> None:  # mid-recording
        def run() -> None:
            with torch.inference_mode():
                other(torch.tensor([[3]]), cache=other_cache)

        t = threading.Thread(target=run)
        t.start()
        t.join()

    mine = prefilled(m, prompt)
    hook = m.blocks[1].register_forward_pre_hook(eager_elsewhere)
    try:
        step, _ = ReplayedStep.record(m, mine, torch.tensor([[5]]))
    finally:
        hook.remove()
    assert clean is not None and step is not None and other_cache.length == 5
    assert len(step.calls) == len(clean.calls)
    theirs = prefilled(m, prompt)
    with torch.inference_mode():
        m(torch.tensor([[5]]), cache=theirs)
        for t in (9, 4, 6):
            assert torch.equal(step(torch.tensor([[t]])), m(torch.tensor([[t]]), cache=theirs))


def test_bf16_keys_kept_in_a_float32_cache_give_the_same_logits() -> None:
    """On a CPU without bf16 arithmetic a bf16 model's cache is float32 (its attention reads
    float32 copies): the bf16 keys and values are held exactly, so every step's logits equal
    those over a bf16 cache, bit for bit; the explicit attention path reads them too."""
    from glassgpt.kernels import bf16

    m = model_of("bf16")
    p = torch.tensor([[3, 1, 4, 1, 5]])
    ours = KVCache.for_model(m, 1, last_only=True)
    assert ours.layers[0].k.dtype == bf16.cache_dtype(torch.bfloat16)
    theirs = KVCache(m.config, 1, dtype=torch.bfloat16, last_only=True)
    with torch.inference_mode():
        assert torch.equal(m(p, cache=ours), m(p, cache=theirs))
        for t in (9, 2, 6, 5):
            assert torch.equal(
                m(torch.tensor([[t]]), cache=ours), m(torch.tensor([[t]]), cache=theirs)
            )
        m.attn_impl = "explicit"
        explicit = m(torch.tensor([[3]]), cache=ours)
        m.attn_impl = "auto"
        assert explicit.dtype == torch.bfloat16 and bool(torch.isfinite(explicit).all())


def test_a_list_of_ids_and_the_steps_own_greedy_pick_match_tensors_and_next_token() -> None:
    """A step from a list of ids equals the step from the same ids as a tensor, bit for bit;
    ``greedy(n)`` is the argmax of each row's first n logits (next_token at temperature 0);
    bad lists raise TokenError, and a NaN logit leaves the pick to next_token (None)."""
    m = model_of()
    prompt = torch.tensor([[3, 1, 4], [1, 5, 9]])
    mine, theirs = prefilled(m, prompt), prefilled(m, prompt)
    step, _ = ReplayedStep.record(m, mine, torch.tensor([[2], [6]]))
    assert step is not None, ReplayedStep.why_not
    with torch.inference_mode():
        m(torch.tensor([[2], [6]]), cache=theirs)
        for ids in ([5, 3], [0, 60], [7, 7]):
            ours = step(ids)
            assert torch.equal(ours, m(torch.tensor(ids)[:, None], cache=theirs))
            for n in (61, 40, 1):
                want = ours[:, -1, :n].max(-1).indices.tolist()
                assert step.greedy(n) == want
    for bad in ([1], [1, 2, 3], [2**70, 1], ["a", 1]):
        with pytest.raises(TokenError):
            step(bad)
    with pytest.raises(TokenError, match="out of range"):
        step([61, 0])
    with torch.inference_mode():
        step.logits[1, -1, 9] = float("nan")
    assert step.greedy(61) is None and step.greedy(9) is not None


def test_a_first_decoding_does_not_import_dynamo(imports_after) -> None:
    """A process's first recorded step costs no import of torch._dynamo (about 1 s: the
    dispatch mode's default wrapper imports it at the mode's first operation)."""
    code = (
        "from glassgpt.model import GPT, GPTConfig\n"
        "from glassgpt.sample.generation import generate\n"
        "from glassgpt.model.precision import cast\n"
        "from glassgpt.sample.replay import ReplayedStep\n"
        "m = cast(GPT(GPTConfig(n_vocab=61, n_ctx=40, d_model=32, n_layers=2, n_heads=4)),"
        " 'float32')\n"
        "generate(m, [1, 2, 3], max_new_tokens=5, temperature=0)\n"
        "assert ReplayedStep.why_not is None, ReplayedStep.why_not\n"
    )
    assert imports_after(code, ["torch._dynamo"]) == []
