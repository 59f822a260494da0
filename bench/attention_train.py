"""Training-time causal attention: glassgpt's kernel beside PyTorch's fused one, same run.

For each shape [B, H, T, d_head] it times z = softmax(q kᵀ/√d + M) v (forward) and forward +
backward (z.backward(g)) by glassgpt's kernel (``glassgpt.kernels.flash``, float32, CPU)
and by ``F.scaled_dot_product_attention(..., is_causal=True)``, alternating the two repeat
by repeat so that both see the same machine noise, with fresh inputs each repeat (q, k, v
as the model makes them: [B, H, T, d] views of one [B, T, 3, H, d] buffer). It prints the
medians in ms and the ratio PyTorch / glassgpt (> 1: glassgpt faster), and the load average
first (the figures mean little on a busy machine). The backward includes autograd's own
work for both (gathering dq, dk, dv into the [B, T, 3, H, d] buffer's gradient), about 2 ms
of either's at the speedrun shape on one thread. Run from the repository root:

    PYTHONPATH=src python bench/attention_train.py                  # 2 threads, 3 shapes
    PYTHONPATH=src python bench/attention_train.py --repeats 5 --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from glassgpt.kernels import flash

# speedrun preset, nanoGPT's CPU recipe (bench/train.py), a wider one
SHAPES = {"speedrun": (16, 4, 128, 32), "nanogpt-cpu": (12, 4, 64, 32), "wide": (8, 12, 256, 64)}

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def pytorch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def inputs(shape: tuple[int, int, int, int], grad: bool) -> list[torch.Tensor]:
    B, H, T, D = shape
    qkv = torch.randn(B, T, 3, H, D, requires_grad=grad)
    return list(qkv.permute(2, 0, 3, 1, 4).unbind(0))


def once(attend: Attention, shape: tuple[int, int, int, int], backward: bool) -> float:
    """Seconds for one forward (no grad), or forward + backward, on fresh inputs."""
    q, k, v = inputs(shape, backward)
    g = torch.randn(shape) if backward else None
    start = time.perf_counter()
    if backward:
        attend(q, k, v).backward(g)
    else:
        with torch.no_grad():
            attend(q, k, v)
    return time.perf_counter() - start


def time_pair(shape: tuple[int, int, int, int], backward: bool, repeats: int) -> list[float]:
    """Median ms of glassgpt's kernel and PyTorch's, alternating (after two warm-up rounds)."""
    times: list[list[float]] = [[], []]
    for r in range(repeats + 2):
        for i, attend in enumerate((flash.causal_attention, pytorch)):
            t = once(attend, shape, backward)
            if r >= 2:
                times[i].append(t)
    return [statistics.median(t) * 1e3 for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES))
    args = parser.parse_args()
    if flash._flash is None:
        raise SystemExit("glassgpt.kernels._flash is not built (python setup.py build_ext)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.threads} threads; "
          f"kernel {flash._flash.kernel()}; medians of {args.repeats}")  # fmt: skip
    print(f"{'shape':<12} {'[B, H, T, d]':<18} {'pass':<10} {'glassgpt':>9} {'pytorch':>9} "
          f"{'ratio':>6}")  # fmt: skip
    for name in args.shapes:
        shape = SHAPES[name]
        for backward in (False, True):
            ours, theirs = time_pair(shape, backward, args.repeats)
            label = "fwd+bwd" if backward else "forward"
            print(f"{name:<12} {list(shape)!s:<18} {label:<10} {ours:>7.2f}ms "
                  f"{theirs:>7.2f}ms {theirs / ours:>5.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
