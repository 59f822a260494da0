"""generate / stream: greedy equals transformers', seeds reproduce, stops cut exactly,
batches equal rows alone, the context policy, bad input."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from glassgpt.errors import ConfigError, GlassError
from glassgpt.model import GPT, GPTConfig
from glassgpt.sample import generate, stream
from glassgpt.sample.filters import SamplingConfig, probabilities
from glassgpt.sample.generation import ContextOverflowError, ContextWarning
from glassgpt.tokenizer import CharTokenizer

transformers = pytest.importorskip("transformers")


def hf_gpt2(seed: int = 0, **kw: object) -> object:
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        vocab_size=97, n_positions=48, n_embd=32, n_layer=2, n_head=4, initializer_range=0.3,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **kw,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg).eval()


def tiny(positional: str = "learned", n_ctx: int = 32, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(n_vocab=29, n_ctx=n_ctx, d_model=16, n_layers=2, n_heads=2,
                    positional=positional)  # fmt: skip
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.4)
    return model


def test_greedy_equals_transformers_greedy_generate() -> None:
    from glassgpt.interop import from_hf

    hf = hf_gpt2()
    ours = from_hf(hf)
    prompts = [[5, 17, 3, 88, 41], [60, 2], [9, 9, 9, 70, 1, 33, 12]]
    for p in prompts:
        want = hf.generate(
            torch.tensor([p]), max_new_tokens=30, do_sample=False, pad_token_id=0,
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
        )[0, len(p):].tolist()  # fmt: skip
        assert generate(ours, p, max_new_tokens=30, temperature=0) == want
    # a left-padded batch in transformers (positions from the attention mask) equals ours
    T = max(map(len, prompts))
    ids = torch.tensor([[0] * (T - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts])
    want = hf.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False,
                       pad_token_id=0)[:, T:].tolist()  # fmt: skip
    assert generate(ours, prompts, max_new_tokens=30, temperature=0) == want


@pytest.mark.parametrize("positional", ["learned", "sinusoidal", "rope", "none"])
def test_batched_generation_equals_one_by_one(positional: str) -> None:
    model = tiny(positional)
    prompts = [[1, 2, 3, 4, 5, 6], [7], [8, 9, 10], []]
    opts = {"max_new_tokens": 12, "temperature": 0.9, "top_p": 0.95}
    batched = generate(model, prompts, seed=[11, 12, 13, 14], **opts)
    alone = [generate(model, p, seed=s, **opts) for p, s in zip(prompts, [11, 12, 13, 14])]
    assert batched == alone
    greedy = generate(model, prompts, max_new_tokens=12, temperature=0)
    assert greedy == [generate(model, p, max_new_tokens=12, temperature=0) for p in prompts]


def test_same_seed_same_tokens_and_different_seed_differs() -> None:
    model = tiny()
    a = generate(model, [1, 2], max_new_tokens=30, seed=7)
    assert a == generate(model, [1, 2], max_new_tokens=30, seed=7)
    assert a != generate(model, [1, 2], max_new_tokens=30, seed=8)
    torch.manual_seed(3)  # without a seed, torch's global RNG decides
    b = generate(model, [1, 2], max_new_tokens=30)
    torch.manual_seed(3)
    assert b == generate(model, [1, 2], max_new_tokens=30)


def test_stream_yields_what_generate_returns() -> None:
    model = tiny()
    assert list(stream(model, [4, 5], max_new_tokens=15, seed=2)) == generate(
        model, [4, 5], max_new_tokens=15, seed=2
    )
    pairs = list(stream(model, [[4, 5], [6]], max_new_tokens=5, seed=2))
    assert [b for b, _ in pairs] == [0, 1] * 5


def test_first_token_distribution_through_the_whole_path() -> None:
    """4,000 rows of one prompt, one token each: chi-square against the model's own
    filtered softmax, computed by a plain forward pass."""
    model = tiny()
    prompt, N = [3, 1, 4, 1, 5], 4000
    cfg = SamplingConfig(temperature=1.4, top_k=12, top_p=0.9)
    with torch.no_grad():
        want = probabilities(model(torch.tensor([prompt]))[:, -1], cfg)[0].double().numpy()
    out = generate(model, [prompt] * N, max_new_tokens=1, seed=list(range(N)),
                   temperature=1.4, top_k=12, top_p=0.9)  # fmt: skip
    observed = np.bincount([r[0] for r in out], minlength=len(want))
    assert observed[want == 0].sum() == 0
    live = want > 0
    assert stats.chisquare(observed[live], N * want[live] / want[live].sum()).pvalue > 1e-3


def test_stop_strings_end_generation_exactly() -> None:
    tok = CharTokenizer(sorted(set("abcde \n")))
    torch.manual_seed(1)
    model = GPT(GPTConfig(n_vocab=tok.n_vocab, n_ctx=64, d_model=16, n_layers=1, n_heads=2))
    full = tok.decode(generate(model, tok.encode("ab"), max_new_tokens=60, seed=4))
    checked = 0
    for stop in {full[i : i + n] for i in range(5, 40, 7) for n in (1, 2, 3)}:
        cut = full.find(stop)
        got = generate(model, tok.encode("ab"), tokenizer=tok, max_new_tokens=60, seed=4,
                       stop=[stop, "never there"])  # fmt: skip
        assert tok.decode(got) == full[:cut], stop
        streamed = list(stream(model, tok.encode("ab"), tokenizer=tok, max_new_tokens=60,
                               seed=4, stop=[stop]))  # fmt: skip
        assert streamed == got
        checked += 1
    assert checked >= 5
    # a stop string that never occurs changes nothing
    same = generate(model, tok.encode("ab"), tokenizer=tok, max_new_tokens=60, seed=4,
                    stop=["zzz" if "z" in tok.chars else "\x00\x01"])  # fmt: skip
    assert tok.decode(same) == full


def test_stop_string_inside_a_bpe_token_cuts_the_text_exactly() -> None:
    from glassgpt.tokenizer import Tokenizer

    text = "the cat sat on the mat. the cat ate. " * 20
    tok = Tokenizer.train([text], vocab_size=300, pattern=None)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=tok.n_vocab, n_ctx=64, d_model=16, n_layers=1, n_heads=2))
    ids = generate(model, tok.encode("the"), max_new_tokens=40, seed=9)
    full = tok.decode_bytes(ids)
    long_pieces = [(i, t) for i, t in enumerate(ids) if len(tok.decode_bytes([t])) >= 3]
    assert long_pieces, "the model should sample some multi-byte tokens"
    i, _t = long_pieces[0]
    start = len(tok.decode_bytes(ids[:i]))
    stop = full[start + 1 : start + 3].decode()  # begins inside token t
    got = generate(model, tok.encode("the"), tokenizer=tok, max_new_tokens=40, seed=9, stop=[stop])
    assert tok.decode_bytes(got) == full[: full.find(stop.encode())]


def test_stop_ids_end_a_row_and_are_not_emitted() -> None:
    model = tiny()
    free = generate(model, [1, 2, 3], max_new_tokens=30, seed=1)
    stop_at = free[10]
    got = generate(model, [1, 2, 3], max_new_tokens=30, seed=1, stop_ids=[stop_at])
    assert got == free[: free.index(stop_at)]


def test_empty_prompt_starts_from_endoftext_or_id_zero() -> None:
    model = tiny()
    assert generate(model, [], max_new_tokens=6, temperature=0) == generate(
        model, [0], max_new_tokens=6, temperature=0
    )
    tok = CharTokenizer(list("abcdefghijklmnopqrstuvwxyz"), special_tokens=["<|endoftext|>"])
    eot = tok.special_tokens["<|endoftext|>"]
    model = GPT(tiny().config.replace(n_vocab=tok.n_vocab)).eval()
    assert generate(model, [], tokenizer=tok, max_new_tokens=6, temperature=0) == generate(
        model, [eot], max_new_tokens=6, temperature=0
    )


@pytest.mark.parametrize("positional", ["learned", "rope"])
@pytest.mark.parametrize("window", [10, 7])
def test_sliding_window_equals_recomputing_the_window(positional: str, window: int) -> None:
    """Past n_ctx, the last ``window`` tokens are re-encoded and the cache grows again to
    n_ctx; with window = n_ctx that is nanoGPT's crop. Checked by full forward passes."""
    model = tiny(positional, n_ctx=10)
    prompt = [1, 2, 3, 4, 5, 6, 7]
    with pytest.warns(ContextWarning, match="n_ctx=10"):
        got = generate(model, prompt, max_new_tokens=15, temperature=0, window=window)
    seq, seen = list(prompt), list(prompt)  # seen: the tokens the model conditions on
    with torch.no_grad():
        for _ in range(15):
            seq.append(int(model(torch.tensor([seen]))[0, -1].argmax()))
            seen = [*seen, seq[-1]] if len(seen) < 10 else seq[-window:]
            if window == 10:  # nanoGPT's crop: always the last n_ctx tokens
                assert seen == seq[-10:]
    assert got == seq[len(prompt) :]
    with pytest.raises(ContextOverflowError):
        generate(model, prompt, max_new_tokens=15, temperature=0, overflow="error")


