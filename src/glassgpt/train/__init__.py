"""glassgpt.train: minimise the mean next-token cross-entropy by AdamW, on 1 to N processes.

- :mod:`~glassgpt.train.config`: ``RunConfig`` = seed + model + train + data, presets;
- :mod:`~glassgpt.train.optim`: AdamW groups and the warmup + cosine schedule;
- :mod:`~glassgpt.train.trainer`: the generic ``Trainer`` (any ``model(x, y) -> (logits, loss)``);
- checkpoints: :mod:`glassgpt.checkpoint` (below both ``train`` and ``sample``, which reads them);
- :mod:`~glassgpt.train.distributed`: torchrun / DDP;
- :mod:`~glassgpt.train.run`: ``glassgpt train``, composing data, model and trainer.

Importing this package is cheap; torch loads with the submodules that need it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from glassgpt.train.config import DataConfig, RunConfig, TrainConfig, load_run_config

if TYPE_CHECKING:
    from glassgpt.train.trainer import Trainer

__all__ = ["DataConfig", "RunConfig", "TrainConfig", "Trainer", "load_run_config"]


def __getattr__(name: str) -> Any:
    if name == "Trainer":
        from glassgpt.train.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'glassgpt.train' has no attribute {name!r}")
