"""Hugging Face ``tokenizer.json`` (ByteLevel BPE) export and import.

A byte-level BPE vocabulary is written in GPT-2's printable alphabet: each byte b becomes
one character u(b),

    u(b) = chr(b)          for b in '!'..'~', 0xA1..0xAC, 0xAE..0xFF   (printable)
    u(b) = chr(256 + n)    for the n-th remaining byte (0x00..0x20, 0x7F..0xA0, 0xAD)

and a token t = b_1 … b_k becomes u(b_1) … u(b_k). The file holds the vocabulary
(string → id), the merges in rank order ("x y"), the pre-tokenizer (the regex split, then
ByteLevel's byte → character map), the ByteLevel decoder and the special tokens.

The pre-tokenizer we write: GPT-2's pattern is ByteLevel's own (``use_regex=true``); any
other pattern is a ``Split`` (behavior "Isolated") followed by ByteLevel without a regex;
no pattern is ByteLevel alone. ``add_prefix_space`` is false: text is not changed. HF's
``BPE`` model applies the merges lowest rank first, pair by pair, as we do, so the ids are
the same. On import, this family (BPE model, no normalizer, ByteLevel pre-tokenizer,
optionally after a Split by a pattern glassgpt names, no post-processor, every added token
special) becomes glassgpt's own :class:`~glassgpt.tokenizer.Tokenizer`; any other file the
``tokenizers`` library reads (Llama 3's and Qwen's regex Splits, ``ignore_merges``, NFC,
Gemma's and Llama 2's byte fallback, a post-processor that adds BOS) is a model family's
tokenizer, :class:`~glassgpt.tokenizer.family.FamilyTokenizer`, which runs the file itself.

A character tokenizer (:class:`~glassgpt.tokenizer.CharTokenizer`) is written as a BPE model
with no merges whose vocabulary is its characters, no pre-tokenizer and the ``Fuse`` decoder:
HF's BPE cuts a word into its characters and, with no merge to apply, gives each one's id;
``Fuse`` joins the pieces back without spaces. (A character outside the vocabulary, which
glassgpt refuses, HF drops.) Import reads that shape back as a ``CharTokenizer``.

The file is written as plain JSON, so exporting needs no ``tokenizers`` install.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from glassgpt.errors import GlassError
from glassgpt.tokenizer.bpe import Tokenizer
from glassgpt.tokenizer.char import CharTokenizer
from glassgpt.tokenizer.family import FamilyTokenizer
from glassgpt.tokenizer.files import read_json, str_to_token, token_to_str, write_json
from glassgpt.tokenizer.pretokenize import PATTERNS

__all__ = [
    "char_tokenizer_json",
    "load_tokenizer_json",
    "onig_pattern",
    "save_tokenizer_json",
    "to_tokenizer_json",
    "unicode_to_bytes",
]


def unicode_to_bytes(text: str) -> bytes:
    """A token in GPT-2's alphabet → its bytes; a character outside the alphabet is an error.

    >>> unicode_to_bytes("ĠhÃ©llo").decode()
    ' héllo'
    """
    try:
        return str_to_token(text)
    except KeyError as err:
        raise GlassError(
            f"token {text!r} has the character {err.args[0]!r}, outside the ByteLevel alphabet"
        ) from None


# ---- export ----------------------------------------------------------------------------------


def _byte_level(*, use_regex: bool) -> dict[str, Any]:
    return {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": use_regex,
    }


_QUANTIFIER = re.compile(r"\{\d+(,\d*)?\}\+")


def onig_pattern(pattern: str) -> str:
    r"""``pattern`` rewritten for HF's regex engine (Oniguruma, Ruby syntax).

    Ruby syntax reads ``X{1,3}+`` as ``(X{1,3})+``, not as a possessive ``X{1,3}``, so each
    possessive interval becomes an atomic group, which means the same. (``?+ *+ ++`` are
    possessive in Oniguruma too and stay as they are.)

    >>> onig_pattern(r"'s|\p{N}{1,3}+|[a-z]{2}+| ?(ab){1,}+|x{2}")
    "'s|(?>\\p{N}{1,3})|(?>[a-z]{2})| ?(?>(ab){1,})|x{2}"
    """
    out: list[str] = []
    groups: list[int] = []  # where in ``out`` each open group starts
    atom = 0  # where in ``out`` the last complete atom starts
    i = 0
    while i < len(pattern):
        quantifier = _QUANTIFIER.match(pattern, i)
        if quantifier and out:
            body = "".join(out[atom:])
            del out[atom:]
            out.append(f"(?>{body}{quantifier.group()[:-1]})")
            i = quantifier.end()
            continue
        start, c = len(out), pattern[i]
        if c == "\\":
            end = i + 2
            if pattern[i + 1 : i + 2] in ("p", "P", "x") and pattern[end : end + 1] == "{":
                end = pattern.index("}", end) + 1
        elif c == "[":
            end = i + 1
            end += pattern[end : end + 1] == "^"
            end += pattern[end : end + 1] == "]"
            while pattern[end] != "]":
                end += 2 if pattern[end] == "\\" else 1
            end += 1
        else:
            end = i + 1
        out.append(pattern[i:end])
        if c == "(":
            groups.append(start)
        elif c == ")" and groups:
            start = groups.pop()
        atom = start
        i = end
    return "".join(out)


def _pre_tokenizer(tok: Tokenizer) -> dict[str, Any]:
    if tok.pattern_name == "gpt2":
        return _byte_level(use_regex=True)
    if tok.pattern is None:
        return _byte_level(use_regex=False)
    regex = {"Regex": onig_pattern(tok.pattern)}
    split = {"type": "Split", "pattern": regex, "behavior": "Isolated", "invert": False}
    return {"type": "Sequence", "pretokenizers": [split, _byte_level(use_regex=False)]}


def _added_tokens(special_tokens: Mapping[str, int]) -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "content": s,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for s, i in sorted(special_tokens.items(), key=lambda item: item[1])
    ]


def _bpe_model(vocab: dict[str, int], merges: list[str]) -> dict[str, Any]:
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "vocab": vocab,
        "merges": merges,
    }


def char_tokenizer_json(tok: CharTokenizer) -> dict[str, Any]:
    """The ``tokenizer.json`` of a character tokenizer: BPE without merges, ``Fuse`` decoder.

    >>> doc = char_tokenizer_json(CharTokenizer(["a", "b"], special_tokens=["<|e|>"]))
    >>> doc["model"]["vocab"], doc["model"]["merges"], doc["decoder"], doc["added_tokens"][0]["id"]
    ({'a': 0, 'b': 1}, [], {'type': 'Fuse'}, 2)
    """
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(tok.special_tokens),
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": _bpe_model({c: i for i, c in enumerate(tok.chars)}, []),
    }


def to_tokenizer_json(tok: Tokenizer | CharTokenizer | FamilyTokenizer) -> dict[str, Any]:
    """The ``tokenizer.json`` document for ``tok`` (see the module docstring; a family's
    tokenizer: the file it runs)."""
    if isinstance(tok, FamilyTokenizer):
        return json.loads(tok.backend.to_str())
    if isinstance(tok, CharTokenizer):
        return char_tokenizer_json(tok)
    added = _added_tokens(tok.special_tokens)
    text = [token_to_str(t) for t in tok.vocab]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": _pre_tokenizer(tok),
        "post_processor": None,
        "decoder": _byte_level(use_regex=True),
        # "x y" is unambiguous: the ByteLevel alphabet has no space character.
        "model": _bpe_model(
            {s: i for i, s in enumerate(text)}, [f"{text[a]} {text[b]}" for a, b in tok.merges]
        ),
    }


def save_tokenizer_json(
    tok: Tokenizer | CharTokenizer | FamilyTokenizer, path: str | os.PathLike[str]
) -> None:
    """Write ``tok`` as an HF ``tokenizer.json`` (``tokenizers.Tokenizer.from_file`` reads it)."""
    write_json(path, to_tokenizer_json(tok))


# ---- import ----------------------------------------------------------------------------------


class Unsupported(GlassError):
    """A valid ``tokenizer.json`` that glassgpt's own Tokenizer does not express exactly."""


