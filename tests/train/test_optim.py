from __future__ import annotations

import numpy as np
import pytest
import torch

from glassgpt.model import GPT, GPTConfig
from glassgpt.train.config import TrainConfig
from glassgpt.train.optim import (
    AdamW,
    build_optimizer,
    load_optimizer_tensors,
    lr_at,
    optimizer_tensors,
    param_groups,
)


def torch_schedule(cfg: TrainConfig, steps: int) -> list[float]:
    """The same schedule from PyTorch's own schedulers: LinearLR warmup then CosineAnnealingLR."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=cfg.lr)
    w = cfg.warmup_steps
    warm = torch.optim.lr_scheduler.LinearLR(
        opt, start_factor=1 / (w + 1), end_factor=1.0, total_iters=w
    )
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(
        opt, T_max=cfg.total_decay_steps - w, eta_min=cfg.min_lr
    )
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[w])
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize(("warmup", "decay"), [(10, 100), (0, 50), (25, 60)])
def test_cosine_schedule_matches_pytorch_schedulers(warmup: int, decay: int) -> None:
    cfg = TrainConfig(max_steps=decay, lr=3e-3, min_lr=3e-4, warmup_steps=warmup)
    ours = [lr_at(s, cfg) for s in range(decay)]
    np.testing.assert_allclose(ours, torch_schedule(cfg, decay), rtol=1e-9, atol=1e-12)
    assert lr_at(decay, cfg) == lr_at(decay + 1000, cfg) == cfg.min_lr


def test_linear_and_constant_schedules() -> None:
    lin = TrainConfig(max_steps=110, lr=1.0, min_lr=0.0, warmup_steps=10, schedule="linear")
    assert [lr_at(s, lin) for s in (10, 60, 110)] == [1.0, 0.5, 0.0]
    const = TrainConfig(max_steps=50, lr=0.2, min_lr=0.0, warmup_steps=4, schedule="constant")
    assert lr_at(3, const) == pytest.approx(0.2 * 4 / 5) and lr_at(49, const) == 0.2


def test_matrices_decay_vectors_do_not() -> None:
    model = GPT(GPTConfig(n_vocab=20, n_ctx=8, d_model=16, n_layers=2, n_heads=2))
    decay, no_decay = param_groups(model, 0.1)
    named = dict(model.named_parameters())
    assert sorted(decay["names"] + no_decay["names"]) == sorted(named)
    assert all(named[n].dim() >= 2 for n in decay["names"]) and decay["weight_decay"] == 0.1
    assert all(named[n].dim() == 1 for n in no_decay["names"]) and no_decay["weight_decay"] == 0
    assert "embed.W_E" in decay["names"] and "blocks.0.ln1.w" in no_decay["names"]


def test_adamw_step_matches_the_equations() -> None:
    """Three steps on a matrix (decayed) and a vector (not) against AdamW written in NumPy."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    cfg = TrainConfig(lr=0.1, min_lr=0.0, warmup_steps=0, weight_decay=0.3, beta1=0.8, beta2=0.9)
    opt = build_optimizer(model, cfg)
    ref = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters()}
    m = {n: np.zeros_like(v) for n, v in ref.items()}
    v = {n: np.zeros_like(x) for n, x in ref.items()}
    for t in range(1, 4):
        x = torch.randn(5, 3)
        opt.zero_grad()
        (model(x) ** 2).sum().backward()
        grads = {n: p.grad.double().numpy() for n, p in model.named_parameters()}
        opt.step()
        for n, g in grads.items():
            lam = 0.3 if n == "weight" else 0.0
            ref[n] *= 1 - 0.1 * lam
            m[n] = 0.8 * m[n] + 0.2 * g
            v[n] = 0.9 * v[n] + 0.1 * g * g
            mhat, vhat = m[n] / (1 - 0.8**t), v[n] / (1 - 0.9**t)
            ref[n] -= 0.1 * mhat / (np.sqrt(vhat) + cfg.eps)
        # the reference takes the gradients torch computed at torch's weights
        for n, p in model.named_parameters():
            np.testing.assert_allclose(p.detach().double().numpy(), ref[n], rtol=1e-5, atol=1e-6)


