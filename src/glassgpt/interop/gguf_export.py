"""``export_gguf``: a model and its tokenizer as one GGUF file that llama.cpp runs.

The architecture, metadata and tensors are :mod:`.gguf_arch`'s. The tokenizer is written
as llama.cpp's ``gpt2`` model (byte-level BPE): each token in GPT-2's printable alphabet
(as in ``tokenizer.json``), the merges "a b" in rank order, special tokens typed CONTROL,
ids the model has past the tokenizer's typed UNUSED (``[PAD{i}]``), and
``tokenizer.ggml.pre``, the name under which llama.cpp splits text with the same pattern:

    gpt2 → "gpt-2"    gpt4 (cl100k) → "dbrx"    Llama 3's → "dbrx"    Qwen 2's → "qwen2"

("dbrx" is llama.cpp's split for DBRX's cl100k tokenizer, and Llama 3's regex without its
``ignore_merges``: the ids are the merges'; llama.cpp's form differs from cl100k only for
whitespace with a newline at the very end of a text). A tokenizer without a pattern, with
another one, or of characters (llama.cpp has no character-level model; its BPE needs the
byte-level alphabet) is refused in one line. ``<|endoftext|>`` is bos and eos; no bos is
added to a prompt, as glassgpt adds none. A model family's own ``tokenizer.json`` (a
``FamilyTokenizer``: Llama 3's, Qwen's, Llama 2's, Gemma's) is written as llama.cpp's
converter writes it (:mod:`.gguf_tokenizer`).

The weights are written as F32, F16, BF16 or Q8_0 (``file_type``); 1-D tensors, norms and
learned positions stay F32, and a matrix whose rows are not a multiple of Q8_0's block of
32 is F16, as llama.cpp's converter does. The file goes to a temporary name beside ``out``
and is renamed over it when whole.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from glassgpt.errors import ConfigError, GlassError
from glassgpt.interop.gguf_arch import arch_for, gguf_tensors, metadata
from glassgpt.interop.gguf_tokenizer import LLAMA3_PATTERN, QWEN2_PATTERN, family_fields
from glassgpt.model import GPT
from glassgpt.storage import fsync_dir, write_failed
from glassgpt.tokenizer.bpe import Tokenizer
from glassgpt.tokenizer.char import CharTokenizer
from glassgpt.tokenizer.family import FamilyTokenizer
from glassgpt.tokenizer.files import token_to_str
from glassgpt.tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN
from glassgpt.tokenizer.special import END_OF_TEXT

EXTRA = "gguf"  # pip install 'glassgpt[gguf]'
DTYPES = ("f32", "f16", "bf16", "q8_0")
PRE = {GPT2_PATTERN: "gpt-2", GPT4_PATTERN: "dbrx", LLAMA3_PATTERN: "dbrx", QWEN2_PATTERN: "qwen2"}


def require_gguf() -> Any:
    """The ``gguf`` package, or one line naming the extra that installs it."""
    try:
        return importlib.import_module("gguf")
    except ImportError:
        raise GlassError(
            f"--format gguf needs the gguf package: pip install 'glassgpt[{EXTRA}]'"
        ) from None


def pre_tokenizer(tok: Any) -> str:
    """``tokenizer.ggml.pre`` for ``tok``'s split pattern, or a GlassError saying why none.

    >>> pre_tokenizer(Tokenizer([bytes([b]) for b in range(256)], {}, pattern="gpt4"))
    'dbrx'
    """
    if isinstance(tok, CharTokenizer):
        raise GlassError(
            "--format gguf: a character tokenizer has no llama.cpp equivalent (llama.cpp reads "
            "byte-level BPE or SentencePiece vocabularies); train with --set data.tokenizer=bpe"
        )
    if not isinstance(tok, Tokenizer):
        raise GlassError(
            f"--format gguf writes glassgpt's byte-level BPE tokenizer; this model's is a "
            f"{type(tok).__name__}, which is not mapped to GGUF yet"
        )
    pre = PRE.get(tok.pattern or "")
    if pre is None:
        what = "no split pattern" if tok.pattern is None else f"the pattern {tok.pattern!r:.60}"
        raise GlassError(
            f"--format gguf: the tokenizer has {what}, which no llama.cpp pre-tokenizer "
            f"splits alike (known: gpt2, gpt4, Llama 3's and Qwen 2's)"
        )
    return pre


def tokenizer_fields(tok: Tokenizer, n_vocab: int) -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` keys (without the prefix) of ``tok`` for a model of ``n_vocab``
    (a family's own ``tokenizer.json``: :mod:`.gguf_tokenizer`)."""
    if isinstance(tok, FamilyTokenizer):
        return family_fields(tok, n_vocab)
    pre = pre_tokenizer(tok)  # first: refuses what is not a byte-level BPE
    if not tok.merges:  # gguf writes no empty array, and llama.cpp needs the key
        raise GlassError("--format gguf: the tokenizer has no merges; llama.cpp's BPE needs one")
    if tok.n_vocab > n_vocab:
        raise ConfigError("n_vocab", f"the model has {n_vocab} ids, its tokenizer {tok.n_vocab}")
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [5] * n_vocab  # gguf.TokenType: 1 NORMAL, 3 CONTROL, 5 UNUSED
    for i, t in enumerate(tok.vocab):
        tokens[i], types[i] = token_to_str(t), 1
    for s, i in tok.special_tokens.items():
        tokens[i], types[i] = s, 3
    text = [token_to_str(t) for t in tok.vocab]
    out: dict[str, Any] = {
        "model": "gpt2", "pre": pre, "tokens": tokens, "token_type": types,
        "merges": [f"{text[a]} {text[b]}" for a, b in tok.merges],
        "add_bos_token": False, "add_eos_token": False,
    }  # fmt: skip
    if END_OF_TEXT in tok.special_tokens:
        out["bos_token_id"] = out["eos_token_id"] = tok.special_tokens[END_OF_TEXT]
    return out


