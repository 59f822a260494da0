"""Splicing an SAE into the model, and the quality metrics, against explicit computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from glassgpt.errors import GlassError
from glassgpt.features.metrics import ce_losses, evaluate, fvu, l0
from glassgpt.features.sae import SAE, SAEConfig
from glassgpt.features.sites import check_model, read, resolve_site, spliced
from glassgpt.model import GPT, GPTConfig


def random_model(seed: int = 0, **overrides) -> GPT:
    cfg = GPTConfig(**{"n_vocab": 13, "n_ctx": 10, "d_model": 8, "n_layers": 2, "n_heads": 2,
                       "d_mlp": 16, **overrides})  # fmt: skip
    torch.manual_seed(seed)
    model = GPT(cfg).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1.0 if name.endswith(".w") else 0.0) + 0.4 * torch.randn_like(p))
    return model.eval()


def tokens(n_vocab: int = 13, B: int = 3, T: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, n_vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def identity_sae(d: int, hook: str) -> SAE:
    """relu with W_enc = [I, −I], W_dec = [I; −I]: x̂ = ReLU(x) − ReLU(−x) = x exactly."""
    sae = SAE(SAEConfig(d_in=d, d_sae=2 * d, arch="relu", hook=hook, dtype="float64"))
    eye = torch.eye(d, dtype=torch.float64)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(torch.cat([eye, -eye], 0))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae.eval()


@pytest.mark.parametrize("hook", ["blocks.0.resid_post", "blocks.1.resid_mid", "blocks.0.attn.z", "blocks.1.mlp.post"])  # fmt: skip
def test_an_exact_dictionary_leaves_the_logits_and_recovers_all(hook: str) -> None:
    model, x = random_model(), tokens()
    site = resolve_site(model, hook)
    sae = identity_sae(site.d_in, hook)
    clean = model(x)
    with spliced(model, sae):
        assert torch.equal(model(x), clean)
    y = torch.roll(x, -1, 1)
    result = evaluate(model, sae, [(x, y)])
    assert result["ce_sae"] == result["ce_clean"]
    assert result["ce_recovered"] == 1.0
    assert result["fvu"] == 0.0 and result["mse"] == 0.0
    assert result["ce_zero"] != result["ce_clean"]


def test_ce_losses_are_the_three_runs_by_hand() -> None:
    model, x = random_model(), tokens()
    y = torch.roll(x, -1, 1)
    sae = SAE(SAEConfig(d_in=8, d_sae=24, arch="topk", k=3, hook="blocks.0.resid_post", dtype="float64"), seed=0).eval()  # fmt: skip
    got = ce_losses(model, sae, x, y)

    def loss_with(replace) -> float:  # the model's blocks run one by one, block 0's output replaced
        h = model.embed(x) + model.pos_embed(x.shape[1], 0, dtype=torch.float64, device=x.device)
        h = replace(model.blocks[0](h))
        h = model.blocks[1](h)
        logits = model.unembed(model.ln_final(h), model.embed.W_E)
        return float(F.cross_entropy(logits.flatten(0, 1), y.flatten()))

    with torch.no_grad():
        assert got["ce_clean"] == pytest.approx(loss_with(lambda h: h), rel=1e-12)
        assert got["ce_sae"] == pytest.approx(loss_with(lambda h: sae(h)[0]), rel=1e-12)
        assert got["ce_zero"] == pytest.approx(loss_with(torch.zeros_like), rel=1e-12)


def test_evaluate_is_l0_fvu_and_densities_of_the_read_activations() -> None:
    model = random_model()
    batches = [(tokens(seed=s), torch.roll(tokens(seed=s), -1, 1)) for s in (1, 2)]
    sae = SAE(SAEConfig(d_in=8, d_sae=24, arch="relu", hook="blocks.1.resid_post", dtype="float64"), seed=0)  # fmt: skip
    with torch.no_grad():
        sae.b_enc.fill_(-0.5)  # some latents never fire
    out = evaluate(model, sae, batches, dense=0.3)
    site = check_model(sae, model)
    a = torch.cat([read(model, x, site)[0].reshape(-1, 8) for x, _ in batches]).numpy()
    W_enc, b_enc = sae.W_enc.detach().numpy(), sae.b_enc.detach().numpy()
    acts = np.maximum(a @ W_enc + b_enc, 0)
    a_hat = acts @ sae.W_dec.detach().numpy()
    assert out["l0"] == pytest.approx((acts > 0).sum(1).mean(), rel=1e-12)
    want_fvu = ((a - a_hat) ** 2).sum() / ((a - a.mean(0)) ** 2).sum()
    assert out["fvu"] == pytest.approx(want_fvu, rel=1e-9)
    density = (acts > 0).mean(0)
    assert out["dead_fraction"] == pytest.approx((density == 0).mean())
    assert out["dense_fraction"] == pytest.approx((density > 0.3).mean())
    assert 0 < out["dead_fraction"] < 1 and out["tokens"] == 54
    assert fvu(torch.from_numpy(a), torch.from_numpy(a_hat)) == pytest.approx(want_fvu, rel=1e-9)
    assert l0(torch.from_numpy(acts)) == pytest.approx(out["l0"])


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_a_transcoder_reads_the_mlps_input_and_replaces_its_output(placement: str) -> None:
    model, x = random_model(norm_placement=placement), tokens()
    site = resolve_site(model, "blocks.1.hook_mlp_out", transcoder=True)
    u, out = read(model, x, site)
    with torch.no_grad():  # the MLP of that block maps the read input to the read output
        assert torch.allclose(model.blocks[1].mlp(u), out, rtol=1e-12, atol=1e-12)
    tc = SAE(SAEConfig(d_in=8, d_sae=20, arch="transcoder", k=4, hook=site.hook,
                       out_hook=site.out_hook, d_out=8, dtype="float64"), seed=1).eval()  # fmt: skip
    seen = {}
    keep = {"blocks.1.resid_post": lambda t, n: seen.setdefault("post", t)}
    with torch.no_grad(), spliced(model, tc), model.hooks(keep):
        model(x)
    with torch.no_grad():
        mid = read(model, x, resolve_site(model, "blocks.1.resid_mid"))[0]
        y_hat = tc(u)[0]
        want = mid + y_hat if placement == "pre" else model.blocks[1].ln2(mid + y_hat)
    assert torch.allclose(seen["post"], want, rtol=1e-12, atol=1e-12)


def test_an_sae_on_a_model_of_another_shape_names_both() -> None:
    sae = SAE(SAEConfig(d_in=8, d_sae=16, arch="relu", hook="blocks.1.resid_post"))
    with pytest.raises(GlassError, match=r"blocks.1.resid_post \[d_in=8\].*\[12\].*d_model=12"):
        check_model(sae, random_model(d_model=12, n_heads=2))
    with pytest.raises(GlassError, match=r"blocks.1.resid_post \[d_in=8\].*1 layer \(blocks.0"):
        check_model(sae, random_model(n_layers=1))
