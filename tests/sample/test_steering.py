"""Steering vectors: x_l ← x_l + α v checked against the NumPy reference model with shifted
weights, against recomputing the whole sequence each step, and through ``glassgpt sample``
and ``glassgpt steer``; bad input gives one line and exit status 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from glassgpt.cli import main
from glassgpt.errors import ConfigError, GlassError
from glassgpt.model import GPT, GPTConfig, reference
from glassgpt.sample import generate
from glassgpt.sample.steering import (
    Steer,
    canonical_hook,
    contrastive_vector,
    load_vector,
    parse_steer,
    save_vector,
    steered,
    steering_hooks,
)
from glassgpt.tokenizer import CharTokenizer

Run = tuple[Path, GPT, CharTokenizer]
TINY = dict(n_vocab=11, n_ctx=16, d_model=12, n_layers=2, n_heads=3, d_mlp=16)


def random_model(seed: int = 0, dtype: torch.dtype = torch.float64, **overrides) -> GPT:
    """A GPT in eval mode with O(1) random parameters (biases and norm weights too)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **overrides})).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(dtype)
            p.copy_((1.0 if name.endswith(".w") else 0.0) + 0.4 * noise)
    return model.eval()


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# -- the steered function -----------------------------------------------------------------
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_steered_logits_equal_the_reference_model_with_shifted_weights(placement: str) -> None:
    """Adding a constant at every position is a bias: steering resid_pre of block 0 by α v is
    W_P + α v; attn_out by α v is b_O + α v; mlp_out by α v + β w is b_out + α v + β w;
    mlp.post by α u is b_out + α u W_out; attn.z by α Z is b_O + α Σ_h Z_h W_O[h]."""
    model = random_model(norm_placement=placement)
    cfg = model.config
    d, dm, H, dh = cfg.d_model, cfg.d_mlp, cfg.n_heads, cfg.d_head
    v0, v1, v2, v3 = (randn(d, seed=s) for s in (1, 2, 3, 4))
    u, Z = randn(dm, seed=5), randn(H * dh, seed=6)
    steers = [
        Steer("blocks.0.resid_pre", v0, 1.5),
        Steer("blocks.1.hook_attn_out", v1, -0.7),  # TransformerLens's spelling
        Steer("blocks.1.mlp_out", v2, 2.0),
        Steer("blocks.1.mlp_out", v3, 0.25),  # two at one activation add up
        Steer("blocks.0.mlp.post", u, 0.8),
        Steer("blocks.0.attn.z", Z, -1.2),  # [H·d_head], read as [H, d_head]
    ]
    w = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    w["pos_embed.W_P"] += 1.5 * v0.numpy()
    w["blocks.1.attn.b_O"] += -0.7 * v1.numpy()
    w["blocks.1.mlp.b_out"] += 2.0 * v2.numpy() + 0.25 * v3.numpy()
    w["blocks.0.mlp.b_out"] += 0.8 * u.numpy() @ w["blocks.0.mlp.W_out"]
    Zh = Z.numpy().reshape(H, dh)
    w["blocks.0.attn.b_O"] += -1.2 * sum(Zh[h] @ w["blocks.0.attn.W_O"][h] for h in range(H))
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6], [0, 10, 2, 7, 7, 1, 8, 2]])
    with steered(model, steers):
        got = model(tokens).detach().numpy()
    want = reference.forward(cfg, w, tokens.numpy())
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)
    plain = model(tokens).detach().numpy()  # the hooks are gone after the block
    assert np.abs(plain - want).max() > 0.1
    assert not model._hook_fns


