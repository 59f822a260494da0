"""train_merges: known answers, a recount-every-merge reference, and HF tokenizers' BpeTrainer."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from glassgpt.errors import GlassError
from glassgpt.tokenizer.bpe_train import hf_byte_order, train_merges

# --- an independent reference: recount every pair before every merge (minbpe's way) ---------


def _tie_key(token: bytes, created: dict[bytes, int]) -> int:
    """BpeTrainer's id of a token: bytes by GPT-2 stand-in code point, then creation order."""
    if len(token) == 1:
        return hf_byte_order().index(token[0])
    return 256 + created[token]


def reference_merges(chunk_counts: dict[bytes, int], n_merges: int) -> list[tuple[bytes, bytes]]:
    words = {chunk: [bytes([b]) for b in chunk] for chunk in chunk_counts}
    created: dict[bytes, int] = {}
    merges: list[tuple[bytes, bytes]] = []
    while len(merges) < n_merges:
        freq: Counter[tuple[bytes, bytes]] = Counter()
        for chunk, symbols in words.items():
            for pair in pairwise(symbols):
                freq[pair] += chunk_counts[chunk]
        freq = Counter({pair: c for pair, c in freq.items() if c > 0})
        if not freq:
            break
        best = max(freq.values())
        x, y = min(
            (pair for pair, c in freq.items() if c == best),
            key=lambda p: (_tie_key(p[0], created), _tie_key(p[1], created)),
        )
        created[x + y] = len(created)
        merges.append((x, y))
        for chunk, symbols in words.items():
            out, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == x and symbols[i + 1] == y:
                    out.append(x + y)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            words[chunk] = out
    return merges


# --- known answers ----------------------------------------------------------------------------


def test_wikipedia_example() -> None:
    # "aaabdaaabac": aa occurs 4 times (overlaps count) → Z = aa, text ZabdZabac.
    # Then Z·a and a·b both occur twice; the tie goes to the smaller ids, a < Z → Y = ab,
    # text ZYdZYac. Then Z·Y occurs twice, everything else once → X = ZY.
    assert train_merges({b"aaabdaaabac": 1}, 10)[:3] == [(b"a", b"a"), (b"a", b"b"), (b"aa", b"ab")]


def test_counts_weight_the_chunks() -> None:
    # "hug"×10 "pug"×5 "pun"×12 "bun"×4 "hugs"×5 (the HF course corpus, byte level):
    # u·g 20, u·n 16, h·u 15 → ug; then u·n 16 → un; then h·ug 15 → hug.
    chunks = {b"hug": 10, b"pug": 5, b"pun": 12, b"bun": 4, b"hugs": 5}
    assert train_merges(chunks, 3) == [(b"u", b"g"), (b"u", b"n"), (b"h", b"ug")]


def test_tie_rule_orders_bytes_by_gpt2_stand_in() -> None:
    # Both pairs occur once. In byte order 0x00 < "z", but BpeTrainer numbers printable
    # bytes first (0x00 stands for "Ā", U+0100), so z·z wins the tie.
    assert train_merges({b"\x00\x01": 1, b"zz": 1}, 1) == [(b"z", b"z")]
    assert train_merges({b"ba": 1, b"ab": 1}, 2) == [(b"a", b"b"), (b"b", b"a")]


def test_stops_when_no_pair_is_left() -> None:
    merges = train_merges({b"abc": 2, b"x": 100}, 50)
    assert [x + y for x, y in merges] == [b"ab", b"abc"]
    assert train_merges({}, 5) == []
    assert train_merges({b"abc": 1}, 0) == []


def test_zero_counts_are_ignored() -> None:
    assert train_merges({b"ab": 0, b"cd": 1}, 5) == [(b"c", b"d")]


@pytest.mark.parametrize(
    ("chunks", "n_merges", "message"),
    [
        ({b"ab": 1}, -1, "n_merges"),
        ({b"ab": 1}, 2.0, "n_merges"),
        ({"ab": 1}, 1, "bytes"),
        ({b"ab": -3}, 1, "count"),
    ],
)
def test_bad_input_raises_glass_error(chunks: dict, n_merges: int, message: str) -> None:
    with pytest.raises(GlassError, match=message):
        train_merges(chunks, n_merges)


def test_progress_bar_does_not_change_the_result(capsys: pytest.CaptureFixture[str]) -> None:
    chunks = {b"hello": 3, b" world": 2, b" hello": 4}
    assert train_merges(chunks, 8, progress=True) == train_merges(chunks, 8)
    assert "BPE merges" in capsys.readouterr().err


# --- against the reference, on arbitrary chunks -----------------------------------------------

chunk_st = st.binary(min_size=1, max_size=12) | st.text(alphabet="ab \n", min_size=1).map(
    str.encode
)


@given(st.dictionaries(chunk_st, st.integers(1, 6), max_size=12), st.integers(0, 40))
def test_agrees_with_recounting_reference(chunk_counts: dict[bytes, int], n_merges: int) -> None:
    assert train_merges(chunk_counts, n_merges) == reference_merges(chunk_counts, n_merges)


# --- against Hugging Face tokenizers' BpeTrainer ----------------------------------------------


def _hf_train(
    chunk_counts: dict[str, int], n_merges: int, *, split: bool
) -> list[tuple[bytes, bytes]]:
    """BpeTrainer on the given chunks (one word each unless ``split``), merges as bytes."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    from glassgpt.interop.hf_tokenizers import unicode_to_bytes

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split)
    trainer = trainers.BpeTrainer(
        vocab_size=256 + n_merges,
        min_frequency=0,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = [chunk for chunk, count in chunk_counts.items() for _ in range(count)]
    tok.train_from_iterator(texts, trainer=trainer)
    model = tok.get_vocab()  # str → id; merges come from the model's JSON
    assert len(model) <= 256 + n_merges
    import json

    merges = json.loads(tok.to_str())["model"]["merges"]
    pairs = [m.split(" ") if isinstance(m, str) else m for m in merges]
    return [(unicode_to_bytes(x), unicode_to_bytes(y)) for x, y in pairs]


text_chunk_st = st.text(alphabet=st.sampled_from("abc \n\x00é€🙂"), min_size=1, max_size=10)


@given(st.dictionaries(text_chunk_st, st.integers(1, 4), max_size=10), st.integers(1, 30))
def test_agrees_with_hf_bpe_trainer_on_arbitrary_chunks(
    chunks: dict[str, int], n_merges: int
) -> None:
    ours = train_merges({c.encode(): n for c, n in chunks.items()}, n_merges)
    assert ours == _hf_train(chunks, n_merges, split=False)


def _hf_chunk_counts(text: str) -> Counter[bytes]:
    """The chunks BpeTrainer itself sees: ByteLevel's GPT-2 split, mapped back to bytes."""
    from tokenizers import pre_tokenizers

    from glassgpt.interop.hf_tokenizers import unicode_to_bytes

    split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return Counter(unicode_to_bytes(piece) for piece, _ in split.pre_tokenize_str(text))


@pytest.mark.slow
def test_agrees_with_hf_bpe_trainer_on_tinyshakespeare(shakespeare_text: str) -> None:
    n_merges = 2048
    ours = train_merges(_hf_chunk_counts(shakespeare_text), n_merges)
    theirs = _hf_train({shakespeare_text: 1}, n_merges, split=True)
    assert len(ours) == n_merges
    assert ours == theirs
