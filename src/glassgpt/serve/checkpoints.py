"""The served run's other checkpoints, for the explorer's checkpoint slider.

A run trained with ``train.keep_last=0`` keeps every ``ckpt/step_*``; the slider asks for the
analyses (patterns, logit lens, logits, head scores) of the model θ_s at step s, so that a head
can be seen before and after a change such as the forming of an induction head. Each θ_s is
opened by :func:`glassgpt.checkpoint.open_run` onto the served model's device, as stored, and
the last few are kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from glassgpt import checkpoint as ckpt
from glassgpt.errors import GlassError

KEEP = 4  # models kept in memory


class Checkpoints:
    """The ``step_*`` checkpoints beside the served one (none when it was not a run)."""

    def __init__(self, source: str | Path | None, device: Any = "cpu") -> None:
        self.root = ckpt.ckpt_root_of(source) if source is not None else None
        self.device = device
        self.models: OrderedDict[int, Any] = OrderedDict()
        self.lock = threading.Lock()

    def folders(self) -> dict[int, Path]:
        """{step: folder}, oldest first."""
        if self.root is None or not self.root.is_dir():
            return {}
        return dict(sorted((ckpt.step_of(p), p) for p in ckpt.step_folders(self.root)))

    def steps(self) -> list[int]:
        return list(self.folders())

    def model(self, step: int) -> Any:
        """The GPT of checkpoint ``step`` in eval mode; GlassError when there is none."""
        with self.lock:
            if step in self.models:
                self.models.move_to_end(step)
                return self.models[step]
        folders = self.folders()
        if self.root is None or step not in folders:
            known = ", ".join(map(str, folders)) or "none"
            raise GlassError(f"no checkpoint of step {step}; kept: {known}")
        model = ckpt.open_run(self.root, step=step, device=self.device).model
        with self.lock:
            self.models[step] = model
            while len(self.models) > KEEP:
                self.models.popitem(last=False)
        return model