def test_alpha_zero_gives_bit_identical_logits_and_samples() -> None:
    """α = 0 adds a zero vector: the logits bit for bit, and the greedy ids of the fast
    decoding path (the CPU's replayed step) from the hooked, eager one."""
    model = random_model(dtype=torch.float32)
    v = randn(12, seed=3).float() * 10
    zero = [Steer("blocks.1.resid_post", v, 0.0), Steer("embed", v, 0.0)]
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with steered(model, zero):
        hooked = model(tokens)
    assert torch.equal(hooked, model(tokens))
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6]]
    for prompt in prompts:
        plain = generate(model, prompt, max_new_tokens=12, temperature=0)
        assert generate(model, prompt, max_new_tokens=12, temperature=0, steer=zero) == plain
        sampled = generate(model, prompt, max_new_tokens=12, temperature=0.9, seed=5)
        assert generate(model, prompt, max_new_tokens=12, temperature=0.9, seed=5,
                        steer=zero) == sampled  # fmt: skip
    big = [Steer("blocks.1.resid_post", v, 5.0)]
    assert generate(model, prompts[0], max_new_tokens=12, temperature=0, steer=big) != (
        generate(model, prompts[0], max_new_tokens=12, temperature=0)
    )


def test_steered_decoding_takes_the_eager_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """With steering hooks attached no step is recorded for replay (the recording would skip
    the hooks); without them the CPU records one, where the kernels are built."""
    from glassgpt.kernels import replay
    from glassgpt.sample.replay import ReplayedStep

    model = random_model(dtype=torch.float32)
    calls: list[int] = []
    record = ReplayedStep.record

    def counted(*args, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        return record(*args, **kw)

    monkeypatch.setattr(ReplayedStep, "record", counted)
    steer = [Steer("blocks.0.resid_post", randn(12, seed=1).float(), 1.0)]
    generate(model, [1, 2, 3], max_new_tokens=6, temperature=0, steer=steer)
    assert calls == []
    generate(model, [1, 2, 3], max_new_tokens=6, temperature=0)
    assert calls == ([1] if replay._rowwise is not None else [])


@pytest.mark.parametrize("hook", ["embed", "blocks.0.resid_mid", "blocks.1.mlp.post"])
def test_cached_generation_equals_recomputing_the_sequence_each_step(hook: str) -> None:
    """Greedy ids with the KV cache (and a left-padded batch) under steering equal the argmax
    of the full forward of the whole sequence at every step, under the same hooks."""
    model = random_model(seed=2, positional="rope")
    width = model.config.d_mlp if "mlp" in hook else model.config.d_model
    steers = [Steer(hook, randn(width, seed=7), 1.3)]
    prompts = [[3, 1, 4, 1, 5], [2, 7]]
    got = generate(model, prompts, max_new_tokens=9, temperature=0, steer=steers)
    for prompt, ids in zip(prompts, got):
        seq = list(prompt)
        with steered(model, steers), torch.no_grad():
            for _ in range(9):
                seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        assert ids == seq[len(prompt) :]
    assert got != generate(model, prompts, max_new_tokens=9, temperature=0)


# -- names, widths and values -------------------------------------------------------------
def test_names_widths_and_values_are_checked() -> None:
    model = random_model()
    v = torch.ones(12)
    assert canonical_hook("blocks.1.hook_resid_post") == "blocks.1.resid_post"
    assert canonical_hook("hook_embed") == "embed"
    assert canonical_hook("blocks.0.mlp.hook_post") == "blocks.0.mlp.post"
    with pytest.raises(GlassError, match=r"unknown hook 'blocks\.2\.resid_post'"):
        steering_hooks(model, [Steer("blocks.2.resid_post", v)])
    with pytest.raises(GlassError, match=r"width 7 .* d_model = 12"):
        steering_hooks(model, [Steer("blocks.0.resid_post", torch.ones(7))])
    with pytest.raises(GlassError, match=r"width 12 .* d_mlp = 16"):
        steering_hooks(model, [Steer("blocks.0.mlp.post", v)])
    with pytest.raises(GlassError, match="no vector per position"):
        steering_hooks(model, [Steer("blocks.0.attn.pattern", v)])
    with pytest.raises(ConfigError, match="vector: entry 2 is nan"):
        Steer("embed", torch.tensor([0.0, 1.0, float("nan")]))
    with pytest.raises(ConfigError, match="alpha"):
        Steer("embed", v, float("inf"))
    with pytest.raises(ConfigError, match="float tensor"):
        Steer("embed", torch.ones(3, dtype=torch.long))
    assert steering_hooks(model, []) == {}


def test_vector_files_in_every_format(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    v = randn(12, seed=1).float()
    paths = [tmp_path / "v.safetensors", tmp_path / "v.npy", tmp_path / "v.pt"]
    for p in paths:
        save_vector(p, v)
        assert torch.equal(load_vector(p), v)
    save_file({"direction": v}, str(tmp_path / "one.safetensors"))  # one tensor, any name
    colon = tmp_path / "a:b.npy"  # the spec splits at its last two colons
    np.save(colon, v.numpy())
    for p in (tmp_path / "one.safetensors", colon):
        s = parse_steer(f"{p}:blocks.1.hook_resid_post:-2.5")
        assert (s.hook, s.alpha) == ("blocks.1.resid_post", -2.5) and torch.equal(s.vector, v)


@pytest.fixture
def bad_files(tmp_path: Path) -> Path:
    from safetensors.torch import save_file

    (tmp_path / "corrupt.safetensors").write_bytes(b"\x00\x01 not a safetensors file")
    (tmp_path / "corrupt.npy").write_bytes(b"garbage")
    (tmp_path / "corrupt.pt").write_bytes(b"garbage")
    (tmp_path / "v.txt").write_text("1 2 3")
    np.save(tmp_path / "nan.npy", np.array([0.0, np.nan, 1.0]))
    np.save(tmp_path / "ints.npy", np.arange(3))
    save_file({"a": torch.ones(2), "b": torch.ones(2)}, str(tmp_path / "two.safetensors"))
    return tmp_path


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{d}/missing.npy:embed:1", "missing.npy: no such vector file"),
        ("{d}/corrupt.safetensors:embed:1", "not a readable .safetensors file"),
        ("{d}/corrupt.npy:embed:1", "not a readable .npy file"),
        ("{d}/corrupt.pt:embed:1", "not a readable .pt file"),
        ("{d}/v.txt:embed:1", "unknown vector format"),
        ("{d}/nan.npy:embed:1", "entry 1 is nan"),
        ("{d}/ints.npy:embed:1", "not floats"),
        ("{d}/two.safetensors:embed:1", "holds 2 tensors (a, b)"),
        ("{d}/corrupt.npy:embed:strong", "alpha 'strong' is not a number"),
        ("{d}/corrupt.npy:1", "expected FILE:HOOK:ALPHA"),
    ],
)
def test_bad_steer_specs(bad_files: Path, spec: str, message: str) -> None:
    with pytest.raises(GlassError) as e:
        parse_steer(spec.format(d=bad_files))
    assert message in str(e.value) and "\n" not in str(e.value)


