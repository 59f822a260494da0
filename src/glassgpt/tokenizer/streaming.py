"""Text as the ids of a generation arrive, equal to decoding them all at the end.

    piece_n = decode(c ‖ ids[:n]) − decode(c ‖ ids[:m])      (m: the ids already shown)

A family tokenizer's decoder is not a per-token map: Llama 2's and Mistral's strip the space
``▁`` gives the first word, byte-fallback tokens ``<0xNN>`` join into one character. So a
:class:`~glassgpt.tokenizer.family.FamilyTokenizer`'s stream decodes a short window of the ids
(as text-generation-inference and vLLM do): the new text is what the window's decode has
beyond the part already shown, held back while it ends in an incomplete UTF-8 sequence
(U+FFFD) or in a byte-fallback token (the decoder reads a run of them as one: a run that is
not UTF-8 turns each of its bytes into U+FFFD, the valid ones before too), so the pieces join
to ``decode(ids)`` (``AutoTokenizer.decode``). ``context`` (a
prompt's ids) makes the pieces continue the prompt's text: ``decode(prompt ‖ ids)`` minus
``decode(prompt)``, the leading space included, as transformers' text-generation pipeline
returns it; without it a reply reads as ``decode(reply)`` (a chat turn). glassgpt's own
tokenizers map each id to bytes, and their stream joins those bytes (a character split across
tokens waits for its last byte).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from glassgpt.tokenizer.family import FamilyTokenizer

CONTEXT = 6  # a prompt's last ids in the first window: enough for a character's bytes


class TextStream:
    """``TextStream(tokenizer, context=())``: ``push(id)`` → the new text (maybe ``""``);
    ``flush()`` → what is held back at the end (see the module docstring).

    >>> from glassgpt.tokenizer import CharTokenizer
    >>> s = TextStream(CharTokenizer(["a", "é"]))
    >>> [s.push(i) for i in (0, 1, 0)], s.flush()
    (['a', 'é', 'a'], '')
    """

    def __init__(self, tokenizer: Any, context: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.family = isinstance(tokenizer, FamilyTokenizer)
        self.codec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.ids: list[int] = [int(i) for i in context][-CONTEXT:] if self.family else []
        self.start = 0  # the window decoded: ids[start:]
        self.shown = len(self.ids)  # ids[:shown] are shown (or are the context)

    def push(self, token: int) -> str:
        """The text that ``token`` adds (``""`` while a character is incomplete)."""
        if not self.family:
            return self.codec.decode(self.tokenizer.decode_bytes([token]))
        self.ids.append(int(token))
        return self._advance(final=False)

    def flush(self) -> str:
        """The text still held back (an incomplete character, as U+FFFD)."""
        if not self.family:
            return self.codec.decode(b"", final=True)
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        if self.shown == len(self.ids):
            return ""
        decode = self.tokenizer.decode
        before = decode(self.ids[self.start : self.shown])
        now = decode(self.ids[self.start :])
        pending = now.endswith("\ufffd") or self.ids[-1] in self.tokenizer.fallback_bytes
        if len(now) <= len(before) or (pending and not final):
            return ""  # nothing new yet, or a character (or a run of bytes) not yet complete
        self.start, self.shown = self.shown, len(self.ids)
        return now[len(before) :]


def stream_text(tokenizer: Any, ids: Iterable[int], context: Sequence[int] = ()) -> Iterator[str]:
    """The non-empty pieces of ``ids`` as they arrive (a :class:`TextStream`), then the rest.

    >>> from glassgpt.tokenizer import CharTokenizer
    >>> list(stream_text(CharTokenizer(["a", "é"]), iter([0, 1])))
    ['a', 'é']
    """
    stream = TextStream(tokenizer, context)
    for t in ids:
        if piece := stream.push(t):
            yield piece
    if tail := stream.flush():
        yield tail
