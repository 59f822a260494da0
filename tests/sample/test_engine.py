"""The decoding engine (``glassgpt.sample.engine``): chosen once, by one function, for
``generate``, the CLI and the server's scheduler alike; ``glassgpt.load`` gives the CLI's path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.sample.conftest import CHARS, write_run

import glassgpt
from glassgpt.checkpoint import load as load_as_stored
from glassgpt.errors import ConfigError
from glassgpt.kernels import rowwise
from glassgpt.model import GPT, GPTConfig
from glassgpt.model.precision import cast
from glassgpt.sample import engine, generate, stream
from glassgpt.tokenizer import CharTokenizer

built = pytest.mark.skipif(not rowwise.built(), reason="glassgpt's kernels are not built")


def tiny(**kw: Any) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(n_vocab=len(CHARS) + 1, n_ctx=48, d_model=16, n_layers=2, n_heads=2, **kw)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return write_run(
        tmp_path / "run", tiny(), CharTokenizer(CHARS, special_tokens=["<|endoftext|>"])
    )


@pytest.fixture
def decoders(monkeypatch: pytest.MonkeyPatch) -> list[engine.Decoder]:
    """Every decoder ``generate`` starts, in order."""
    seen: list[engine.Decoder] = []
    start = engine.Decoder.start

    def spy(cls: type, *args: Any, **kw: Any) -> engine.Decoder:
        seen.append(start(*args, **kw))
        return seen[-1]

    monkeypatch.setattr(engine.Decoder, "start", classmethod(spy))
    return seen


def test_choose_names_what_rules_out_the_faster_engines() -> None:
    model = cast(tiny(), "float32")
    assert choose_kind(model, replay=False) == ("eager", "replay is off")
    assert choose_kind(model, padded=True)[0] == "eager"
    assert choose_kind(tiny().double())[0] == "eager"
    with model.hooks({"blocks.0.resid_pre": lambda x, name: None}):
        assert choose_kind(model) == ("eager", "hooks are attached")
    if not rowwise.built():
        assert choose_kind(model) == ("eager", "glassgpt's compiled kernels are not built")
        return
    assert choose_kind(cast(tiny(positional="rope"), "float32"))[0] == "replayed"
    scaled = choose_kind(cast(tiny(embed_scale=2.0), "float32"))  # s · W_E[t] + W_P[n]
    assert scaled[0] == "eager" and "embed_scale" in scaled[1]
    assert choose_kind(tiny().double())[1] == "the model is not float32 on a CPU"
    assert choose_kind(model)[0] == "replayed"
    assert choose_kind(model, padded=True, slots=True)[0] == "replayed"  # rows own lengths


def choose_kind(model: GPT, **kw: Any) -> tuple[str, str]:
    choice = engine.choose(model, **kw)
    return choice.kind, choice.why


@built
def test_load_and_generate_take_the_path_of_glassgpt_sample(
    run: Path, decoders: list[engine.Decoder], capsys: pytest.CaptureFixture[str]
) -> None:
    from glassgpt.cli import main

    assert main(["sample", "-c", str(run), "--prompt", "ab", "--max-new-tokens", "8",
                 "--seed", "3", "--temperature", "0"]) == 0  # fmt: skip
    cli_text = capsys.readouterr().out
    model, tok = glassgpt.load(run)
    ids = generate(model, tok.encode("ab"), tokenizer=tok, max_new_tokens=8, seed=3,
                   temperature=0)  # fmt: skip
    assert [d.kind for d in decoders] == ["replayed", "replayed"]
    assert cli_text.strip() == "ab" + tok.decode(ids).strip()
    # the model as stored (not cast, not packed) cannot be replayed: the path differs
    stored, _ = load_as_stored(run)
    run_ = stream(stored, [1, 2], max_new_tokens=3)
    assert run_.decoder is None and len(list(run_)) == 3  # (chosen at the first token)
    assert run_.decoder is decoders[-1] and decoders[-1].kind == "eager"
    assert "recording failed" in decoders[-1].why


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_load_dtype_means_the_clis_dtype(run: Path, dtype: str, decoders: list) -> None:
    model, _ = glassgpt.load(run, dtype=dtype)
    expected = cast(load_as_stored(run)[0], dtype)
    tokens = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        assert torch.equal(model(tokens), expected(tokens))
    assert next(model.parameters()).dtype == (torch.bfloat16 if dtype == "bf16" else torch.float32)
    generate(model, [1, 2], max_new_tokens=3)
    # int8: float32 activations; bf16: its decoding copy's (here, a small model, float32)
    assert decoders[-1].kind == ("replayed" if rowwise.built() else "eager")
    with pytest.raises(ConfigError, match="'int3'"):
        glassgpt.load(run, dtype="int3")


def test_a_loaded_model_fine_tunes_as_the_plain_one(run: Path) -> None:
    model, _ = glassgpt.load(run)
    plain = load_as_stored(run)[0]
    tokens = torch.randint(
        0, plain.config.n_vocab, (3, 12), generator=torch.Generator().manual_seed(1)
    )
    for m in (model, plain):
        m.train()
        _, loss = m(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name
    with torch.no_grad():  # a step changes the weights: the packed copies go unused
        for p in model.parameters():
            p -= 0.1 * p.grad
        for q in plain.parameters():
            q -= 0.1 * q.grad
    model.eval(), plain.eval()
    one = torch.tensor([[5]])  # one row: the product a packed copy would serve
    with torch.inference_mode():
        assert torch.allclose(model(one), plain(one), atol=1e-5)
    assert generate(model, [1, 2], max_new_tokens=6, seed=4) == generate(
        plain, [1, 2], max_new_tokens=6, seed=4
    )


def test_generate_chooses_once_and_the_scheduler_asks_the_same_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.serve.test_scheduler import served

    calls: list[dict[str, Any]] = []
    choose = engine.choose

    def spy(model: GPT, **kw: Any) -> engine.Choice:
        calls.append(kw)
        return choose(model, **kw)

    monkeypatch.setattr(engine, "choose", spy)
    model = cast(tiny(), "float32")
    generate(model, [1, 2, 3], max_new_tokens=20)
    assert len(calls) == 1 and not calls[0]["padded"]
    generate(model, [[1, 2, 3], [4]], max_new_tokens=5)  # left-padded
    assert len(calls) == 2 and calls[1]["padded"]

    calls.clear()
    outs, scheduler = served(model, CharTokenizer(CHARS), replay=True)
    assert all(outs) and calls and all(kw.get("slots") for kw in calls)
    assert len(calls) == len(scheduler.decoders)  # once per batch size
