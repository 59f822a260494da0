"""glassgpt.train: minimise the mean next-token cross-entropy by AdamW, on 1 to N processes.

- :mod:`~glassgpt.train.config`: ``RunConfig`` = seed + model + train + data, presets;
- :mod:`~glassgpt.train.optim`: AdamW groups and the warmup + cosine schedule;
- :mod:`~glassgpt.train.trainer`: the generic ``Trainer`` (any ``model(x, y) -> (logits, loss)``);
- :mod:`~glassgpt.train.distributed`: torchrun / DDP;
- :mod:`~glassgpt.train.run`: the job behind ``glassgpt train``, composing data, model and
  trainer (the command itself: :mod:`glassgpt.cli.train`).
"""

from __future__ import annotations

from glassgpt.train.config import DataConfig, RunConfig, TrainConfig, load_run_config
from glassgpt.train.trainer import Trainer

__all__ = ["DataConfig", "RunConfig", "TrainConfig", "Trainer", "load_run_config"]