# -- contrastive vectors ------------------------------------------------------------------
def test_contrastive_vector_is_the_mean_difference() -> None:
    """At ``embed`` the activation is W_E[token]: the vector is a difference of means of rows
    of W_E; at blocks.1.resid_post (last position) it is the captured activations'."""
    model = random_model(positional="rope")
    tok = CharTokenizer(list("abcdefghijk"))
    W_E = model.embed.W_E.detach()
    pos, neg = ["abc", "kj"], ["eeee", "f", "hig"]

    def mean_rows(texts: list[str]) -> torch.Tensor:
        return torch.stack([W_E[tok.encode(t)].mean(0) for t in texts]).mean(0)

    v = contrastive_vector(model, tok, pos, neg, "hook_embed", pos="mean")
    torch.testing.assert_close(v, mean_rows(pos) - mean_rows(neg), rtol=0, atol=1e-12)

    acts: list[torch.Tensor] = []
    for text in pos + neg:
        with torch.no_grad(), model.hooks({"blocks.1.resid_post": lambda x, _: acts.append(x)}):
            model(torch.tensor([tok.encode(text)]))
    last = [a[0, -1] for a in acts]
    want = torch.stack(last[:2]).mean(0) - torch.stack(last[2:]).mean(0)
    got = contrastive_vector(model, tok, pos, neg, "blocks.1.resid_post", pos="last")
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    with pytest.raises(ConfigError, match="negative"):
        contrastive_vector(model, tok, pos, [], "embed")
    with pytest.raises(ConfigError, match="pos"):
        contrastive_vector(model, tok, pos, neg, "embed", pos="first")  # type: ignore[arg-type]