def _unsupported(what: str) -> GlassError:
    return Unsupported(f"only ByteLevel BPE tokenizers can be imported; this one has {what}")


def _byte_level_regex(step: Mapping[str, Any]) -> bool:
    """Whether a ByteLevel step splits with GPT-2's regex; other ByteLevel options are errors."""
    if step.get("add_prefix_space", False):
        raise _unsupported("ByteLevel add_prefix_space=true (it changes the text)")
    return bool(step.get("use_regex", True))


def _pattern(pre: Any) -> str | None:
    """The split pattern of a supported pre-tokenizer (see the module docstring)."""
    if not isinstance(pre, Mapping):
        raise _unsupported(f"pre_tokenizer {pre!r}")
    if pre.get("type") == "ByteLevel":
        return "gpt2" if _byte_level_regex(pre) else None
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if isinstance(steps, list) and len(steps) == 1:
        return _pattern(steps[0])
    if isinstance(steps, list) and len(steps) == 2:
        split, byte_level = steps
        regex = split.get("pattern", {}).get("Regex") if isinstance(split, Mapping) else None
        if (
            isinstance(regex, str)
            and split.get("type") == "Split"
            and split.get("behavior") == "Isolated"
            and not split.get("invert", False)
            and isinstance(byte_level, Mapping)
            and byte_level.get("type") == "ByteLevel"
            and not _byte_level_regex(byte_level)
        ):
            named = _named(regex)
            if named == regex:  # Oniguruma's syntax and semantics: the library runs it
                raise _unsupported(f"the Split pattern {regex[:60]!r}")
            return named
    raise _unsupported(f"pre_tokenizer {json.dumps(pre)[:120]}")


def _named(regex: str) -> str:
    """A pattern we wrote for Oniguruma, named back ("gpt4"), or ``regex`` itself."""
    for name, pattern in PATTERNS.items():
        if regex in (pattern, onig_pattern(pattern)):
            return name
    return regex


