"""A model family's own ``tokenizer.json`` (a :class:`~glassgpt.tokenizer.FamilyTokenizer`)
as GGUF's ``tokenizer.ggml.*`` keys, as llama.cpp's ``convert_hf_to_gguf.py`` writes them.

- **Byte-level BPE** (Llama 3, Qwen 2/3, SmolLM, GPT-NeoX): llama.cpp's ``gpt2`` model, each
  token as ``tokenizer.json`` spells it (ByteLevel's printable alphabet), the merges in rank
  order, and ``tokenizer.ggml.pre`` named by the pre-tokenizer's split:

      Llama 3's regex + ignore_merges → "llama-bpe"    Llama 3's regex → "dbrx"
      Qwen 2's regex → "qwen2"    GPT-2's (ByteLevel's own regex) → "gpt-2"
      single digits, then GPT-2's → "smollm"

- **SentencePiece-style BPE with byte fallback** (Llama 2, TinyLlama, Mistral, Gemma):
  llama.cpp's ``llama`` model, each piece with ``▁`` for a space; a score per token (−rank
  of the merge that makes it, 0 for a character), because llama.cpp merges the adjacent pair
  whose joined piece scores highest where HF merges the pair of lowest rank; token types
  NORMAL, UNKNOWN, CONTROL (special), USER_DEFINED (other added tokens) and BYTE
  (``<0xNN>``); ``add_space_prefix`` where the file prepends ``▁`` (Llama 2's normalizer or
  Metaspace's ``prepend_scheme``; not Gemma's).

Both: ``add_bos_token`` where the post-processor puts BOS before a prompt (``encode_prompt``),
bos, eos (``tokenizer_config.json``'s ``eos_token``, else the first id that ends a generation)
and unk ids. llama.cpp ignores a normalizer: Qwen's NFC is not applied there (text already in
NFC tokenizes alike). Anything else is refused in one line naming why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from glassgpt.errors import ConfigError, GlassError
from glassgpt.tokenizer.family import BYTE_TOKEN, FamilyTokenizer, flat_steps
from glassgpt.tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # gguf.TokenType


def _regex(step: Mapping[str, Any]) -> str | None:
    pattern = step.get("pattern")
    if isinstance(pattern, Mapping):
        pattern = pattern.get("Regex")
    # ``]++`` (possessive) splits as ``]+`` here: the class excludes what may follow it
    return pattern.replace("]++", "]+") if isinstance(pattern, str) else None


def byte_level_pre(spec: Mapping[str, Any]) -> str:
    """``tokenizer.ggml.pre`` of a byte-level file's pre-tokenizer, or a GlassError naming it.

    >>> byte_level_pre({"pre_tokenizer": {"type": "ByteLevel", "use_regex": True}})
    'gpt-2'
    """
    steps = flat_steps(spec.get("pre_tokenizer"))
    kinds = [s.get("type") for s in steps]
    byte_level = next((s for s in steps if s.get("type") == "ByteLevel"), {})
    ignore_merges = bool((spec.get("model") or {}).get("ignore_merges"))
    if kinds == ["ByteLevel"] and byte_level.get("use_regex", True):
        return "gpt-2"
    digits = kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits")
    if digits and byte_level.get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not byte_level.get("use_regex", True):
        pattern = _regex(steps[0])
        if pattern == LLAMA3_PATTERN:
            return "llama-bpe" if ignore_merges else "dbrx"
        known = {QWEN2_PATTERN: "qwen2", GPT4_PATTERN: "dbrx", GPT2_PATTERN: "gpt-2"}
        if pattern in known and not ignore_merges:
            return known[pattern]
        raise GlassError(
            f"--format gguf: the tokenizer's split {pattern!r:.70} has no llama.cpp "
            "pre-tokenizer that splits alike (known: GPT-2's, Llama 3's, Qwen 2's, SmolLM's)"
        )
    raise GlassError(
        f"--format gguf: the byte-level pre-tokenizer {' → '.join(map(str, kinds))} is not "
        "mapped to a llama.cpp pre-tokenizer"
    )


def _merges(model: Mapping[str, Any]) -> list[str]:
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]


def _prefix_bos(tok: FamilyTokenizer) -> int | None:
    """The BOS id the post-processor puts before a prompt, or None."""
    whole, own = tok.encode_prompt("a"), tok.encode("a")
    return whole[0] if len(whole) > len(own) and whole[-len(own) :] == own else None


def _check_sentencepiece(spec: Mapping[str, Any]) -> None:
    """Refuse a byte-fallback file whose spaces are not ``▁`` as SentencePiece has them."""
    steps = flat_steps(spec.get("normalizer")) + flat_steps(spec.get("pre_tokenizer"))
    spaces = any(
        (s.get("type") == "Replace" and _string(s) == " " and s.get("content") == "▁")
        or s.get("type") == "Metaspace"
        for s in steps
    )
    other = [
        s.get("type") for s in flat_steps(spec.get("pre_tokenizer")) if s.get("type") != "Metaspace"
    ]
    if not spaces or other:
        raise GlassError(
            "--format gguf: a byte-fallback tokenizer maps to llama.cpp's SentencePiece model "
            "only with spaces as '▁' and no other pre-tokenizer"
            + (f" (this one has {', '.join(map(str, other))})" if other else "")
        )


def _string(step: Mapping[str, Any]) -> Any:
    pattern = step.get("pattern")
    return pattern.get("String") if isinstance(pattern, Mapping) else None


def family_fields(tok: FamilyTokenizer, n_vocab: int) -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` keys (without the prefix) of a family's tokenizer for a model
    of ``n_vocab`` ids (see the module docstring)."""
    spec = tok.spec
    model = spec.get("model") or {}
    if model.get("type", "BPE") != "BPE":
        raise GlassError(
            f"--format gguf: a {model.get('type')} tokenizer model is not mapped to GGUF yet "
            "(llama.cpp's BPE and SentencePiece readers take BPE files)"
        )
    if tok.n_vocab > n_vocab:
        raise ConfigError("n_vocab", f"the model has {n_vocab} ids, its tokenizer {tok.n_vocab}")
    merges = _merges(model)
    if not merges:  # gguf writes no empty array
        raise GlassError("--format gguf: the tokenizer has no merges")
    decoder = {s.get("type") for s in flat_steps(spec.get("decoder"))}
    byte_level = "ByteLevel" in decoder
    if not byte_level:
        if not model.get("byte_fallback"):
            raise GlassError(
                "--format gguf: a BPE file neither byte-level nor with byte fallback is not "
                "mapped to GGUF yet (llama.cpp's readers need one or the other)"
            )
        _check_sentencepiece(spec)
    pre = byte_level_pre(spec) if byte_level else None
    added = {int(t["id"]): t for t in spec.get("added_tokens") or []}
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [UNUSED] * n_vocab
    for i in range(tok.n_vocab):
        piece = tok.backend.id_to_token(i)
        if piece is None:
            continue
        tokens[i], types[i] = piece, NORMAL
        if i in added:
            types[i] = CONTROL if added[i].get("special") else USER_DEFINED
        elif not byte_level and BYTE_TOKEN.fullmatch(piece):
            types[i] = BYTE
    unk = model.get("unk_token")
    vocab = tok.backend.get_vocab(with_added_tokens=True)
    out: dict[str, Any] = {"model": "gpt2" if byte_level else "llama"}
    if byte_level:
        out.update(pre=pre, tokens=tokens, token_type=types, merges=merges)
    else:
        if unk in vocab:
            types[vocab[unk]] = UNKNOWN
        made = {a + b: rank for rank, (a, b) in enumerate(m.split(" ", 1) for m in merges)}
        scores = [-float(made[t]) if t in made else (0.0 if len(t) == 1 else -1e9) for t in tokens]
        out.update(pre="default", tokens=tokens, scores=scores, token_type=types,
                   add_space_prefix=tok.prepends_space)  # fmt: skip
    bos = _prefix_bos(tok)
    if bos is None and tok.bos_token in vocab:
        bos = vocab[tok.bos_token]
    eos = vocab.get(tok.eos_token or "", tok.eos_ids[0] if tok.eos_ids else None)
    ids = {"bos_token_id": bos, "eos_token_id": eos, "unknown_token_id": vocab.get(unk or "")}
    out.update({k: int(v) for k, v in ids.items() if v is not None})
    out.update(add_bos_token=_prefix_bos(tok) is not None, add_eos_token=False)
    return out
