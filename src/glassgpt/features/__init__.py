"""glassgpt.features: sparse dictionaries (SAEs and transcoders) trained on a model's activations.

- :class:`SAE`, :class:`SAEConfig` (:mod:`glassgpt.features.sae`): the architectures
  topk, batchtopk, jumprelu, relu and transcoder, one class each; encode, decode, the training
  objective, save and load (their sparse operations: :mod:`glassgpt.features.sparse`).
- :mod:`glassgpt.features.sites`: hook names (glassgpt's and TransformerLens's spelling),
  checked against a model; reading a site and splicing an SAE into it.
- :mod:`glassgpt.features.buffer`: activations streamed from a run's shards, shuffled.
- :mod:`glassgpt.features.dictionary_files`: a dictionary's folder on disk (SAE and CLT).
- :mod:`glassgpt.features.training`, :mod:`glassgpt.features.job`: ``glassgpt sae train``.
- :mod:`glassgpt.features.metrics`: L0, FVU, CE loss recovered, dead and dense latents.
- :mod:`glassgpt.features.pages`: feature pages; :mod:`glassgpt.features.saelens`: SAELens's
  format; :mod:`glassgpt.features.folders`: an SAE folder opened with its model.
- :mod:`glassgpt.features.labels`: ``labels.json``, one label and detection score per feature,
  written by ``glassgpt sae label`` (:mod:`glassgpt.features.label_job`, with its prompts,
  contexts and HTTP client in ``label_prompts``, ``label_contexts``, ``label_client``).
"""

from __future__ import annotations

from glassgpt.features.sae import SAE, SAEConfig

__all__ = ["SAE", "SAEConfig"]
