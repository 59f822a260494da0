"""Cross-layer transcoders (glassgpt.features.clt): the equations written out by hand, the tanh
penalty and its threshold gradient, files, and a fit that explains a model's MLP outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from glassgpt.errors import ConfigError, GlassError, InputFileError
from glassgpt.features.clt import CLT, CLTConfig
from glassgpt.features.replacement import Transcoders, freeze
from glassgpt.model import GPT, GPTConfig


def make(arch: str = "jumprelu", **kw: object) -> CLT:
    cfg = CLTConfig(d_model=6, d_sae=10, n_layers=3, arch=arch, k=3, dtype="float64", **kw)  # type: ignore[arg-type]
    clt = CLT(cfg, seed=0)
    with torch.no_grad():
        clt.b_enc.normal_(0, 0.1)
        clt.b_dec.normal_(0, 0.1)
        if arch == "jumprelu":
            clt.log_threshold.fill_(math.log(0.2))
    return clt


@pytest.mark.parametrize("arch", ["jumprelu", "topk"])
def test_encode_decode_by_hand(arch: str) -> None:
    clt = make(arch)
    u = torch.randn(5, 3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y_hat, acts = clt(u)
    for l in range(3):
        z = u[:, l] @ clt.W_enc[l] + clt.b_enc[l]
        if arch == "jumprelu":
            want = z * (z > 0.2)
        else:
            want = torch.zeros_like(z).scatter(-1, z.topk(3).indices, z.topk(3).values).relu()
        assert torch.allclose(acts[:, l], want, atol=1e-12, rtol=0)
        assert torch.allclose(clt.encode(u[:, l], l), want, atol=1e-12, rtol=0)
    for target in range(3):  # ŷ_t = Σ_{s ≤ t} a_s W_dec[s][t − s] + b_dec[t]
        want = clt.b_dec[target] + sum(
            acts[:, s] @ clt.W_dec[s][target - s] for s in range(target + 1)
        )
        assert torch.allclose(y_hat[:, target], want, atol=1e-12, rtol=0)
    assert [tuple(W.shape) for W in clt.W_dec] == [(3, 10, 6), (2, 10, 6), (1, 10, 6)]
    if arch == "topk":
        assert int((acts != 0).sum(-1).max()) <= 3


def test_loss_sums_layers_and_the_tanh_penalty() -> None:
    clt = make("jumprelu", sparsity_coeff=0.5, tanh_c=2.0, bandwidth=0.5)  # θ within ε of many z
    gen = torch.Generator().manual_seed(2)
    u = torch.randn(7, 3, 6, dtype=torch.float64, generator=gen)
    y = torch.randn(7, 3, 6, dtype=torch.float64, generator=gen)
    out = clt.loss(u, y)
    acts = out["acts"]
    norms = torch.stack([torch.cat([clt.W_dec[l][j] for j in range(3 - l)], -1).norm(dim=-1)
                         for l in range(3)])  # fmt: skip
    assert torch.allclose(norms, clt.decoder_norms())
    mse = (y - out["y_hat"]).pow(2).sum((1, 2)).mean()
    penalty = 0.5 * torch.tanh(2.0 * acts * norms).sum((1, 2)).mean()
    assert torch.allclose(out["mse"], mse) and torch.allclose(out["sparsity"], penalty)
    assert torch.allclose(out["loss"], mse + penalty)
    out["loss"].backward()
    assert clt.log_threshold.grad is not None and bool(clt.log_threshold.grad.abs().sum() > 0)
    assert all(W.grad is not None and bool(W.grad.abs().sum() > 0) for W in clt.W_dec)


def test_save_and_load(tmp_path: Path) -> None:
    clt = make("topk")
    clt.save(tmp_path / "c", extra={"model": "runs/x"})
    again = CLT.load(tmp_path / "c")
    assert again.cfg == clt.cfg
    assert all(torch.equal(a, b) for a, b in zip(clt.state_dict().values(), again.state_dict().values(), strict=True))  # fmt: skip
    assert json.loads((tmp_path / "c" / "clt.json").read_text())["model"] == "runs/x"
    with pytest.raises(InputFileError, match="not a CLT folder"):
        CLT.load(tmp_path)
    doc = json.loads((tmp_path / "c" / "clt.json").read_text())
    doc["config"]["d_sae"] = 11
    (tmp_path / "c" / "clt.json").write_text(json.dumps(doc))
    with pytest.raises(InputFileError, match="does not fit"):
        CLT.load(tmp_path / "c")


def test_bad_configs_and_inputs_name_the_field() -> None:
    with pytest.raises(ConfigError, match="arch"):
        CLTConfig(d_model=4, d_sae=4, n_layers=2, arch="relu")
    with pytest.raises(ConfigError, match="k: must be in"):
        CLTConfig(d_model=4, d_sae=4, n_layers=2, arch="topk", k=5)
    with pytest.raises(GlassError, match="3 layers of d_model=6"):
        make()(torch.zeros(2, 2, 6, dtype=torch.float64))


def test_a_fitted_clt_explains_the_mlps() -> None:
    """Trained a few hundred steps on a tiny model's MLP inputs and outputs, the CLT's
    reconstruction beats predicting each output's mean, and the local replacement's errors
    shrink accordingly."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=20, n_ctx=16, d_model=8, n_layers=2, n_heads=2, d_mlp=16)).eval()
    with torch.no_grad():  # MLP outputs of O(1), not the init's O(0.01)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    tokens = torch.randint(0, 20, (32, 16), generator=torch.Generator().manual_seed(3))
    got: dict[str, torch.Tensor] = {}
    keep = lambda t, name: got.__setitem__(name, t)  # noqa: E731
    hooks = {f"blocks.{l}.{s}": keep for l in range(2) for s in ("resid_mid", "mlp_out")}
    with torch.no_grad(), model.hooks(hooks):
        model(tokens)
        u = torch.stack([model.blocks[l].ln2(got[f"blocks.{l}.resid_mid"]) for l in range(2)], -2)
    y = torch.stack([got[f"blocks.{l}.mlp_out"] for l in range(2)], -2)
    u, y = u.reshape(-1, 2, 8), y.reshape(-1, 2, 8)
    clt = CLT(CLTConfig(d_model=8, d_sae=32, n_layers=2, arch="topk", k=8), seed=0)
    opt = torch.optim.Adam(clt.parameters(), lr=1e-2)
    for _ in range(200):
        opt.zero_grad()
        clt.loss(u, y)["loss"].backward()
        opt.step()
    with torch.no_grad():
        fvu = float(clt.loss(u, y)["mse"] / (y - y.mean(0)).pow(2).sum((1, 2)).mean())
    assert fvu < 0.3
    fz = freeze(model, Transcoders(clt=clt.eval()), tokens[0])
    assert float(fz.errors.pow(2).sum()) < 0.5 * float(fz.writes.pow(2).sum())


def test_the_sparse_topk_loss_equals_the_dense_one_with_its_gradients() -> None:
    dense, sparse = make("topk"), make("topk")
    sparse.load_state_dict(dense.state_dict())
    gen = torch.Generator().manual_seed(5)
    u = torch.randn(9, 3, 6, dtype=torch.float64, generator=gen)
    y = torch.randn(9, 3, 6, dtype=torch.float64, generator=gen)
    y_hat, acts = dense(u)  # autograd through the dense equations is the oracle
    want = (y - y_hat).pow(2).sum((-2, -1)).mean()
    want.backward()
    got = sparse.loss(u, y)
    got["loss"].backward()
    assert torch.allclose(got["loss"], want, atol=1e-12, rtol=0)
    assert torch.equal(got["acts"] != 0, acts != 0)
    assert torch.allclose(got["acts"], acts.detach(), atol=1e-12, rtol=0)
    for (name, a), b in zip(dense.named_parameters(), sparse.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-10, rtol=0), name
