"""A model family's own ``tokenizer.json``, read by the ``tokenizers`` library, behind the
interface of :class:`~glassgpt.tokenizer.Tokenizer`.

    text ─normalizer→ text' ─pre-tokenizer→ words ─model (BPE merges)→ ids ─post-processor→ ids'

Each stage is what the file says (Llama 3's and Qwen's regex Splits with ByteLevel, Gemma's
and Llama 2's ``▁`` with byte fallback, NFC, added and special tokens); ``tokenizers`` runs
it, so the ids are ``transformers.AutoTokenizer``'s. glassgpt's own
:class:`~glassgpt.tokenizer.Tokenizer` stays for the files it expresses exactly (GPT-2-style
ByteLevel, :func:`glassgpt.interop.hf_tokenizers.load_tokenizer_json` decides).

Two encodings, as ``AutoTokenizer`` has them:

- ``encode(text)``: the text's own ids, ``tok(text, add_special_tokens=False)``; special
  tokens' strings follow tiktoken's policy as in ``Tokenizer.encode`` (an error by default,
  their ids with ``allowed_special="all"``);
- ``encode_prompt(text)``: what the model was trained to see for a prompt,
  ``tok(text)``: special strings read as their ids, and the post-processor's specials added
  (``<|begin_of_text|>`` / ``<bos>`` / ``<s>`` first for Llama and Gemma; nothing for Qwen).

``decode(ids)`` is the file's decoder (which may drop the leading space ``▁`` gives the first
word); ``decode_bytes(ids)`` joins each token's own bytes (``▁`` → space, ``<0xNN>`` → the
byte NN, ByteLevel's alphabet → its bytes), what streaming and
:func:`~glassgpt.tokenizer.display.token_texts` need.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import tokenizers

from glassgpt.errors import GlassError
from glassgpt.storage import atomic_write
from glassgpt.tokenizer.corpus import fix_surrogates
from glassgpt.tokenizer.files import str_to_token
from glassgpt.tokenizer.special import (
    SpecialSet,
    check_disallowed,
    encode_with_specials,
    resolve,
)

BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def flat_steps(spec: Any) -> list[dict[str, Any]]:
    """A normalizer, pre-tokenizer, decoder or post-processor as a flat list of steps.

    >>> [s["type"] for s in flat_steps({"type": "Sequence", "decoders": [{"type": "Fuse"}]})]
    ['Fuse']
    """
    if not isinstance(spec, Mapping):
        return []
    if spec.get("type") == "Sequence":
        inner = next((v for k, v in spec.items() if isinstance(v, list)), [])
        return [s for step in inner for s in flat_steps(step)]
    return [dict(spec)]


def piece_bytes(piece: str, decoder: Sequence[Mapping[str, Any]]) -> bytes:
    """The bytes one vocabulary entry stands for, by the decoder's per-token steps.

    >>> piece_bytes("ĠhÃ©", [{"type": "ByteLevel"}])
    b' h\\xc3\\xa9'
    >>> fallback = [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    ...             {"type": "ByteFallback"}]
    >>> piece_bytes("▁the", fallback), piece_bytes("<0xE2>", fallback)
    (b' the', b'\\xe2')
    """
    kinds = {s.get("type") for s in decoder}
    if "ByteLevel" in kinds:
        try:
            return str_to_token(piece)
        except KeyError:  # outside the ByteLevel alphabet (an added token's text)
            return piece.encode("utf-8")
    if "ByteFallback" in kinds and (m := BYTE_TOKEN.fullmatch(piece)):
        return bytes([int(m.group(1), 16)])
    for s in decoder:
        if s.get("type") == "Replace" and isinstance(s.get("pattern"), Mapping):
            old = s["pattern"].get("String")
            if isinstance(old, str) and old:
                piece = piece.replace(old, s.get("content", ""))
        elif s.get("type") == "Metaspace":
            piece = piece.replace(s.get("replacement", "▁"), " ")
    return piece.encode("utf-8")


class FamilyTokenizer:
    """``FamilyTokenizer(backend, *, bos_token=None, eos_token=None, eos_ids=())``: a
    ``tokenizers.Tokenizer`` with glassgpt's tokenizer interface (see the module docstring).

    ``eos_ids``: the ids that end a generation (``generation_config.json``'s
    ``eos_token_id`` and ``tokenizer_config.json``'s ``eos_token``: Llama 3's
    ``<|eot_id|>``, Qwen's ``<|im_end|>``), for :func:`~glassgpt.tokenizer.special.stop_ids`.
    ``source``: where it was read from, for messages.
    """

    kind = "hf"

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        eos_ids: Iterable[int] = (),
        source: str = "tokenizer.json",
    ) -> None:
        self.backend = backend
        self.source = source
        self.spec: dict[str, Any] = json.loads(backend.to_str())
        vocab = backend.get_vocab(with_added_tokens=True)
        self.n_vocab: int = max(vocab.values(), default=-1) + 1
        added = self.spec.get("added_tokens") or []
        self.special_tokens: dict[str, int] = {
            t["content"]: int(t["id"]) for t in added if t.get("special")
        }
        self._added = {int(t["id"]): t["content"] for t in added}
        self._names = frozenset(self.special_tokens)
        # the same pipeline, with special strings read as text (encode_ordinary)
        self._plain = tokenizers.Tokenizer.from_str(backend.to_str())
        self._plain.encode_special_tokens = True
        self.bos_token, self.eos_token = bos_token, eos_token
        ids = [*eos_ids, *([vocab[eos_token]] if eos_token in vocab else [])]
        self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys(int(i) for i in ids))

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], config: Mapping[str, Any] | None = None, **kw: Any
    ) -> FamilyTokenizer:
        """Read ``tokenizer.json`` (``config``: ``tokenizer_config.json``'s fields, whose
        ``bos_token``/``eos_token`` it takes); a file ``tokenizers`` cannot read is one line."""
        try:
            backend = tokenizers.Tokenizer.from_file(os.fspath(path))
        except BaseException as err:  # Rust's errors, and its panics (a BaseException)
            if isinstance(err, (KeyboardInterrupt, SystemExit)):
                raise
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise GlassError(
                f"{path}: not a tokenizer.json the tokenizers library reads ({first})"
            ) from None
        config = config or {}
        return cls(
            backend,
            bos_token=token_text(config.get("bos_token")),
            eos_token=token_text(config.get("eos_token")),
            source=str(Path(path)),
            **kw,
        )

    def __repr__(self) -> str:
        model = self.spec.get("model") or {}
        return (
            f"FamilyTokenizer(n_vocab={self.n_vocab}, model={model.get('type')!r}, "
            f"special_tokens={len(self.special_tokens)})"
        )

    # ---- encoding -------------------------------------------------------------------------

    def encode_ordinary(self, text: str) -> list[int]:
        """The ids of ``text``, special tokens' strings read as ordinary text."""
        return _ids(self._plain, text, add_special_tokens=False)

    def encode(
        self,
        text: str,
        *,
        allowed_special: SpecialSet = frozenset(),
        disallowed_special: SpecialSet = "all",
    ) -> list[int]:
        """``AutoTokenizer``'s ``encode(text, add_special_tokens=False)``, with tiktoken's
        policy for special strings (an error by default; see ``Tokenizer.encode``)."""
        allowed, disallowed = resolve(self._names, allowed_special, disallowed_special)
        if disallowed:
            check_disallowed(text, disallowed)
        if allowed == self._names:  # the library reads them all, as AutoTokenizer does
            return _ids(self.backend, text, add_special_tokens=False)
        if not allowed:
            return self.encode_ordinary(text)
        return encode_with_specials(text, allowed, self.special_tokens, self.encode_ordinary)

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt's ids as the model was trained on them: ``AutoTokenizer``'s default
        ``encode(text)`` (special strings as their ids, the post-processor's BOS added)."""
        return _ids(self.backend, text, add_special_tokens=True)

    def encode_batch(
        self, texts: Sequence[str], *, num_workers: int | None = None, **kw: Any
    ) -> list[list[int]]:
        """``[encode(t) for t in texts]`` (the library runs a batch on all cores)."""
        allowed, disallowed = resolve(
            self._names, kw.get("allowed_special", frozenset()), kw.get("disallowed_special", "all")
        )
        if not allowed and not disallowed:
            texts = [fix_surrogates(t) for t in texts]
            return [e.ids for e in self._plain.encode_batch(texts, add_special_tokens=False)]
        return [self.encode(t, **kw) for t in texts]

    # ---- decoding -------------------------------------------------------------------------

    def _check(self, ids: Iterable[int]) -> list[int]:
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        ids = list(ids)
        table = self._bytes
        bad = next((i for i in ids if not (isinstance(i, int) and 0 <= i < self.n_vocab)), None)
        if bad is None:
            bad = next((i for i in ids if table[i] is None), None)
        if bad is not None:
            raise GlassError(
                f"token id {bad!r} is not in this tokenizer (ids are 0..{self.n_vocab - 1})"
            )
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """The file's decoder on ``ids`` (``AutoTokenizer.decode``; specials kept)."""
        return self.backend.decode(self._check(ids), skip_special_tokens=False)

    @cached_property
    def _bytes(self) -> list[bytes | None]:
        """Each id's bytes (None for an id no token has), built on first use."""
        decoder = flat_steps(self.spec.get("decoder"))
        table: list[bytes | None] = [None] * self.n_vocab
        for piece, i in self.backend.get_vocab(with_added_tokens=False).items():
            table[i] = piece_bytes(piece, decoder)
        for i, content in self._added.items():
            table[i] = content.encode("utf-8")
        return table

    @cached_property
    def prepends_space(self) -> bool:
        """Whether the file puts ``▁`` before every text it encodes (Llama 2's ``Prepend``
        normalizer, or Metaspace's ``prepend_scheme``), so that a text's ids depend on where
        it starts."""
        for s in flat_steps(self.spec.get("normalizer")):
            if s.get("type") == "Prepend" and s.get("prepend") == "▁":
                return True
        for s in flat_steps(self.spec.get("pre_tokenizer")):
            if s.get("type") == "Metaspace":
                scheme = s.get("prepend_scheme", "always")
                return scheme != "never" and s.get("add_prefix_space", True)
        return False

    @cached_property
    def fallback_bytes(self) -> frozenset[int]:
        """The ids of byte-fallback tokens ``<0xNN>`` where the decoder joins them
        (``ByteFallback``: a run of them is decoded as one, each byte U+FFFD if the run is not
        UTF-8)."""
        if "ByteFallback" not in {s.get("type") for s in flat_steps(self.spec.get("decoder"))}:
            return frozenset()
        vocab = self.backend.get_vocab(with_added_tokens=False)
        return frozenset(i for piece, i in vocab.items() if BYTE_TOKEN.fullmatch(piece))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Each token's own bytes, joined (see the module docstring)."""
        table = self._bytes
        return b"".join(table[i] for i in self._check(ids))  # type: ignore[misc]

    def token_bytes(self, i: int) -> bytes:
        """The bytes of one token."""
        return self.decode_bytes([i])

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the ``tokenizer.json`` it runs (HF's format: :func:`glassgpt.checkpoint.open_run`
        and ``AutoTokenizer`` read it back)."""
        atomic_write(Path(path), self.backend.to_str().encode("utf-8"))

    # ---- the map Text → V*, for a reader -----------------------------------------------------

    def pipeline(self) -> list[tuple[str, str]]:
        """``(stage, what it does)`` for each stage of the file, in order (what ``tokenizer
        stats`` and ``describe -c`` print)."""
        spec = self.spec
        model = spec.get("model") or {}
        added = [t for t in spec.get("added_tokens") or [] if t.get("special")]
        prompt = self.encode_prompt("")
        shown = ", ".join(self._added.get(i, str(i)) for i in prompt) or "nothing"
        rows = [
            ("normalizer", describe_steps(spec.get("normalizer"))),
            ("pre-tokenizer", describe_steps(spec.get("pre_tokenizer"))),
            ("model", describe_model(model)),
            ("special tokens", f"{len(added)}: " + _some(t["content"] for t in added)),
            ("added to prompts", shown),
            ("decoder", describe_steps(spec.get("decoder"), options=False)),
            ("end of generation", _some(self._added.get(i, str(i)) for i in self.eos_ids)),
        ]
        return rows


def _ids(backend: tokenizers.Tokenizer, text: str, *, add_special_tokens: bool) -> list[int]:
    """``backend``'s ids of ``text``; lone surrogates (which the library refuses) become
    U+FFFD first, as glassgpt's own tokenizer and tiktoken have them."""
    try:
        return backend.encode(text, add_special_tokens=add_special_tokens).ids
    except TypeError:
        return backend.encode(fix_surrogates(text), add_special_tokens=add_special_tokens).ids


def _some(names: Iterable[str], k: int = 8) -> str:
    names = list(names)
    more = f" … (+{len(names) - k})" if len(names) > k else ""
    return (", ".join(names[:k]) + more) or "none"


def describe_steps(spec: Any, options: bool = True) -> str:
    """One line for a normalizer, pre-tokenizer or decoder: its steps, with their patterns
    (and ByteLevel's options, unless ``options`` is False: a decoder's do not change bytes).

    >>> describe_steps({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
    ...     {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]})
    "Prepend('▁') → Replace(' ' → '▁')"
    >>> describe_steps(None)
    'none'
    """
    out = []
    for s in flat_steps(spec):
        kind = s.get("type")
        pattern = s.get("pattern")
        if isinstance(pattern, Mapping):
            pattern = pattern.get("Regex", pattern.get("String"))
        if kind == "Split":
            out.append(f"Split(/{pattern}/, {s.get('behavior')})")
        elif kind == "Replace":
            out.append(f"Replace({pattern!r} → {s.get('content')!r})")
        elif kind == "Prepend":
            out.append(f"Prepend({s.get('prepend')!r})")
        elif kind == "ByteLevel":
            opts = [k for k in ("add_prefix_space", "use_regex") if s.get(k) and options]
            out.append("ByteLevel" + (f"({', '.join(opts)})" if opts else ""))
        elif kind == "Metaspace":
            out.append(f"Metaspace({s.get('replacement')!r}, {s.get('prepend_scheme')})")
        else:
            out.append(str(kind))
    return " → ".join(out) or "none"


def describe_model(model: Mapping[str, Any]) -> str:
    """One line for the model: its kind, vocabulary, merges and options.

    >>> describe_model({"type": "BPE", "vocab": {"a": 0}, "merges": [], "byte_fallback": True})
    'BPE: 1 tokens, 0 merges, byte_fallback'
    """
    kind = model.get("type", "BPE")
    parts = [f"{kind}: {len(model.get('vocab') or {})} tokens"]
    if kind == "BPE":
        parts.append(f"{len(model.get('merges') or [])} merges")
    parts += [k for k in ("byte_fallback", "ignore_merges", "fuse_unk") if model.get(k)]
    if model.get("unk_token"):
        parts.append(f"unk={model['unk_token']!r}")
    return ", ".join(parts)


def read_config(folder: Path, name: str = "tokenizer_config.json") -> dict[str, Any]:
    """A JSON object of ``folder`` (``tokenizer_config.json``) as a dict ({} where there is none)."""
    path = folder / name
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GlassError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise GlassError(f"{path}: the top level is not an object")
    return data


def generation_eos_ids(folder: Path) -> list[int]:
    """``generation_config.json``'s ``eos_token_id`` (an int or a list), or [].

    >>> generation_eos_ids(Path("/nonexistent"))
    []
    """
    eos = read_config(folder, "generation_config.json").get("eos_token_id")
    eos = [eos] if isinstance(eos, int) else eos if isinstance(eos, list) else []
    return [int(i) for i in eos if isinstance(i, int)]


# What a tokenizer's folder holds beside ``tokenizer.json`` that a model's runs keep with it:
# the special tokens' strings and the chat template, the ids that end a generation.
SIDECARS = ("tokenizer_config.json", "generation_config.json", "chat_template.jinja")


def read_sidecars(folder: str | os.PathLike[str]) -> dict[str, bytes]:
    """The :data:`SIDECARS` of ``folder`` that exist, by name, as their bytes (a checkpoint
    stores them beside its ``tokenizer.json``; ``export --format hf`` writes them back).

    >>> read_sidecars("/nonexistent")
    {}
    """
    folder = Path(folder)
    return {n: (folder / n).read_bytes() for n in SIDECARS if (folder / n).is_file()}


def write_sidecars(folder: str | os.PathLike[str], files: Mapping[str, bytes]) -> list[Path]:
    """Write the :data:`SIDECARS` among ``files`` into ``folder`` (atomically, each); the
    paths written."""
    written = []
    for name in SIDECARS:
        if name in files:
            atomic_write(Path(folder) / name, files[name])
            written.append(Path(folder) / name)
    return written


def read_family(path: str | os.PathLike[str]) -> FamilyTokenizer:
    """The :class:`FamilyTokenizer` of an HF folder (or of its ``tokenizer.json``), with the
    ``tokenizer_config.json`` and ``generation_config.json`` beside it."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    file = folder / "tokenizer.json" if path.is_dir() else path
    return FamilyTokenizer.from_file(file, read_config(folder), eos_ids=generation_eos_ids(folder))


def token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or ``{"content": …}``.

    >>> token_text("<s>"), token_text({"content": "</s>", "lstrip": False}), token_text(None)
    ('<s>', '</s>', None)
    """
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None
