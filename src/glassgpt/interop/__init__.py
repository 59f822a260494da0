"""glassgpt.interop: the model and tokenizer in other formats (HF model folders of every
family glassgpt implements, HF and tiktoken tokenizer files), read and written.

- :func:`from_hf` / :func:`to_hf`: a GPT from or to an HF folder of GPT-2, Llama, Mistral,
  Qwen 2, Qwen 3, Gemma 2, Gemma 3 or GPT-NeoX (:mod:`.hf`; the config in
  :mod:`.hf_families` and :mod:`.hf_export`, the weights in :mod:`.hf_layouts`, GPT-2's in
  :mod:`.hf_gpt2`, the files in :mod:`.hf_files`);
- :func:`export_hf` / :func:`export_tiktoken`: what ``glassgpt export`` writes
  (:mod:`.export`);
- :func:`export_gguf`: one GGUF file that llama.cpp runs, as the llama.cpp architecture that
  computes the config (:mod:`.gguf_export`, :mod:`.gguf_arch`; the ``gguf`` extra).
"""

from __future__ import annotations

from glassgpt.interop.export import export_hf, export_tiktoken
from glassgpt.interop.gguf_export import export_gguf
from glassgpt.interop.hf import config_from_hf, from_hf, to_hf

__all__ = ["config_from_hf", "export_gguf", "export_hf", "export_tiktoken", "from_hf", "to_hf"]