# -- the commands -------------------------------------------------------------------------
def test_sample_steer_changes_the_text_as_generate_does(char_run: Run, tmp_path: Path,
                                                        capsys) -> None:  # fmt: skip
    run, model, tok = char_run
    v = randn(16, seed=4).float()
    save_vector(tmp_path / "v.safetensors", v)
    args = ["sample", "-c", str(run), "-p", "hello", "-m", "20", "-t", "0", "--no-stop-eos"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    steer = [f"{tmp_path / 'v.safetensors'}:blocks.0.resid_post:6", "--steer",
             f"{tmp_path / 'v.safetensors'}:blocks.1.hook_resid_mid:-2"]  # fmt: skip
    assert main([*args, "--steer", *steer]) == 0
    out = capsys.readouterr().out
    ids = generate(model, tok.encode("hello"), max_new_tokens=20, temperature=0,
                   steer=[Steer("blocks.0.resid_post", v, 6), Steer("blocks.1.resid_mid", v, -2)])  # fmt: skip
    assert out == "hello" + tok.decode(ids) + "\n" and out != plain


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{d}/missing.npy:blocks.0.resid_post:1", "no such vector file"),
        ("{d}/corrupt.safetensors:blocks.0.resid_post:1", "not a readable .safetensors"),
        ("{d}/v16.npy:blocks.5.resid_post:1", "unknown hook 'blocks.5.resid_post'"),
        (
            "{d}/v16.npy:blocks.0.mlp.post:1",
            "has width 16 (16,), but blocks.0.mlp.post has width d_mlp = 64",
        ),
        ("{d}/v16.npy:blocks.0.resid_post:x", "alpha 'x' is not a number"),
        ("{d}/nan.npy:blocks.0.resid_post:1", "entry 1 is nan"),
    ],
)
def test_sample_bad_steer_is_one_line(char_run: Run, bad_files: Path, spec: str, message: str,
                                      capsys) -> None:  # fmt: skip
    np.save(bad_files / "v16.npy", np.ones(16, dtype=np.float32))
    code = main(["sample", "-c", str(char_run[0]), "-p", "a", "-m", "2",
                 "--steer", spec.format(d=bad_files)])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("glassgpt: error:") and message in err, err
    assert "\n" not in err


def test_steer_command_writes_the_mean_difference(char_run: Run, tmp_path: Path, capsys) -> None:
    from safetensors import safe_open

    run, model, tok = char_run
    pos, neg = ["i love it", "so good"], ["i hate it", "bad, bad", "awful"]
    out = tmp_path / "v.safetensors"
    code = main(["steer", "-c", str(run), "--positive", *pos, "--negative", *neg,
                 "--hook", "blocks.0.hook_resid_post", "--pos", "last", "-o", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    last = []
    for text in pos + neg:
        with torch.no_grad(), model.hooks({"blocks.0.resid_post": lambda x, _: last.append(x)}):
            model(torch.tensor([tok.encode(text)]))
    acts = torch.stack([a[0, -1].double() for a in last])
    want = acts[:2].mean(0) - acts[2:].mean(0)
    got = load_vector(out)
    assert got.shape == (16,)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)
    with safe_open(str(out), "pt") as f:
        assert f.metadata()["hook"] == "blocks.0.resid_post"
    s = parse_steer(f"{out}:blocks.0.resid_post:3")  # and the file steers
    tokens = torch.tensor([tok.encode("abc")])
    with torch.no_grad(), steered(model, [s]):
        hooked = model(tokens)
    assert (hooked - model(tokens)).abs().max() > 1e-3
    assert main(["steer", "-c", str(run), "--positive", "a", "--negative", "b",
                 "--hook", "blocks.9.resid_post", "-o", str(out)]) == 2  # fmt: skip
    assert "unknown hook" in capsys.readouterr().err
