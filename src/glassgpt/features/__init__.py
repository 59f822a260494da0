"""glassgpt.features: sparse dictionaries (SAEs and transcoders) trained on a model's activations.

- :class:`SAE`, :class:`SAEConfig` (:mod:`glassgpt.features.sae`): the architectures
  topk, batchtopk, jumprelu, relu and transcoder; encode, decode, the training objective,
  save and load.
- :mod:`glassgpt.features.sites`: hook names (glassgpt's and TransformerLens's spelling),
  checked against a model; reading a site and splicing an SAE into it.
- :mod:`glassgpt.features.buffer`: activations streamed from a run's shards, shuffled.
- :mod:`glassgpt.features.training`: ``glassgpt sae train``.
- :mod:`glassgpt.features.metrics`: L0, FVU, CE loss recovered, dead and dense latents.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SAE", "SAEConfig"]


def __getattr__(name: str) -> Any:
    if name in __all__:  # on first use: the CLI imports this package's commands, not torch
        from glassgpt.features import sae

        return getattr(sae, name)
    raise AttributeError(f"module 'glassgpt.features' has no attribute {name!r}")
