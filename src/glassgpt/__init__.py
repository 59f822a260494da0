"""glassgpt: the decoder-only GPT, exactly as its mathematics, as real software.

text → BPE tokens → W_E (+ W_P) → n_layers residual blocks → W_U → softmax.

Subpackages follow the pipeline: ``tokenizer`` → ``model`` → ``data`` → ``train`` →
``sample`` → ``inspect`` → ``scaling``, plus ``interop`` for HF and tiktoken formats.

This module is the facade at the top of the import graph: no module of the package imports
it (the version lives in :mod:`glassgpt.version`, errors in :mod:`glassgpt.errors`), so its
one arrow, to :mod:`glassgpt.interop.loading`, points down. Python runs this file before any
submodule, so that arrow is followed when :func:`load` is called rather than here: importing
``glassgpt.tokenizer`` or ``glassgpt --help`` does not load torch.
"""

from __future__ import annotations

from typing import Any

from glassgpt.errors import GlassError
from glassgpt.version import __version__

__all__ = ["GlassError", "__version__", "load"]


def load(path: Any, **options: Any) -> Any:
    """``model, tokenizer = glassgpt.load(path)``: a checkpoint folder or an exported HF folder.

    ``options``: ``tokenizer=`` (a file, when the folder has none), ``device=``, ``dtype=``.
    See :func:`glassgpt.interop.loading.load`.
    """
    from glassgpt.interop.loading import load as load_model

    return load_model(path, **options)
