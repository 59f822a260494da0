"""The devices a command may compute on, and ``--device NAME`` read as one of them."""

from __future__ import annotations

import torch

from glassgpt.errors import GlassError


def available_devices() -> list[str]:
    """The devices this machine's torch can compute on: ``cpu``, then ``cuda`` and ``cuda:N``
    where a CUDA GPU is usable, and ``mps`` where Apple's Metal backend is."""
    out = ["cpu"]
    if torch.cuda.is_available():
        out += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    return out


def parse_device(name: str | torch.device) -> torch.device:
    """A usable torch.device from ``--device``; else a one-line error that lists the devices
    this machine has.

    >>> parse_device("cpu")
    device(type='cpu')
    """
    if isinstance(name, torch.device):
        return name
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    usable = available_devices()
    if device is None or (str(device) not in usable and device.type != "cpu"):
        raise GlassError(f"--device {name}: not usable here; this machine has {', '.join(usable)}")
    return device
