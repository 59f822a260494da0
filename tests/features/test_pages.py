"""Feature pages against a brute-force computation: every latent's activations over the whole
corpus in one forward, then plain Python loops for its top contexts, density and histogram;
the logit effect against a finite difference of the final logits."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from glassgpt.checkpoint import load
from glassgpt.cli import main
from glassgpt.data import DataDir
from glassgpt.errors import GlassError, InputFileError
from glassgpt.features.pages import (
    Binning,
    compute_pages,
    load_pages,
    logit_effect,
    save_pages,
    windows,
)
from glassgpt.features.sae import SAE, SAEConfig
from glassgpt.features.sites import read, resolve_site
from glassgpt.inspect.lens import unembed

HOOK = "blocks.1.resid_post"


def random_sae(d_in: int, arch: str = "relu", d_sae: int = 24, seed: int = 0) -> SAE:
    k = 4 if arch == "topk" else None
    sae = SAE(SAEConfig(d_in=d_in, d_sae=d_sae, arch=arch, k=k, hook=HOOK), seed=seed)
    with torch.no_grad():  # biases that leave some latents rare and some common
        gen = torch.Generator().manual_seed(seed)
        sae.b_enc.copy_(torch.randn(d_sae, generator=gen) * 0.5 - 0.3)
        sae.W_enc.mul_(3.0)
    return sae.eval()


@pytest.mark.parametrize("arch", ["relu", "topk"])
def test_pages_equal_brute_force(tiny_run: Path, arch: str) -> None:
    model, _ = load(tiny_run)
    sae = random_sae(model.config.d_model, arch)
    stream = DataDir.open(tiny_run / "data").stream("train")
    T, before, after, K = 16, 3, 2, 5
    binning = Binning(lo=-2, hi=1, per_decade=3)
    pages = compute_pages(model, sae, windows(stream, seq_len=T, batch=7, tokens=40 * T),
                          top=K, before=before, after=after, binning=binning, logits=4)  # fmt: skip

    # brute force: every window in one forward, then loops
    n = 40
    toks = torch.stack([torch.from_numpy(stream.read(w * T, T).astype("int64")) for w in range(n)])
    x, _ = read(model, toks, resolve_site(model, HOOK))
    f = sae.encode(x).detach()  # [n, T, d_sae]
    assert pages.tokens == n * T
    edges = [10.0 ** (binning.lo + j / binning.per_decade)
             for j in range((binning.hi - binning.lo) * binning.per_decade + 1)]  # fmt: skip
    for i in range(sae.cfg.d_sae):
        seen = [
            (float(f[w, t, i]), w * T + t) for w in range(n) for t in range(T) if f[w, t, i] > 0
        ]
        assert int(pages.count[i]) == len(seen)
        assert math.isclose(float(pages.density[i]), len(seen) / (n * T))
        hist = [0] * binning.n_bins
        for v, _ in seen:
            hist[sum(1 for e in edges if e <= v)] += 1
        assert pages.hist[i].tolist() == hist
        best = sorted(seen, key=lambda p: -p[0])[:K]
        got = [v for v in pages.top_values[i].tolist() if v > 0]
        assert len(got) == len(best)
        assert got == pytest.approx([v for v, _ in best], rel=1e-6)
        for k, (v, where) in enumerate(best):
            at = int(pages.top_where[i, k])
            if sum(1 for u, _ in seen if u == v) == 1:  # no tie: the very token
                assert at == where
            w, t = divmod(at, T)
            assert math.isclose(float(f[w, t, i]), float(pages.top_values[i, k]), rel_tol=1e-6)
            for j, dt in enumerate(range(-before, after + 1)):
                inside = 0 <= t + dt < T
                assert int(pages.top_tokens[i, k, j]) == (int(toks[w, t + dt]) if inside else -1)
                want = float(f[w, t + dt, i]) if inside else 0.0
                assert float(pages.top_acts[i, k, j]) == pytest.approx(want, rel=1e-6, abs=1e-7)
        for k in range(len(best), K):  # empty slots
            assert int(pages.top_where[i, k]) == -1 and (pages.top_tokens[i, k] == -1).all()
    if arch == "topk":
        assert int(pages.count.sum()) <= n * T * 4


def test_logit_effect_is_the_direct_path_through_the_frozen_norm(tiny_run: Path) -> None:
    model, _ = load(tiny_run)
    model = model.double()
    sae = random_sae(model.config.d_model, d_sae=6).double()
    V = model.config.n_vocab
    top_ids, top_v, bot_ids, bot_v = logit_effect(model, sae, n=V)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(model.config.d_model, generator=gen, dtype=torch.float64) * 3
    seen: list[torch.Tensor] = []
    with torch.no_grad(), model.hooks({"ln_final.scale": lambda s, _: seen.append(s)}):
        unembed(model, x)
    frozen = {"ln_final.scale": lambda s, _: seen[0]}  # DLA's convention: s of x, held fixed
    for i in range(6):
        d = sae.W_dec[i].detach()
        with torch.no_grad(), model.hooks(frozen):
            diff = unembed(model, x + d) - unembed(model, x)
        ours = torch.empty(V, dtype=torch.float64)
        ours[top_ids[i]] = top_v[i].double()
        ratio = diff / ours  # s, the frozen scale: one positive number for every token
        assert torch.allclose(ratio, seen[0].reshape(()).expand(V), rtol=1e-5)
        assert bot_ids[i].tolist() == top_ids[i].flip(0).tolist()
        assert bot_v[i].tolist() == top_v[i].flip(0).tolist()


def test_file_round_trip_and_bad_files(tiny_run: Path, tmp_path: Path) -> None:
    model, tok = load(tiny_run)
    sae = random_sae(model.config.d_model)
    stream = DataDir.open(tiny_run / "data").stream("train")
    pages = compute_pages(model, sae, windows(stream, seq_len=16, batch=4, tokens=200), top=3)
    path = save_pages(tmp_path / "p.safetensors", pages)
    back = load_pages(path)
    for name in ("top_values", "top_where", "top_tokens", "top_acts", "hist", "count",
                 "logit_top_ids", "logit_bottom_values"):  # fmt: skip
        assert torch.equal(getattr(back, name), getattr(pages, name)), name
    assert back.meta == pages.meta and back.tokens == 208  # 13 whole windows of 16
    texts = [tok.decode([t]) for t in range(model.config.n_vocab)]
    live = int(pages.count.argmax())
    page = back.page(live, texts)
    assert page["contexts"][0]["value"] == page["max"] > 0
    c = page["contexts"][0]
    assert c["acts"][c["at"]] == pytest.approx(c["value"], rel=1e-4)
    assert sum(b["count"] for b in page["histogram"]) == page["count"]
    with pytest.raises(GlassError, match="out of range"):
        back.page(sae.cfg.d_sae, texts)
    (tmp_path / "bad.safetensors").write_bytes(b"not a file")
    with pytest.raises(InputFileError, match=r"bad\.safetensors"):
        load_pages(tmp_path / "bad.safetensors")
    with pytest.raises(InputFileError, match="glassgpt sae features"):
        load_pages(tmp_path / "none")


def test_the_command_writes_the_pages_beside_the_sae(tiny_run: Path, tmp_path: Path, capsys) -> None:  # fmt: skip
    model, _ = load(tiny_run)
    sae = random_sae(model.config.d_model)
    sae.save(tmp_path / "sae", extra={"model": str(tiny_run), "data": str(tiny_run / "data")})
    args = ["sae", "features", "-c", str(tmp_path / "sae"), "--tokens", "300", "--seq-len", "16",
            "--top", "4", "--context", "2", "1"]  # fmt: skip
    assert main(args) == 0
    assert "24 latents over 304 tokens" in capsys.readouterr().out
    pages = load_pages(tmp_path / "sae")
    stream = DataDir.open(tiny_run / "data").stream("train")
    direct = compute_pages(model, sae, windows(stream, seq_len=16, batch=256, tokens=300),
                           top=4, before=2, after=1)  # fmt: skip
    assert torch.equal(pages.hist, direct.hist) and torch.allclose(pages.top_values, direct.top_values)  # fmt: skip
    assert main([*args, "--data", str(tiny_run / "text.txt"), "-o", str(tmp_path / "t.st")]) == 0
    assert load_pages(tmp_path / "t.st").meta["source"].endswith("text.txt")
    assert main([*args, "--split", "test"]) == 2
    assert "--split test" in capsys.readouterr().err
    sae.save(tmp_path / "bare", extra={"model": str(tiny_run)})  # no data folder of its own
    assert main(["sae", "features", "-c", str(tmp_path / "bare")]) == 2
    assert "pass --data" in capsys.readouterr().err
    sae.save(tmp_path / "nomodel")
    assert main(["sae", "features", "-c", str(tmp_path / "nomodel")]) == 2
    assert "pass --model" in capsys.readouterr().err