def test_optimizer_state_saved_with_separate_qkv_parameters_still_loads() -> None:
    """A checkpoint from before W_Q, W_K, W_V became views of W_QKV names the three (and
    b_Q, b_K, b_V) in its optimizer state: their moments load fused, as the parameters are."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=20, n_ctx=8, d_model=16, n_layers=2, n_heads=2))
    opt = build_optimizer(model, TrainConfig())
    tokens = torch.randint(0, 20, (2, 8))
    model(tokens, tokens)[1].backward()
    opt.step()
    tensors, groups = optimizer_tensors(opt)
    legacy: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():  # split each fused moment into the three it was saved as
        name, _, field = key.rpartition(".")
        stem, _, leaf = name.rpartition(".")
        if leaf not in ("W_QKV", "b_QKV"):
            legacy[key] = t
            continue
        for i, m in enumerate("QKV"):
            if t.ndim == 0:  # the step count
                part = t
            elif leaf == "W_QKV":  # [d_model, 3·H·d_head] → W_m [H, d_model, d_head]
                part = t.view(16, 3, 2, 8)[:, i].transpose(0, 1)
            else:  # [3, H, d_head] → b_m [H, d_head]
                part = t[i]
            legacy[f"{stem}.{leaf[0]}_{m}.{field}"] = part
    legacy_groups = []
    for g in groups:
        names = []
        for n in g["names"]:
            stem, _, leaf = n.rpartition(".")
            names += [f"{stem}.{leaf[0]}_{m}" for m in "QKV"] if leaf.endswith("QKV") else [n]
        legacy_groups.append({**g, "names": names})
    fresh = build_optimizer(model, TrainConfig())
    load_optimizer_tensors(fresh, legacy, legacy_groups)
    for p in model.parameters():
        for field, value in opt.state[p].items():
            assert torch.equal(fresh.state[p][field], value), field


def test_group_step_is_bit_identical_to_torch_fused_adamw() -> None:
    """AdamW's one-call-per-group step against PyTorch's own fused AdamW: two groups, a
    parameter without a gradient in some steps (it keeps its own step count), changing
    learning rates, and a save/load of the state in the middle."""
    torch.manual_seed(0)
    shapes = [(5, 3), (7,), (2, 4, 3), (3,)]
    ours_p = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    ref_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]

    def groups(ps):
        return [
            {"params": ps[:3:2], "weight_decay": 0.1},
            {"params": ps[1::2], "weight_decay": 0.0},
        ]

    kw = {"betas": (0.9, 0.95), "eps": 1e-8, "fused": True}
    ours = AdamW(groups(ours_p), lr=1e-2, **kw)
    ref = torch.optim.AdamW(groups(ref_p), lr=1e-2, **kw)
    for step in range(12):
        grads = [torch.randn(s) for s in shapes]
        for i, (a, b) in enumerate(zip(ours_p, ref_p)):
            skip = i == 1 and step in (2, 3, 7)  # no gradient: no update, no step count
            a.grad = None if skip else grads[i].clone()
            b.grad = None if skip else grads[i].clone()
        for opt in (ours, ref):
            for g in opt.param_groups:
                g["lr"] = 1e-2 / (1 + step)
        ours.step()
        ref.step()
        if step == 5:
            state = ours.state_dict()
            ours = AdamW(groups(ours_p), lr=1e-2, **kw)
            ours.load_state_dict(state)
        for a, b in zip(ours_p, ref_p):
            assert torch.equal(a, b)
    for a, b in zip(ours_p, ref_p):
        sa, sb = ours.state[a], ref.state[b]
        assert float(sa["step"]) == float(sb["step"])
        assert torch.equal(sa["exp_avg"], sb["exp_avg"])
        assert torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    assert float(ours.state[ours_p[1]]["step"]) == 9.0  # 12 steps, 3 without a gradient
    # one shared count in the first group, which never skipped
    assert ours.state[ours_p[0]]["step"] is ours.state[ours_p[2]]["step"]


def test_shared_step_counts_save_as_separate_tensors() -> None:
    model = GPT(GPTConfig(n_vocab=11, n_ctx=8, d_model=8, n_layers=1, n_heads=2))
    opt = build_optimizer(model, TrainConfig())
    model(torch.tensor([[1, 2, 3]]), targets=torch.tensor([[2, 3, 4]]))[1].backward()
    opt.step()
    tensors, _ = optimizer_tensors(opt)
    steps = [t for k, t in tensors.items() if k.endswith(".step")]
    assert len(steps) == len(list(model.parameters()))
    assert len({t.data_ptr() for t in steps}) == len(steps)  # safetensors refuses shared memory
    assert all(float(t) == 1.0 for t in steps)


def test_building_stepping_and_saving_the_optimizer_imports_no_dynamo(imports_after) -> None:
    """PyTorch wraps the optimizer's add_param_group, zero_grad, state_dict and
    load_state_dict to disable dynamo, and the wrapper imports torch._dynamo (1.0 s at a
    run's start) at the first call: glassgpt's AdamW takes the methods without it. In a
    fresh process: build, step, zero, save and load, with no torch._dynamo imported."""
    code = (
        "import torch\n"
        "from torch import nn\n"
        "from glassgpt.train.config import TrainConfig\n"
        "from glassgpt.train.optim import build_optimizer\n"
        "m = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))\n"
        "opt = build_optimizer(m, TrainConfig(weight_decay=0.1))\n"
        "assert opt.defaults.get('fused')\n"
        "m(torch.randn(5, 3)).square().sum().backward()\n"
        "opt.step(); opt.zero_grad()\n"
        "opt.load_state_dict(opt.state_dict())\n"
    )
    assert imports_after(code, ["torch._dynamo"]) == []
