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


def load(path: Any, *, dtype: Any = "float32", **options: Any) -> Any:
    """``model, tokenizer = glassgpt.load(path)``: a checkpoint folder or an exported HF folder,
    the model ready for fast inference in ``dtype`` (``"float32"``, ``"bf16"``, ``"int8"``:
    what ``glassgpt sample --dtype`` means, and decoded by the same engine).

    ``options``: ``tokenizer=`` (a file, when the folder has none), ``device=``. To train or
    fine-tune the model, load it in float32 (the default) and call ``model.train()``. See
    :func:`glassgpt.interop.loading.load`.

    >>> import glassgpt                                          # doctest: +SKIP
    >>> from glassgpt.sample import generate                     # doctest: +SKIP
    >>> model, tok = glassgpt.load("runs/default", dtype="int8")  # doctest: +SKIP
    >>> ids = generate(model, tok.encode("def "), max_new_tokens=50)  # doctest: +SKIP
    >>> print(tok.decode(ids))                                   # doctest: +SKIP
    """
    from glassgpt.interop.loading import load as load_model

    return load_model(path, dtype=dtype, **options)