def _check_supported(data: Mapping[str, Any]) -> Mapping[str, Any]:
    model = data.get("model")
    if not isinstance(model, Mapping) or model.get("type", "BPE") != "BPE" or "vocab" not in model:
        kind = model.get("type") if isinstance(model, Mapping) else model
        raise _unsupported(f"model type {kind!r}")
    for field in ("continuing_subword_prefix", "end_of_word_suffix", "byte_fallback",
                  "ignore_merges", "dropout"):  # fmt: skip
        if model.get(field):
            raise _unsupported(f"{field}={model[field]!r}")
    if data.get("normalizer") is not None:
        raise _unsupported(f"normalizer {data['normalizer'].get('type')!r}")
    decoder = data.get("decoder")
    if decoder is not None and (
        not isinstance(decoder, Mapping) or decoder.get("type") != "ByteLevel"
    ):
        raise _unsupported(f"decoder {decoder!r:.80}")
    post = data.get("post_processor")
    if post is not None and (not isinstance(post, Mapping) or post.get("type") != "ByteLevel"):
        raise _unsupported(
            f"post_processor {post.get('type') if isinstance(post, Mapping) else post!r}"
        )
    plain = [t.get("content") for t in data.get("added_tokens") or [] if not t.get("special")]
    if plain:
        raise _unsupported(f"added tokens that are not special ({plain[0]!r})")
    return model


def _is_char(data: Mapping[str, Any]) -> bool:
    """Whether ``data`` has the shape :func:`char_tokenizer_json` writes."""
    model = data.get("model")
    return (
        isinstance(model, Mapping)
        and model.get("type") == "BPE"
        and not model.get("merges")
        and data.get("decoder") == {"type": "Fuse"}
        and data.get("pre_tokenizer") is None
        and data.get("normalizer") is None
    )


def _char_tokenizer(data: Mapping[str, Any]) -> CharTokenizer:
    specials = sorted((int(t["id"]), t["content"]) for t in data.get("added_tokens") or [])
    chars = {s: int(i) for s, i in data["model"]["vocab"].items()}
    if sorted(chars.values()) != list(range(len(chars))):
        raise GlassError(f"character ids must be 0..{len(chars) - 1}")
    if [i for i, _ in specials] != list(range(len(chars), len(chars) + len(specials))):
        raise GlassError(f"special token ids must follow the {len(chars)} characters")
    by_id = sorted(chars, key=chars.__getitem__)
    return CharTokenizer(by_id, special_tokens=[s for _, s in specials])


def load_tokenizer_json(
    path: str | os.PathLike[str],
    config: Mapping[str, Any] | None = None,
    eos_ids: Sequence[int] = (),
) -> Tokenizer | CharTokenizer | FamilyTokenizer:
    """A :class:`~glassgpt.tokenizer.Tokenizer` from an HF ByteLevel BPE ``tokenizer.json``
    (or a ``CharTokenizer`` from the shape :func:`char_tokenizer_json` writes); any other
    valid file a :class:`~glassgpt.tokenizer.family.FamilyTokenizer` (see the module
    docstring), with ``config`` (``tokenizer_config.json``) and ``eos_ids``.

    Ids are kept: ordinary tokens must have ids 0..n-1 and added (special) tokens ids ≥ n.
    """
    name = Path(path)
    data = read_json(name)
    if not isinstance(data, dict):
        raise GlassError(f"{name}: not a tokenizer.json (the top level is not an object)")
    try:
        if _is_char(data):
            return _char_tokenizer(data)
        model = _check_supported(data)
        pattern = _pattern(data.get("pre_tokenizer"))
        specials = {t["content"]: int(t["id"]) for t in data.get("added_tokens") or []}
        # GPT-2's file also lists its special token in the model's vocab: leave it out there.
        ordinary = {s: int(i) for s, i in model["vocab"].items() if s not in specials}
        vocab = _vocab_by_id(ordinary)
        merges = {}
        for rank, merge in enumerate(model.get("merges") or []):
            x, y = merge.split(" ") if isinstance(merge, str) else merge
            if x not in ordinary or y not in ordinary or x + y not in ordinary:
                raise GlassError(f"merge {rank} {x!r} + {y!r}: a token is not in the vocab")
            merges[(ordinary[x], ordinary[y])] = ordinary[x + y]
        return Tokenizer(vocab, merges, pattern=pattern, special_tokens=specials)
    except Unsupported:
        return FamilyTokenizer.from_file(name, config, eos_ids=eos_ids)
    except GlassError as err:
        raise GlassError(f"{name}: {err}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise GlassError(
            f"{name}: malformed tokenizer.json ({type(err).__name__}: {err})"
        ) from None


def _vocab_by_id(ordinary: Mapping[str, int]) -> list[bytes]:
    ids = sorted(ordinary.values())
    if ids != list(range(len(ids))):
        gap = next(i for i, j in enumerate(ids) if i != j)
        raise GlassError(f"ordinary token ids must be 0..{len(ids) - 1}; id {gap} is missing")
    vocab = [b""] * len(ids)
    for s, i in ordinary.items():
        vocab[i] = unicode_to_bytes(s)
    return vocab
