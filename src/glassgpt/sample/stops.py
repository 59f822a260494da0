"""Stop strings: end generation exactly where a stop string begins.

The generated text is the bytes of the sampled tokens, b = bytes(t₁) ‖ bytes(t₂) ‖ ….
For stop strings s₁…s_m, the output is b[:i] where i is the first index at which some s_j
occurs in b, and sampling ends as soon as that s_j is complete. A streamed token is released
only when none of its bytes can still be the start of a stop string (they lie before the
longest suffix of b that is a proper prefix of some s_j), so a stream never emits text that
a later stop string would have cut. When s_j starts inside a token, that token's bytes
before s_j are re-encoded (as text, else byte tokens) so that decode(output) == b[:i].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from glassgpt.errors import GlassError


def unescape(text: str) -> str:
    r"""``text`` with its backslash escapes read (``\n``, ``\t``, ``\u00e9``): how a stop
    string or a prompt typed on a command line says a newline.

    >>> unescape(r"\n\nUser:"), unescape("naïve")
    ('\n\nUser:', 'naïve')
    """
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape")


def single_byte_ids(tokenizer: Any) -> dict[int, int]:
    """byte value → id of the token that is exactly that byte (byte-level BPE vocabularies)."""
    vocab = getattr(tokenizer, "vocab", None)
    if not isinstance(vocab, list):
        return {}
    return {t[0]: i for i, t in enumerate(vocab) if isinstance(t, bytes) and len(t) == 1}


def ids_for_bytes(tokenizer: Any, data: bytes) -> list[int]:
    """Token ids whose bytes are exactly ``data`` ([] if the vocabulary cannot spell them)."""
    if not data:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        try:
            ids = list(tokenizer.encode_ordinary(text))
        except (GlassError, KeyError, ValueError):
            ids = []
        if ids and tokenizer.decode_bytes(ids) == data:
            return ids
    table = single_byte_ids(tokenizer)
    if all(b in table for b in data):
        return [table[b] for b in data]
    return []


class StopMatcher:
    """Holds back tokens that may begin a stop string; finds the exact cut.

    >>> from glassgpt.tokenizer import CharTokenizer
    >>> tok = CharTokenizer(sorted(set("abc\\n")))
    >>> m = StopMatcher(tok, ["\\n\\n"])
    >>> [m.push(i) for i in tok.encode("ab\\nc")]
    [([1], False), ([2], False), ([], False), ([0, 3], False)]
    >>> m.push(tok.encode("\\n")[0]), m.push(tok.encode("\\n")[0])
    (([], False), ([], True))
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str]) -> None:
        if tokenizer is None:
            raise GlassError("stop strings need a tokenizer (to read the generated text)")
        self.tokenizer = tokenizer
        self.stops = [s.encode("utf-8") for s in stops]
        self.held: list[tuple[int, bytes]] = []  # (id, its bytes), not yet released
        self.done = False

    def push(self, token: int) -> tuple[list[int], bool]:
        """Add one sampled token; returns (ids now safe to emit, whether a stop string ended it)."""
        piece = self.tokenizer.decode_bytes([token])
        self.held.append((token, piece))
        buf = b"".join(p for _, p in self.held)
        found = [i for s in self.stops if (i := buf.find(s)) >= 0]
        if found:
            self.done = True
            return self._cut(min(found)), True
        # bytes that may still begin a stop string: the longest suffix that is a proper prefix
        keep = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        safe, out, end = len(buf) - keep, [], 0
        while self.held and end + len(self.held[0][1]) <= safe:
            t, p = self.held.pop(0)
            end += len(p)
            out.append(t)
        return out, False

    def flush(self) -> list[int]:
        """Release every held token (generation ended without a stop string)."""
        out = [t for t, _ in self.held]
        self.held.clear()
        return out

    def _cut(self, cut: int) -> list[int]:
        out, start = [], 0
        for t, p in self.held:
            if start + len(p) <= cut:
                out.append(t)
            else:
                out += ids_for_bytes(self.tokenizer, p[: cut - start])
                break
            start += len(p)
        self.held.clear()
        return out
