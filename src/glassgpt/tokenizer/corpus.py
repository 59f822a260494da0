"""A training corpus as BPE sees it: distinct pre-tokenized chunks with their counts.

    counts[c] = #{occurrences of chunk c in split(text) over all texts}

Special-token strings are cut out first, so no merge ever spans one. Inputs are ``str``
texts or paths (``pathlib.Path`` / ``os.PathLike``; a ``str`` is always text).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Collection, Iterable

from tqdm.auto import tqdm

from glassgpt.errors import GlassError
from glassgpt.tokenizer.files import read_text
from glassgpt.tokenizer.pretokenize import splitter
from glassgpt.tokenizer.special import split_special

TextOrPath = str | os.PathLike[str]


def fix_surrogates(text: str) -> str:
    """Lone surrogates (not encodable as UTF-8) become U+FFFD; surrogate pairs are joined.

    >>> fix_surrogates("a\\ud800b")
    'a�b'
    """
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def iter_texts(texts_or_paths: Iterable[TextOrPath] | TextOrPath) -> Iterable[tuple[str, str]]:
    """``(name, text)`` for each input; one str or path alone counts as a list of one."""
    if isinstance(texts_or_paths, (str, os.PathLike)):
        texts_or_paths = [texts_or_paths]
    for i, item in enumerate(texts_or_paths):
        if isinstance(item, str):
            yield f"text #{i}", item
        elif isinstance(item, os.PathLike):
            yield os.fspath(item), read_text(item)
        else:
            raise GlassError(f"input #{i} is a {type(item).__name__}, not a str text or a path")


def count_chunks(
    texts_or_paths: Iterable[TextOrPath] | TextOrPath,
    pattern: str | None,
    special_tokens: Collection[str] = (),
    *,
    progress: bool = False,
) -> Counter[bytes]:
    """Distinct chunks (UTF-8 bytes) of all inputs with their counts.

    >>> count_chunks(["the cat", "the hat"], "gpt2")
    Counter({b'the': 2, b' cat': 1, b' hat': 1})
    >>> count_chunks(["ab<|e|>ab"], None, ["<|e|>"])
    Counter({b'ab': 2})
    """
    split = splitter(pattern)
    specials = frozenset(special_tokens)
    counts: Counter[str] = Counter()
    items = iter_texts(texts_or_paths)
    if progress:
        items = tqdm(items, desc="pre-tokenizing", unit=" inputs")
    for _, text in items:
        for part in split_special(text, specials)[::2]:
            counts.update(split(part))
    out: Counter[bytes] = Counter()
    for chunk, n in counts.items():
        try:
            out[chunk.encode("utf-8")] += n
        except UnicodeEncodeError:
            out[fix_surrogates(chunk).encode("utf-8")] += n
    return out