def _encode(gguf: Any, name: str, t: np.ndarray, dtype: str) -> tuple[np.ndarray, Any]:
    """(the data, its GGMLQuantizationType) of a float32 tensor in the file type ``dtype``."""
    Q = gguf.GGMLQuantizationType
    if (
        dtype == "f32"
        or t.ndim <= 1
        or name.endswith("_norm.weight")
        or name.startswith("position_embd")
    ):
        return t, Q.F32
    if dtype == "q8_0":
        with contextlib.suppress(gguf.QuantError):  # rows not in blocks of 32: F16
            return gguf.quants.quantize(t, Q.Q8_0), Q.Q8_0
    if dtype == "bf16":
        return gguf.quants.quantize(t, Q.BF16), Q.BF16
    return t.astype(np.float16), Q.F16


def _add(writer: Any, key: str, value: Any) -> None:
    """One key, its GGUF type from the value (bool, int → uint32, float → float32, str, list)."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, value)


def export_gguf(
    model: GPT,
    tok: Any,
    out: str | os.PathLike,
    *,
    dtype: str = "f32",
    chat_template: str | None = None,
) -> Path:
    """Write ``model`` and ``tok`` as the GGUF file ``out`` (weights in ``dtype``: f32, f16,
    bf16 or q8_0; ``chat_template``, the Jinja source, as ``tokenizer.chat_template``, which
    llama.cpp and Ollama render); a config or tokenizer llama.cpp cannot run is refused
    first, in one line."""
    if dtype not in DTYPES:
        raise ConfigError("dtype", f"expected one of {', '.join(DTYPES)}, got {dtype!r}")
    c = model.config
    arch = arch_for(c)  # what llama.cpp cannot run is refused before the package is asked for
    fields = tokenizer_fields(tok, c.n_vocab)
    gguf = require_gguf()
    path = Path(out)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    F = gguf.LlamaFileType
    ftype = {"f32": F.ALL_F32, "f16": F.MOSTLY_F16, "bf16": F.MOSTLY_BF16, "q8_0": F.MOSTLY_Q8_0}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = gguf.GGUFWriter(tmp, arch)
        writer.add_name("glassgpt")
        writer.add_file_type(int(ftype[dtype]))
        for key, value in metadata(c, arch).items():
            _add(writer, f"{arch}.{key}", value)
        for key, value in fields.items():
            _add(writer, f"tokenizer.ggml.{key}", value)
        if chat_template is not None:
            writer.add_string("tokenizer.chat_template", chat_template)
        for name, t in gguf_tensors(model, arch):
            data, qtype = _encode(gguf, name, t.contiguous().numpy(), dtype)
            writer.add_tensor(name, data, raw_dtype=qtype if data.dtype == np.uint8 else None)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise write_failed(path, e, 4 * sum(p.numel() for p in model.parameters())) from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    return path
