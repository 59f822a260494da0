"""glassgpt: the decoder-only GPT, exactly as its mathematics, as real software.

text → BPE tokens → W_E (+ W_P) → n_layers residual blocks → W_U → softmax.

Subpackages follow the pipeline (README's table): ``tokenizer`` → ``model`` → ``interop`` →
``checkpoint`` → ``data`` → ``train`` → ``sample`` → ``inspect`` → ``features`` → ``scaling`` →
``serve``, and the commands on top in ``glassgpt.cli``.
"""

from __future__ import annotations

from typing import Any

from glassgpt.errors import GlassError
from glassgpt.version import __version__

__all__ = ["GlassError", "__version__", "load"]


def load(path: Any, *, dtype: Any = "float32", **options: Any) -> Any:
    """``model, tokenizer = glassgpt.load(path)``: a checkpoint folder or an exported HF folder,
    the model ready for fast inference in ``dtype`` (``"float32"``, ``"bf16"``, ``"int8"``, ``"int4"``:
    what ``glassgpt sample --dtype`` means, and decoded by the same engine).

    ``options``: ``tokenizer=`` (a file, when the folder has none), ``device=``. To train or
    fine-tune the model, load it in float32 (the default) and call ``model.train()``. See
    :func:`glassgpt.checkpoint.open_run`.

    >>> import glassgpt                                          # doctest: +SKIP
    >>> from glassgpt.sample import generate                     # doctest: +SKIP
    >>> model, tok = glassgpt.load("runs/default", dtype="int8")  # doctest: +SKIP
    >>> ids = generate(model, tok.encode("def "), max_new_tokens=50)  # doctest: +SKIP
    >>> print(tok.decode(ids))                                   # doctest: +SKIP
    """
    # Python runs this file before any submodule's: imported at the top, the checkpoint
    # stage would load torch for `glassgpt --help` and for `import glassgpt.tokenizer`.
    from glassgpt.checkpoint import load as load_model

    return load_model(path, dtype=dtype, **options)
