"""Special tokens: strings that map to one id each, never produced by merges.

    encode(text) = ordinary(text₀) ⧺ [id(s₁)] ⧺ ordinary(text₁) ⧺ [id(s₂)] ⧺ ...

where s₁, s₂, ... are the *allowed* special strings found in ``text``. The policy is
tiktoken's: ``allowed_special`` (a set, or ``"all"``) says which specials are read as their
id; ``disallowed_special`` (a set, or ``"all"`` meaning every special not allowed, the
default) says which ones make ``encode`` raise if the text contains them. Pass
``disallowed_special=()`` to encode special strings as ordinary text.

Unlike tiktoken, a name that is not a special token of this tokenizer is an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from functools import lru_cache
from typing import Any, Literal

from glassgpt.errors import GlassError

SpecialSet = Literal["all"] | Collection[str]
END_OF_TEXT = "<|endoftext|>"


def start_id(tokenizer: Any) -> int:
    """The id an empty prompt starts from: ``<|endoftext|>`` if the tokenizer has it, else 0."""
    specials = getattr(tokenizer, "special_tokens", None) or {}
    return int(specials.get(END_OF_TEXT, 0))


def stop_ids(tokenizer: Any) -> tuple[int, ...]:
    """The ids that end a generation: ``<|endoftext|>`` if the tokenizer has it, and a model
    family's end-of-turn ids (a :class:`~glassgpt.tokenizer.family.FamilyTokenizer`'s
    ``eos_ids``: Llama 3's ``<|eot_id|>``, Qwen's ``<|im_end|>``).

    >>> from glassgpt.tokenizer import Tokenizer
    >>> stop_ids(Tokenizer.bytes_only(special_tokens=["<|endoftext|>"])), stop_ids(None)
    ((256,), ())
    """
    specials = getattr(tokenizer, "special_tokens", None) or {}
    ids = [specials[END_OF_TEXT]] if END_OF_TEXT in specials else []
    return tuple(dict.fromkeys([*ids, *getattr(tokenizer, "eos_ids", ())]))


class SpecialTokenError(GlassError, ValueError):
    """The text holds a special token's string that the caller did not allow."""


@lru_cache(maxsize=64)
def special_regex(tokens: frozenset[str]) -> re.Pattern[str]:
    """A regex capturing any of ``tokens``, longest first where one is a prefix of another."""
    alternatives = "|".join(re.escape(t) for t in sorted(tokens, key=lambda t: (-len(t), t)))
    return re.compile(f"({alternatives})")


def resolve(
    specials: Collection[str], allowed: SpecialSet, disallowed: SpecialSet
) -> tuple[frozenset[str], frozenset[str]]:
    """``(allowed, disallowed)`` as sets of special strings, checked against ``specials``.

    >>> sp = {"<|a|>": 5, "<|b|>": 6}
    >>> resolve(sp, (), "all") == (frozenset(), frozenset(sp))
    True
    >>> resolve(sp, {"<|a|>"}, "all") == (frozenset({"<|a|>"}), frozenset({"<|b|>"}))
    True
    >>> resolve(sp, "all", ())[1]
    frozenset()
    """
    return _resolve(_frozen(specials), _frozen(allowed), _frozen(disallowed))


def _frozen(x: Any) -> Any:
    return x if isinstance(x, (str, frozenset)) else frozenset(x)


@lru_cache(maxsize=256)
def _resolve(
    specials: frozenset[str], allowed: SpecialSet, disallowed: SpecialSet
) -> tuple[frozenset[str], frozenset[str]]:
    allow = specials if allowed == "all" else frozenset(allowed)
    disallow = specials - allow if disallowed == "all" else frozenset(disallowed)
    unknown = (allow | disallow) - specials
    if unknown:
        names = ", ".join(sorted(map(repr, unknown)))
        known = ", ".join(sorted(map(repr, specials))) or "none"
        raise GlassError(
            f"not a special token of this tokenizer: {names} (special tokens: {known})"
        )
    return allow, disallow


def check_disallowed(text: str, disallowed: frozenset[str]) -> None:
    """Raise :class:`SpecialTokenError` if ``text`` contains a disallowed special string."""
    if not disallowed:
        return
    m = special_regex(disallowed).search(text)
    if m is not None:
        raise SpecialTokenError(
            f"text contains the special token {m.group()!r} at character {m.start()}, which is "
            "not allowed (allow it with allowed_special or --specials allow, or read it as "
            "text with disallowed_special=() or --specials text)"
        )


def split_special(text: str, allowed: frozenset[str]) -> list[str]:
    """``[text₀, s₁, text₁, s₂, ...]``: ordinary parts at even, allowed specials at odd indices.

    >>> split_special("a<|e|>b<|e|>", frozenset({"<|e|>"}))
    ['a', '<|e|>', 'b', '<|e|>', '']
    """
    return special_regex(allowed).split(text) if allowed else [text]


def encode_with_specials(
    text: str,
    allowed: frozenset[str],
    special_tokens: Mapping[str, int],
    encode_ordinary: Callable[[str], list[int]],
) -> list[int]:
    """The ids of ``text``: each allowed special's id, ``encode_ordinary`` of the text between.

    >>> encode_with_specials("ab<|e|>c", frozenset({"<|e|>"}), {"<|e|>": 9}, lambda t: [len(t)])
    [2, 9, 1]
    """
    parts = split_special(text, allowed)
    out = encode_ordinary(parts[0])
    for k in range(1, len(parts), 2):
        out.append(special_tokens[parts[k]])
        out += encode_ordinary(parts[k + 1])
    return out
