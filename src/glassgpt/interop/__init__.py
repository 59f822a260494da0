"""glassgpt.interop: the model and tokenizer in other formats (HF GPT-2 weights, HF and
tiktoken tokenizer files), read and written.

- :func:`from_hf` / :func:`to_hf`: a GPT from or to an HF GPT-2 folder (:mod:`.hf_gpt2`);
- :func:`export_hf` / :func:`export_tiktoken`: what ``glassgpt export`` writes
  (:mod:`.export`).
"""

from __future__ import annotations

from glassgpt.interop.export import export_hf, export_tiktoken
from glassgpt.interop.hf_gpt2 import from_hf, to_hf

__all__ = ["export_hf", "export_tiktoken", "from_hf", "to_hf"]