def test_prompt_longer_than_the_context() -> None:
    model = tiny(n_ctx=10)
    with pytest.raises(ContextOverflowError, match=r"12 tokens is longer than .* n_ctx=10"):
        generate(model, list(range(12)), max_new_tokens=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = generate(model, list(range(12)), max_new_tokens=3, temperature=0,
                       overflow="truncate", window=6)  # fmt: skip
    assert any(issubclass(w.category, ContextWarning) for w in caught)
    assert got[0] == generate(model, list(range(6, 12)), max_new_tokens=1, temperature=0)[0]


def test_padded_vocabulary_ids_are_never_sampled() -> None:
    tok = CharTokenizer(list("abc"))
    model = tiny()  # n_vocab=29 > 3
    out = generate(model, [0, 1], tokenizer=tok, max_new_tokens=30, temperature=20.0, seed=0)
    assert set(out) <= {0, 1, 2}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": -1}, "^temperature: "),
        ({"top_p": 1.5}, "^top_p: "),
        ({"top_p": 0}, "^top_p: "),
        ({"top_k": 0}, "^top_k: "),
        ({"max_new_tokens": -1}, "^max_new_tokens: "),
        ({"stop": "x"}, "^stop: "),
        ({"seed": [1, 2]}, "^seed: got 2 seeds for 1 prompts"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_options_raise_at_the_call(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        stream(tiny(), [1], **options)


def test_bad_tokens_raise_naming_the_id() -> None:
    with pytest.raises(GlassError, match="token id 29 is out of range"):
        generate(tiny(), [1, 29])
    with pytest.raises(GlassError, match="stop strings need a tokenizer"):
        generate(tiny(), [1], stop=["a"])
    with pytest.raises(GlassError, match="integer ids"):
        generate(tiny(), torch.tensor([1.0, 2.0]))
