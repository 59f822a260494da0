"""AdamW whose fused step on a CPU counts t once per group (the optimizer of :mod:`glassgpt.train.optim`).

    m ← β₁ m + (1 − β₁) g,   v ← β₂ v + (1 − β₂) g²
    θ ← θ − η_t (m̂ / (√v̂ + ε) + λ θ)      m̂ = m / (1 − β₁ᵗ), v̂ = v / (1 − β₂ᵗ)

Its own module so that both :mod:`glassgpt.train.optim` (which builds the optimizer) and
:mod:`glassgpt.train.muon` (whose optimizer extends it) import it, and neither the other.
"""

from __future__ import annotations

from typing import Any

import torch


def _without_dynamo_guard(method: Any) -> Any:
    """PyTorch's optimizer ``method`` without the wrapper that disables dynamo inside it
    (``method`` itself where it has none): that wrapper imports ``torch._dynamo`` at its
    first call, at every ``glassgpt train``'s start (``tests/train/test_optim.py`` checks it
    is never imported). The optimizer never runs under ``torch.compile`` here
    (``train.compile`` compiles the model alone)."""
    return getattr(method, "__wrapped__", method)


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW``, whose fused step on a CPU counts t once per group.

    PyTorch keeps t as one tensor per parameter and, on a CPU, adds 1 to each in its own
    call before the fused kernel runs (54 small calls a step at nanoGPT's CPU shape, about
    half of the optimizer's time there). Here the parameters of a group that move together
    share one t tensor, incremented once, and the same kernel (``torch._fused_adamw_``)
    updates the group in one call: the same arithmetic, bit for bit. A parameter whose
    gradient is None in a step keeps its own t, as PyTorch's would. Other devices and
    options (AMSGrad, capturable, a GradScaler's ``grad_scale``/``found_inf``) take
    PyTorch's own step.
    """

    add_param_group = _without_dynamo_guard(torch.optim.Optimizer.add_param_group)
    zero_grad = _without_dynamo_guard(torch.optim.Optimizer.zero_grad)
    state_dict = _without_dynamo_guard(torch.optim.Optimizer.state_dict)
    load_state_dict = _without_dynamo_guard(torch.optim.Optimizer.load_state_dict)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if not self._direct():
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._group_step(group)
        return loss

    def _direct(self) -> bool:
        if not self.defaults.get("fused") or getattr(self, "grad_scale", None) is not None:
            return False
        if getattr(self, "found_inf", None) is not None:
            return False
        for group in self.param_groups:
            if group["amsgrad"] or group["maximize"] or group["capturable"]:
                return False
            if group["differentiable"] or torch.is_tensor(group["lr"]):
                return False
            if group["params"] and not group["params"][0].is_cpu:
                return False
        return True

    def _group_step(self, group: dict) -> None:
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        shared: dict[float, torch.Tensor] = {}  # t before this step → the group's tensor
        last = None
        for p in group["params"]:  # a parameter that does not move keeps a t of its own
            if p.grad is None and "step" in self.state[p]:
                self.state[p]["step"] = self.state[p]["step"].clone()
        for p in group["params"]:
            state = self.state[p]
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("AdamW does not support sparse gradients")
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            t = state["step"]
            if t is not last:  # (once shared, the same tensor: no read of its value)
                last = state["step"] = t = shared.setdefault(float(t), t)
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(t)
        if not params:
            return
        for t in {id(t): t for t in steps}.values():
            t += 1
        beta1, beta2 = group["betas"]
        torch._fused_adamw_(
            params, grads, exp_avgs, exp_avg_sqs, [], steps, lr=group["lr"], beta1=beta1,
            beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"], amsgrad=False,
            maximize=False, grad_scale=None, found_inf=None,
        )  # fmt: skip
