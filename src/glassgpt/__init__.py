"""glassgpt: the decoder-only GPT, exactly as its mathematics, as real software.

text → BPE tokens → W_E (+ W_P) → n_layers residual blocks → W_U → softmax.

Subpackages follow the pipeline: ``tokenizer`` → ``model`` → ``data`` → ``train`` →
``sample`` → ``inspect`` → ``scaling``, plus ``interop`` for HF and tiktoken formats.
Importing ``glassgpt`` is cheap: heavy modules (torch) load only when used.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["GlassError", "__version__", "load"]

from glassgpt.errors import GlassError


def load(path: Any, **options: Any) -> Any:
    """``model, tokenizer = glassgpt.load(path)``: a checkpoint folder or an exported HF folder.

    ``options``: ``tokenizer=`` (a file, when the folder has none), ``device=``, ``dtype=``.
    """
    from glassgpt.sample.loading import load as _load

    return _load(path, **options)
