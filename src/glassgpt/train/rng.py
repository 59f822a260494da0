"""Every random stream a training step reads, captured and restored exactly (as JSON).

A resumed run is bit-identical to an uninterrupted one only if the state of every generator
the step consumes is restored: Python's ``random`` (Mersenne Twister), NumPy's legacy global
generator, torch's CPU generator (dropout) and each CUDA device's generator. Evaluation and
sampling use their own generators and so never advance these.

>>> import random
>>> state = capture()
>>> a = random.random()
>>> restore(json.loads(json.dumps(state)))
>>> random.random() == a
True
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import numpy as np
import torch


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _from_b64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def capture() -> dict[str, Any]:
    """The state of Python's, NumPy's global, torch's CPU and CUDA generators, JSON-able."""
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(mt), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore(state: dict[str, Any]) -> None:
    """Put back what :func:`capture` returned."""
    version, mt, gauss = state["python"]
    random.setstate((version, tuple(mt), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_from_b64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        states = [_from_b64(s) for s in state["cuda"]]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and CUDA) global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def to_json(obj: Any) -> Any:
    """``obj`` with NumPy scalars and arrays, and tuples, turned into JSON types."""
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    return obj


__all__ = ["capture", "json", "restore", "seed_everything", "to_json"]
